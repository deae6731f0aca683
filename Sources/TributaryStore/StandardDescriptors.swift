#if canImport(Glibc)
import Glibc
#endif

/// Keeps file descriptors 0, 1 and 2 taken, so that no file this process opens gets one of them.
///
/// A process started with stdin, stdout or stderr closed (`cmd <&- >&-`, a careless supervisor) gives
/// the next file it opens the lowest free descriptor: the store's data file as descriptor 1, and
/// every line printed to stdout, or logged, is written into the store (SQLite guards its own files so;
/// LMDB does not). Each one found closed is opened on `/dev/null`.
package enum StandardDescriptors {
    /// Opens `/dev/null` on each of descriptors 0, 1 and 2 that is closed (read-only for 0, write-only
    /// for 1 and 2). Cheap: three `fcntl`s when all are open.
    package static func takeClosed() {
        for descriptor: Int32 in 0...2 where fcntl(descriptor, F_GETFD) == -1 && errno == EBADF {
            let opened = open("/dev/null", (descriptor == 0 ? O_RDONLY : O_WRONLY) | O_CLOEXEC)
            guard opened >= 0 else { continue }
            // The lowest free descriptor, this one, unless another thread took it meanwhile: then that
            // thread's file holds it (dup2 would point that file at /dev/null), and this one goes.
            if opened != descriptor {
                close(opened)
            } else {
                _ = fcntl(descriptor, F_SETFD, 0)  // a child's standard descriptor, as usual
            }
        }
    }
}
