#if canImport(Glibc)
import Glibc
#endif

/// The app group directory: where the shared store lives.
enum GroupDirectory {
    /// Creates the directory (owner and group only, set-group-ID: mode 2770) if needed (`create`, and
    /// `creatingDirectory`: without it a missing directory is refused as such) and checks it is safe to use.
    ///
    /// A directory writable by other users is refused: anyone could then replace the store files or
    /// plant a lock file that blocks every producer. Returns the directory's `stat`.
    static func prepare(_ path: String, create: Bool, creatingDirectory: Bool = true) throws(StoreError) -> stat {
        var st = stat()
        if let found = try examine(path) {
            st = found
        } else {
            guard create else { throw unavailable(path, ENOENT) }
            guard creatingDirectory else {
                throw StoreError(
                    .directoryUnavailable,
                    "The group directory \(path) does not exist; nothing was created. Check the path (a mistyped one "
                        + "would make a group nobody drains), or create the group (`tributary track --create`).",
                    lmdbCode: ENOENT)
            }
            try makeDirectories(path)
            guard stat(path, &st) == 0 else {
                throw StoreError(.directoryUnavailable, "The group directory \(path) vanished after it was created.")
            }
        }
        if st.st_mode & S_IWOTH != 0 {
            let mode = String(st.st_mode & 0o7777, radix: 8)
            throw StoreError(
                .insecureDirectory,
                "The group directory \(path) is writable by every user (mode \(mode)). Refusing to open a store "
                    + "there; run `chmod o-w \(path)` (Tributary creates it with mode 2770).")
        }
        // LMDB opens both files for reading and writing, whatever the caller does with them, and creates
        // the missing ones: writing to the directory is needed only then. Checked for the effective user,
        // the one the open runs as.
        let data = path + "/" + SharedStore.fileName
        let creates = access(data, F_OK) != 0 || access(data + "-lock", F_OK) != 0
        if faccessat(AT_FDCWD, path, R_OK | X_OK | (creates ? W_OK : 0), AT_EACCESS) != 0, errno == EACCES {
            throw StoreError.permissionDenied("the group directory \(path)", directory: path)
        }
        return st
    }

    /// Gives a directory of an earlier release (mode 0770) the set-group-ID bit a new one has (see
    /// makeDirectories), when this user owns it. Called once a store is open there: an open that is
    /// refused, or that finds no store to read, changes nothing. `st`: the directory's `stat` from
    /// ``prepare(_:create:)``.
    static func addSetGroupID(_ path: String, _ st: stat) {
        guard st.st_mode & S_ISGID == 0, st.st_uid == geteuid() else { return }
        chmod(path, mode_t(st.st_mode & 0o7777) | S_ISGID)
    }

    /// Throws unless the store file of the group at `path` exists; opens nothing.
    static func checkStoreExists(_ path: String) throws(StoreError) {
        guard try examine(path) != nil else { throw unavailable(path, ENOENT) }
        let file = path + "/" + SharedStore.fileName
        guard access(file, F_OK) != 0 else { return }
        let err = errno
        if err == EACCES { throw StoreError.permissionDenied("the store \(file)", directory: path) }
        throw StoreError(
            .directoryUnavailable,
            "There is no Tributary store in \(path) (no \(SharedStore.fileName)); a producer creates it on first use.",
            lmdbCode: err)
    }

    /// Throws unless `path` is a directory this user may list and enter; opens and creates nothing.
    static func checkReadable(_ path: String) throws(StoreError) {
        guard try examine(path) != nil else { throw unavailable(path, ENOENT) }
        if faccessat(AT_FDCWD, path, R_OK | X_OK, AT_EACCESS) != 0, errno == EACCES {
            throw StoreError.permissionDenied("the group directory \(path)", directory: path)
        }
    }

    /// The group directory's `stat`, or nil when there is nothing at `path`.
    ///
    /// - Throws: ``StoreError/Code/notADirectory`` when `path`, or a folder on the way to it, is something
    ///   else; ``StoreError/Code/permissionDenied`` when this user may not look (`EACCES`);
    ///   ``StoreError/Code/directoryUnavailable`` for any other failure.
    private static func examine(_ path: String) throws(StoreError) -> stat? {
        var st = stat()
        guard stat(path, &st) == 0 else {
            switch errno {
            case ENOENT: return nil
            case ENOTDIR: throw notADirectory(path)
            case EACCES: throw StoreError.permissionDenied("the group directory \(path)", directory: path)
            case let err: throw unavailable(path, err)
            }
        }
        guard st.st_mode & S_IFMT == S_IFDIR else { throw notADirectory(path) }
        return st
    }

    private static func unavailable(_ path: String, _ err: Int32) -> StoreError {
        StoreError(
            .directoryUnavailable, "The group directory \(path) cannot be used: \(String(cString: strerror(err))).",
            lmdbCode: err)
    }

    private static func notADirectory(_ path: String) -> StoreError {
        StoreError(
            .notADirectory,
            "The group path \(path) is not a directory (or a folder on the way to it is not one); give the app group "
                + "directory, which a producer creates.", lmdbCode: ENOTDIR)
    }

