import Foundation
import TributaryStore

#if canImport(Glibc)
import Glibc
#endif

/// An agent's exclusive claim on a file (`flock`): on its group directory (`agent.lock`) and on its
/// outbox (`<outbox>.lock`).
///
/// A second agent on the same group is refused with the first one's pid, and so is an agent whose
/// outbox another agent (of another group) uses: two drains sharing one outbox would each take the
/// other's `last_drained_seq` for its own and delete events unsent. The lock is released by
/// ``release()`` on a clean stop and by the kernel when the process dies, so a `kill -9` never leaves
/// either locked. The file holds the holder's pid and group directory.
final class AgentLock: Sendable {
    private let fd: Int32
    let path: String

    /// Claims `groupDirectory`: one agent per group.
    static func group(_ groupDirectory: String) throws -> AgentLock {
        try AgentLock(path: groupDirectory + "/" + AgentChannel.lockFile, groupDirectory: groupDirectory) { holder in
            AgentError(
                .alreadyRunning,
                "Another tributary-agent (pid \(holder.pid)) is already draining \(groupDirectory). Only one agent "
                    + "may drain a group; stop it first.")
        }
    }

    /// Claims the outbox at `outboxPath` for the agent of `groupDirectory`: one agent per outbox.
    ///
    /// The lock is named after the outbox's real path: another agent given the same outbox through a
    /// symbolic link (to the file or to a directory on the way) claims the same lock. An outbox with hard
    /// links (more than one name) is refused (``AgentError/Code/configuration``). An outbox (or its
    /// directory) this user may not write is refused as such (``StoreError/Code/permissionDenied``).
    static func outbox(_ outboxPath: String, groupDirectory: String) throws -> AgentLock {
        try? Outbox.createDirectory(of: outboxPath)  // the lock lives beside the outbox
        let real = realPath(outboxPath)
        let directory = parentDirectory(of: real)
        for (subject, path) in [("the outbox's directory \(directory)", directory), ("the outbox \(real)", real)]
        where access(path, F_OK) == 0 && faccessat(AT_FDCWD, path, R_OK | W_OK, AT_EACCESS) != 0 && errno == EACCES {
            throw StoreError.permissionDenied(subject, directory: path)
        }
        // A lock named after a path cannot see a hard link: two agents could drain into one outbox by two
        // names. And SQLite keeps its -wal and -shm beside the name it was given, so one database opened by
        // two names has two WALs: "multiple links to the same file" is one of sqlite.org's ways to corrupt
        // a database (howtocorrupt.html, 2.5). An outbox has one name.
        var info = stat()
        if stat(real, &info) == 0, info.st_mode & S_IFMT == S_IFREG, info.st_nlink > 1 {
            throw AgentError(
                .configuration,
                "The outbox \(outboxPath) has \(info.st_nlink) names (hard links): SQLite keeps a WAL beside each name, "
                    + "and another agent could use it by another name. Remove the other links (find / -samefile "
                    + "\(real)), keeping one; nothing was changed.")
        }
        return try AgentLock(path: real + ".lock", groupDirectory: groupDirectory) { holder in
            AgentError(
                .configuration,
                "The outbox \(outboxPath) is in use by another tributary-agent (pid \(holder.pid), draining "
                    + "\(holder.group)). Each group needs an outbox of its own: give this one another --outbox "
                    + "(or none: the default is per group).")
        }
    }

    /// `path` with every symbolic link resolved, a link to a file not there yet (an outbox to be created)
    /// followed to where it points; for a file not there, its directory resolved; else `path` as given.
    static func realPath(_ path: String) -> String {
        var current = path
        for _ in 0..<40 {  // SYMLOOP_MAX on Linux
            if let file = resolvedPath(current) { return file }
            var target = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
            let length = readlink(current, &target, target.count - 1)
            guard length > 0 else { break }
            let link = String(decoding: target[..<length].map { UInt8(bitPattern: $0) }, as: UTF8.self)
            current = link.hasPrefix("/") ? link : parentDirectory(of: current) + "/" + link
        }
        let name = (current as NSString).lastPathComponent
        return resolvedPath(parentDirectory(of: current)).map { $0 == "/" ? "/" + name : $0 + "/" + name } ?? current
    }

    private init(
        path: String, groupDirectory: String, refusal: (_ holder: (pid: String, group: String)) -> AgentError
    ) throws {
        self.path = path
        fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0o660)
        guard fd >= 0 else {
            let err = errno
            if err == EACCES {
                // The lock file's own mode refuses it, or (not there yet) its directory's.
                let decides = access(path, F_OK) == 0 ? path : parentDirectory(of: path)
                throw StoreError.permissionDenied("the lock file \(path)", directory: decides)
            }
            throw AgentError(.startup, "Cannot open \(path): \(String(cString: strerror(err))).")
        }
        guard flock(fd, LOCK_EX | LOCK_NB) == 0 else {
            let lines = ((try? String(contentsOfFile: path, encoding: .utf8)) ?? "").split(separator: "\n")
            close(fd)
            throw refusal((pid: lines.first.map(String.init) ?? "unknown", group: lines.dropFirst().first.map(String.init) ?? "unknown"))
        }
        let holder = "\(getpid())\n\(groupDirectory)\n"
        _ = ftruncate(fd, 0)
        _ = holder.withCString { pwrite(fd, $0, strlen($0), 0) }
    }

    /// Releases the lock.
    func release() {
        _ = ftruncate(fd, 0)
        flock(fd, LOCK_UN)
        close(fd)
    }
}
