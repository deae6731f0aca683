#ifndef CTRIBUTARY_BRIDGE_H
#define CTRIBUTARY_BRIDGE_H

// The few system calls the hybrid bridge's browser host needs that Swift's Glibc module does not
// declare.

#include <spawn.h>

#ifdef __cplusplus
extern "C" {
#endif

/// pipe2(2): a pipe whose ends get `flags` (O_CLOEXEC) atomically. glibc declares it only under
/// _GNU_SOURCE, which the Glibc module is not built with.
int tributary_pipe2(int fds[2], int flags);

/// posix_spawn_file_actions_addclosefrom_np(3): the child closes every fd from `from` up. glibc
/// declares it only under _GNU_SOURCE.
int tributary_spawn_addclosefrom(posix_spawn_file_actions_t *actions, int from);

#ifdef __cplusplus
}
#endif

#endif
