// posix_spawn_file_actions_addclosefrom_np is a GNU extension (glibc 2.34): <spawn.h> declares it with
// _GNU_SOURCE only.
#define _GNU_SOURCE
#include <spawn.h>

#include "CTributaryBridge.h"

int tributary_spawn_addclosefrom(posix_spawn_file_actions_t *actions, int from) {
    return posix_spawn_file_actions_addclosefrom_np(actions, from);
}
