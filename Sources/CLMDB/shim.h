#ifndef TRIBUTARY_CLMDB_SHIM_H
#define TRIBUTARY_CLMDB_SHIM_H
// Debian's liblmdb-dev (LMDB 0.9.x). lmdb.h caveats this project depends on:
//  - "A thread may use parallel read-only transactions ... with MDB_NOTLS" (we open with MDB_NOTLS);
//  - "Use an MDB_env* in the process which opened it, without fork()ing";
//  - "Do not have open an LMDB database twice in the same process at the same time";
//  - stale reader slots of dead processes are cleared with mdb_reader_check().
#include <lmdb.h>
// statfs (not in Swift's Glibc module): a store on tmpfs, where LMDB's fsyncs promise nothing, is told
// by its file system's magic number.
#include <sys/vfs.h>
// FUTEX_WAKE on a word of LMDB's lock file (LockWordWatch): syscall(2) is variadic, which Swift cannot call.
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

/// Wakes every thread, of any process, waiting on the process-shared futex `word`; the number woken, or
/// -1 with errno (EFAULT for an address not mapped).
static inline long tributary_futex_wake_all(const void *word) {
    return syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}
/// pipe2(fds, O_CLOEXEC) (a GNU extension that <unistd.h> declares only with _GNU_SOURCE): the pipe a
/// store walk's child writes its verdicts into (StoreCheck), never inherited by another child.
static inline int tributary_pipe_cloexec(int fds[2]) {
    return (int)syscall(SYS_pipe2, fds, O_CLOEXEC);
}
#endif
