#if canImport(Glibc)
import Glibc
#endif

/// The app group directory: where the shared store lives.
enum GroupDirectory {
    /// Creates the directory (owner and group only, set-group-ID: mode 2770) if needed and checks it is
    /// safe to use.
    ///
    /// A directory writable by other users is refused: anyone could then replace the store files or
    /// plant a lock file that blocks every producer.
    static func prepare(_ path: String, create: Bool) throws(StoreError) {
        var st = stat()
        if stat(path, &st) != 0 {
            let err = errno
            guard err == ENOENT, create else {
                throw StoreError(
                    .directoryUnavailable,
                    "The group directory \(path) cannot be used: \(String(cString: strerror(err))).", lmdbCode: err)
            }
            try makeDirectories(path)
            guard stat(path, &st) == 0 else {
                throw StoreError(.directoryUnavailable, "The group directory \(path) vanished after it was created.")
            }
        }
        guard st.st_mode & S_IFMT == S_IFDIR else {
            throw StoreError(.insecureDirectory, "The group path \(path) exists but is not a directory.")
        }
        // A directory of an earlier release (mode 0770) gets the set-group-ID bit from its owner, as a new
        // one has it (see makeDirectories).
        if st.st_mode & S_ISGID == 0, st.st_uid == geteuid() {
            chmod(path, mode_t(st.st_mode & 0o7777) | S_ISGID)
        }
        if st.st_mode & S_IWOTH != 0 {
            let mode = String(st.st_mode & 0o7777, radix: 8)
            throw StoreError(
                .insecureDirectory,
                "The group directory \(path) is writable by every user (mode \(mode)). Refusing to open a store "
                    + "there; run `chmod o-w \(path)` (Tributary creates it with mode 2770).")
        }
    }

    private static func makeDirectories(_ path: String) throws(StoreError) {
        var prefix = path.hasPrefix("/") ? "" : "."
        for component in path.split(separator: "/") {
            prefix += "/" + component
            if mkdir(prefix, 0o770) != 0 && errno != EEXIST {
                let err = errno
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
