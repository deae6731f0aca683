import Foundation
import TributaryStore

#if canImport(Glibc)
import Glibc
#endif

/// What wakes an idle agent from outside the process: a `flush` datagram on the group's `agent.sock`
/// (the app entering the background), and a change to the shared store (a producer's commit, the
/// app's settings, the store file deleted or created anew), seen through inotify.
///
/// One thread sleeps in `poll` on the socket, the inotify descriptor and a pipe that ``stop()``
/// writes to, with no timeout: an agent with nothing to do is not woken by it. A flush request is passed
/// on at once. A store change is passed on at once too, then the thread stops reading inotify for
/// `coalesce` (the poll interval): the changes of that window are passed on as one at its end. A
/// producer committing a thousand times a second wakes the loop at most once a `coalesce`, and the
/// drain takes what came meanwhile in one chunk (one outbox commit, one store delete), as the poll did
/// before; an event stored after an idle spell is drained at once.
///
/// LMDB writes its pages with `pwrite` (the store is mapped read-only, no `MDB_WRITEMAP`), so every
/// commit to the store file is an `IN_MODIFY`, whoever made it; the agent's own deletes are too (the
/// loop then finds nothing new and sleeps again). When inotify is not available (`max_user_instances`
/// reached), ``watchesStore`` is false and the loop polls the store every poll interval, as it did.
final class WakeSources: Sendable {
    private let path: String
    /// The pipe's write end: a byte written there ends the thread.
    private let stopFD: Int32
    /// Whether store changes are seen; false: the loop must poll.
    let watchesStore: Bool

    init(
        groupDirectory: String, coalesce: Duration, onFlush: @escaping @Sendable () -> Void,
        onStoreChange: @escaping @Sendable () -> Void
    ) throws {
        path = groupDirectory + "/" + AgentChannel.socketFile
        let socketFD = try Self.bindSocket(path)
        var stopPipe: [Int32] = [-1, -1]
        guard pipe(&stopPipe) == 0 else {
            let reason = String(cString: strerror(errno))
            close(socketFD)
            unlink(path)
            throw AgentError(.startup, "Cannot create the flush listener's stop pipe: \(reason).")
        }
        for fd in stopPipe { _ = fcntl(fd, F_SETFD, FD_CLOEXEC) }
        stopFD = stopPipe[1]
        let inotifyFD = Self.watchStore(groupDirectory: groupDirectory)
        watchesStore = inotifyFD >= 0
        let stopReadFD = stopPipe[0]
        let coalesceMillis = Int32(clamping: max(1, Int64(coalesce.seconds * 1000)))
        Thread.detachNewThread {
            Self.listen(
                socketFD: socketFD, inotifyFD: inotifyFD, stopFD: stopReadFD, coalesceMillis: coalesceMillis,
                onFlush: onFlush, onStoreChange: onStoreChange)
            close(socketFD)
            if inotifyFD >= 0 { close(inotifyFD) }
            close(stopReadFD)
        }
    }

    /// Stops listening and removes the socket file.
    func stop() {
        var byte: UInt8 = 1
        _ = write(stopFD, &byte, 1)
        close(stopFD)
        unlink(path)
    }

    /// The thread's loop: returns once ``stop()`` has written to the pipe.
    private static func listen(
        socketFD: Int32, inotifyFD: Int32, stopFD: Int32, coalesceMillis: Int32,
        onFlush: @Sendable () -> Void, onStoreChange: @Sendable () -> Void
    ) {
        var buffer = [UInt8](repeating: 0, count: 4096)
        // When the last store change was passed on (boot-clock ms): until `coalesce` after it, inotify
        // is not read, and what it holds then is passed on as one change.
        var quietUntil: Int64 = 0
        while true {
            let now = Int64(BootClock.nowNanos() / 1_000_000)
            let quiet = inotifyFD >= 0 && now < quietUntil
            var fds = [
                pollfd(fd: stopFD, events: Int16(POLLIN), revents: 0),
                pollfd(fd: socketFD, events: Int16(POLLIN), revents: 0),
                pollfd(fd: inotifyFD, events: Int16(POLLIN), revents: 0),
            ]
            let count = nfds_t(inotifyFD >= 0 && !quiet ? 3 : 2)
            let ready = poll(&fds, count, quiet ? Int32(quietUntil - now) : -1)
            if ready < 0 && errno != EINTR { return }
            if fds[0].revents != 0 { return }
            if fds[1].revents & Int16(POLLIN) != 0 {
                let n = recv(socketFD, &buffer, buffer.count, Int32(MSG_DONTWAIT))
                if n > 0 && String(decoding: buffer[0..<n], as: UTF8.self).hasPrefix("flush") { onFlush() }
            }
            // The quiet window is over, or inotify has news while none is kept: pass on what it holds.
            let windowOver = quiet && ready == 0
            if inotifyFD >= 0 && (windowOver || fds[2].revents & Int16(POLLIN) != 0) {
                var changed = false
                while read(inotifyFD, &buffer, buffer.count) > 0 { changed = true }
                if changed {
                    onStoreChange()
                    quietUntil = Int64(BootClock.nowNanos() / 1_000_000) + Int64(coalesceMillis)
                }
            }
        }
    }

    /// An inotify descriptor (non-blocking) watching the store file for writes, and the store's two
    /// files for being deleted, moved or replaced (a link count change is `IN_ATTRIB`: the agent keeps
    /// them open); -1 when inotify is not available. Not the group directory: the agent's own status
    /// file is rewritten there, and each rewrite would wake it.
    private static func watchStore(groupDirectory: String) -> Int32 {
        let fd = inotify_init1(Int32(IN_NONBLOCK | IN_CLOEXEC))
        guard fd >= 0 else { return -1 }
        let store = groupDirectory + "/" + SharedStore.fileName
        let gone = UInt32(IN_ATTRIB | IN_DELETE_SELF | IN_MOVE_SELF)
        guard inotify_add_watch(fd, store, UInt32(IN_MODIFY) | gone) >= 0,
            // LMDB names the lock file of an MDB_NOSUBDIR environment after the data file, "-lock" appended.
            inotify_add_watch(fd, store + "-lock", gone) >= 0
        else {
            close(fd)
            return -1
        }
        return fd
    }

    /// Binds the group's `agent.sock`, a datagram socket.
    private static func bindSocket(_ path: String) throws -> Int32 {
        let fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw AgentError(.startup, "Cannot create the flush socket: \(String(cString: strerror(errno))).") }
        // A stale socket of a dead agent goes (we hold the group lock); anything else there is not ours
        // to remove, and bind would say only "Address already in use".
        var existing = stat()
        if lstat(path, &existing) == 0, existing.st_mode & S_IFMT != S_IFSOCK {
            close(fd)
            throw AgentError(
                .configuration,
                "\(path) is not a socket (a directory or a file is there): the agent's flush socket goes there. "
                    + "Move it away; the agent makes the socket itself.")
        }
        unlink(path)
        guard var address = AgentChannel.unixAddress(path) else {
            close(fd)
            throw AgentError(
                .configuration,
                "The group directory path is too long for the agent's Unix socket (\(path) is over "
                    + "\(MemoryLayout.size(ofValue: sockaddr_un().sun_path) - 1) bytes): use a shorter group directory.")
        }
        let rc = withUnsafePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        guard rc == 0 else {
            let message = String(cString: strerror(errno))
            close(fd)
            throw AgentError(.startup, "Cannot bind the flush socket \(path): \(message).")
        }
        chmod(path, 0o660)
        return fd
    }
}
