// pipe2(2) is a GNU extension (also in POSIX.1-2024): <unistd.h> declares it with _GNU_SOURCE only.
#define _GNU_SOURCE
#include <fcntl.h>
#include <unistd.h>

#include "CTributaryBridge.h"

int tributary_pipe2(int fds[2], int flags) { return pipe2(fds, flags); }