    /// Syncs the directory at `path` (`fsync` of a descriptor of it), so that the names created in it
    /// survive a power loss. A file system that syncs no directories (`EINVAL`: some FUSE and network
    /// mounts; `EROFS`) is no failure; an I/O error is (``StoreError/Code/lmdb`` with its `errno`, 74).
    static func sync(_ path: String) throws(StoreError) {
        let fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else { return }  // not openable so (search-only): nothing to sync through
        defer { close(fd) }
        guard fsync(fd) != 0 else { return }
        let err = errno
        guard ![EINVAL, EROFS, ENOTSUP].contains(err) else { return }
        throw StoreError(
            .lmdb, "The directory \(path) could not be synced: \(String(cString: strerror(err))).", lmdbCode: err)
    }

    private static func makeDirectories(_ path: String) throws(StoreError) {
        var prefix = path.hasPrefix("/") ? "" : "."
        var created: [String] = []
        defer {
            // Each new directory's name lives in its parent: synced (best effort: the store's own files are
            // synced when created, and an error here leaves nothing half written).
            for directory in created { try? sync(parentDirectory(of: directory)) }
        }
        for component in path.split(separator: "/") {
            prefix += "/" + component
            if mkdir(prefix, 0o770) == 0 {
                created.append(prefix)
            } else if errno != EEXIST {
                let err = errno
                if err == EACCES {
                    throw StoreError.permissionDenied(
                        "creating the group directory \(prefix)", directory: parentDirectory(of: prefix))
                }
                if err == ENOTDIR { throw notADirectory(path) }
                throw StoreError(
                    .directoryUnavailable,
                    "Could not create the group directory \(prefix): \(String(cString: strerror(err))).", lmdbCode: err)
            }
        }
        // mkdir applies the umask; the group directory itself gets exactly owner+group rwx, and the
        // set-group-ID bit: every file created in it (the store's by a producer, agent.sock and the
        // status by the agent, which runs as another user) gets the directory's group, not the primary
        // group of whoever created it, so the other users of the app group can use it.
        chmod(path, 0o2770)
    }
}

extension StoreError {
    /// The refusal of `subject` (a phrase naming the file or directory) to this user (`EACCES`), saying
    /// who owns `directory`, the directory that decides (or the file itself, when its own mode refuses),
    /// and what to do.
    package static func permissionDenied(_ subject: String, directory: String) -> StoreError {
        var st = stat()
        let owner: String
        // What to do: the owner itself is refused by the mode it gave; anyone else needs the group.
        var advice = "Join the group that owns it, or run as its owner."
        if stat(directory, &st) == 0 {
            owner = "\(directory) belongs to user \(userName(st.st_uid)) and group \(groupName(st.st_gid)), mode "
                + String(st.st_mode & 0o7777, radix: 8)
            if st.st_uid == geteuid() {
                advice = "Its mode refuses its own owner: give the owner read and write (and search, for a directory)."
            }
        } else {
            owner = "a directory on the way to \(directory) cannot be searched by it"
        }
        return StoreError(
            .permissionDenied,
            "permission denied: \(subject) cannot be used by this user (\(userName(geteuid()))): \(owner). \(advice)",
            lmdbCode: EACCES)
    }

    private static func userName(_ uid: uid_t) -> String {
        var entry = passwd()
        var found: UnsafeMutablePointer<passwd>?
        var buffer = [CChar](repeating: 0, count: 4096)
        guard getpwuid_r(uid, &entry, &buffer, buffer.count, &found) == 0, found != nil, let name = entry.pw_name else {
            return "uid \(uid)"
        }
        return String(cString: name)
    }

    private static func groupName(_ gid: gid_t) -> String {
        var entry = group()
        var found: UnsafeMutablePointer<group>?
        var buffer = [CChar](repeating: 0, count: 4096)
        guard getgrgid_r(gid, &entry, &buffer, buffer.count, &found) == 0, found != nil, let name = entry.gr_name else {
            return "gid \(gid)"
        }
        return String(cString: name)
    }
}

/// Writes all of `bytes` to `fd`, again after `EINTR`; returns nil, or the `errno` of the write that
/// failed (`EPIPE` for one that wrote nothing).
package func writeAll(_ fd: Int32, _ bytes: [UInt8]) -> Int32? {
    var offset = 0
    while offset < bytes.count {
        let n = bytes[offset...].withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        if n < 0 && errno == EINTR { continue }
        if n <= 0 { return n < 0 ? errno : EPIPE }
        offset += n
    }
    return nil
}

/// `path` with every symbolic link, `.` and `..` resolved (`realpath(3)`); nil when it cannot be (a
/// part of it missing, or not this user's to search).
package func resolvedPath(_ path: String) -> String? {
    guard let pointer = realpath(path, nil) else { return nil }
    defer { free(pointer) }
    return String(cString: pointer)
}

/// The directory `path` is in: `/` for a file at the root, `.` for a relative name without a slash.
package func parentDirectory(of path: String) -> String {
    guard let slash = path.lastIndex(of: "/") else { return "." }
    return slash == path.startIndex ? "/" : String(path[..<slash])
}
