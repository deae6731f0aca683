import CLMDB
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// One LMDB environment, opened once per process and shared by every ``SharedStore`` on that path.
///
/// lmdb.h: "Do not have open an LMDB database twice in the same process at the same time. Not even
/// from a plain open() call - close()ing it breaks flock() advisory locking." — so environments are
/// kept in a process-wide registry keyed by path, and counted: ``open(path:options:)`` and
/// ``release()`` (one per ``SharedStore``) count users under the registry's lock, and the last release
/// closes the environment under it too, so an opener never opens a path again before its previous
/// environment is closed (closing a file drops every lock this process holds on it).
final class Environment: @unchecked Sendable {
    let env: OpaquePointer
    let path: String
    let quota: Int
    /// LMDB's page size (`mdb_env_stat`).
    let pageSize: Int
    let tables: Tables
    let faults = LMDBFaults()
    var mdb: MDB { MDB(faults: faults) }

    /// Held shared by every transaction, exclusively by a map resize (see ``ReadWriteLock``).
    let resizeLock = ReadWriteLock()
    /// Where this process mapped the store, as ``releaseMappedPages()`` last read it from
    /// `/proc/self/maps`, and the map size then (every resize changes the size, and may move the map).
    let mappedRanges = Mutex<(mapSize: Int, ranges: [(start: UInt, end: UInt)])?>(nil)

    /// Stale reader slots cleared when this environment was opened.
    let staleReadersCleared: Int32

    /// Whether commits are fsynced (`SharedStore.Options.durable`).
    let durable: Bool
    /// The device and inode of the data file this environment has open (nil if LMDB's descriptor could
    /// not be examined: the file is then never taken for replaced).
    let file: (device: UInt64, inode: UInt64)?
    /// The device and inode of its lock file (`<path>-lock`) when it was opened, or nil.
    let lockFile: (device: UInt64, inode: UInt64)?
    /// The lock file's mutex words that ``LockWordWatch`` wakes every second, or nil when it does not
    /// (its mapping not found, or a layout it does not know).
    private(set) var watchedLockWords: [UInt]?
    /// LMDB's descriptor of the data file (nil if it could not be had: the file is then never taken
    /// for deleted).
    let dataFD: Int32?
    /// The group directory's modification and change times (ns since the epoch) when the data file
    /// was last found linked: while they stay the same, no file in the directory was removed or
    /// renamed since (``checkNotReplaced()``).
    let directoryVerified = Mutex<(modified: Int64, changed: Int64)?>(nil)
    /// The directory holding the store's two files, open for `fstat`, or -1.
    let directoryFD: Int32
    /// The open environments by path (the one whose file the path names now).
    private static let registry = Mutex<[String: Environment]>([:])
    /// How many ``SharedStore``s use this environment; read and written under the registry's lock only.
    private var users = 0

    /// Opens (or returns the already open) environment for `path`; balance with ``release()``.
    ///
    /// - Throws: ``StoreError/Code/optionsConflict`` when the path is already open in this process with
    ///   another durability or quota: one environment cannot have two (an event acknowledged by a
    ///   store opened `durable: true` must never sit in an `MDB_NOSYNC` environment).
    static func open(path: String, options: SharedStore.Options) throws(StoreError) -> Environment {
        var result: Result<Environment, StoreError>!
        registry.withLock { table in
            // An environment whose files were both deleted (and maybe created anew) since gives way to a
            // new one: the two share no file, so closing either never drops the other's file locks (POSIX
            // locks belong to a process and a file). With only the data file replaced, the lock file would
            // be shared (closing the old environment would drop the new one's locks, and LMDB would take
            // itself for its first user and reset the lock file under the other processes): refused. With
            // only the lock file replaced, the data file would be shared, written under two writer locks:
            // refused too.
            if let existing = table[path], existing.isReplaced {
                if existing.isLockFileKept || !existing.isDataFileReplaced {
                    result = .failure(StoreError(
                        .storeReplaced,
                        "\(path) or its lock file was deleted or replaced while this process had the store open, but "
                            + "not both: this process cannot open the new store beside the old one. " + Self.releaseAdvice))
                    return
                }
                table[path] = nil  // its users keep it until they release it; release() closes it then
            }
            if let existing = table[path] {
                guard existing.durable == options.durable, existing.quota == options.quota else {
                    result = .failure(StoreError(
                        .optionsConflict,
                        "\(path) is already open in this process with durable: \(existing.durable), quota: "
                            + "\(existing.quota) bytes; it cannot also be open with durable: \(options.durable), quota: "
                            + "\(options.quota) bytes. Open it with the same options."))
                    return
                }
                existing.users += 1
                result = .success(existing)
                return
            }
            do throws(StoreError) {
                let opened = try Environment(path: path, options: options)
                opened.users = 1
                table[path] = opened
                result = .success(opened)
            } catch {
                result = .failure(error)
            }
        }
        return try result.get()
    }

    /// Ends one user's share of the environment; the last one closes it, under the registry's lock.
    func release() {
        Self.registry.withLock { table in
            users -= 1
            guard users == 0 else { return }
            if table[path] === self { table[path] = nil }
            LockWordWatch.shared.unwatch(self)
            MDB.envClose(env)
            if directoryFD >= 0 { close(directoryFD) }
        }
    }

    private init(path: String, options: SharedStore.Options) throws(StoreError) {
        var handle: OpaquePointer?
        var rc = MDB.envCreate(&handle)
        guard rc == MDB_SUCCESS, let handle else {
            throw StoreError(.lmdb, "Could not create an LMDB environment handle.", lmdbCode: rc)
        }
        let data: DataFile
        let lockMapping: UInt?
        do throws(StoreError) {
            try Environment.mapError(MDB.envSetMaxDBs(handle, 8), "mdb_env_set_maxdbs", path: path)
            try Environment.mapError(
                MDB.setMapSize(handle, min(options.initialMapSize, options.quota)), "mdb_env_set_mapsize",
                path: path)
            // MDB_NOTLS: read transactions are not tied to threads, which Swift tasks may hop between.
            // MDB_NOSUBDIR: the environment is two files in the group directory (tributary.mdb, -lock).
            var flags = MDB_NOSUBDIR | MDB_NOTLS
            if !options.durable { flags |= MDB_NOSYNC }
            let created: [String] = [path, path + "-lock"].filter { (file: String) in access(file, F_OK) != 0 }
            rc = MDB.envOpen(handle, path, UInt32(flags), 0o660)
            if rc == EACCES {
                let directory = parentDirectory(of: path)
                throw StoreError.permissionDenied("the store \(path)", directory: directory)
            }
            try Environment.mapError(rc, "mdb_env_open", path: path)
            // LMDB creates its files through the umask; every process of the group must be able to write.
            // Only the files this open created: an existing one keeps the mode its owner gave it.
            for file in created { chmod(file, 0o660) }
            // A new file's name is durable once its directory is synced (fsync(2)): the first events'
            // commits sync the file, not the directory that names it.
            if !created.isEmpty && options.durable { try GroupDirectory.sync(parentDirectory(of: path)) }
            data = Self.dataFile(of: handle)
            try Self.checkNotTruncated(handle, data, path: path)

            // lmdb.h: "mdb_reader_check: Check for stale entries in the reader lock table" — slots left
            // by processes that died (kill -9) while reading would otherwise pin old pages forever.
            var dead: Int32 = 0
            try Environment.mapError(MDB.readerCheck(handle, &dead), "mdb_reader_check", path: path)
            staleReadersCleared = dead
            TestPause.hit("store.open", wait: .untilContinued)
            lockMapping = Self.lockMapping(path: path)
            tables = try Environment.openTables(
                handle, path: path, writerLockWord: lockMapping.flatMap { LockWordWatch.mutexWords(lockMapping: $0)?[1] })
        } catch {
            MDB.envClose(handle)
            throw error
        }
        self.env = handle
        self.path = path
        let directory = parentDirectory(of: path)
        self.directoryFD = Glibc.open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        self.quota = options.quota
        self.durable = options.durable
        self.pageSize = data.pageSize
        if let fd = data.fd, let info = data.stat {
            file = (UInt64(info.st_dev), UInt64(info.st_ino))
            dataFD = fd
        } else {
            file = nil
            dataFD = nil
        }
        lockFile = Self.identity(of: path + "-lock")
        if let lockMapping {
            watchedLockWords = LockWordWatch.shared.watch(self, lockMapping: lockMapping)
        }
    }

    /// Where LMDB mapped the lock file of the store at `path` in this process: found by inode and by path
    /// (two stores on two file systems may have lock files of the same inode number), and only if there
    /// is exactly one such mapping.
    static func lockMapping(path: String) -> UInt? {
        guard let lockFile = identity(of: path + "-lock"), let resolved = resolvedPath(path + "-lock") else { return nil }
        let mappings = sharedMappings(ofInode: lockFile.inode, permissions: "rw-s")
            .filter { $0.offset == 0 && $0.path == resolved }
        return mappings.count == 1 ? mappings[0].start : nil
    }

    /// What to do when a store cannot be opened beside its replaced predecessor, or written after one of
    /// its two files was replaced.
    static let releaseAdvice =
        "Release every Tracker and SharedStore of the old store in this process (a new one would share one of "
        + "its files), or restart the process; remove a store by removing both files with every process of the "
        + "group stopped."

    static func mapError(_ rc: Int32, _ call: StaticString, path: String) throws(StoreError) {
        guard rc != MDB_SUCCESS else { return }
        try mapError(rc, "\(call)", path: path)
    }

    static func mapError(_ rc: Int32, _ call: String, path: String) throws(StoreError) {
        guard rc != MDB_SUCCESS else { return }
        switch rc {
        case MDB_BAD_VALSIZE:
            throw StoreError(.valueTooLarge, "\(call) on \(path): a key or value has a size LMDB cannot store.",
                             lmdbCode: rc)
        case MDB_MAP_FULL:
            throw StoreError(.storeFull, "\(call) on \(path): the store reached its size quota.", lmdbCode: rc)
        case MDB_INVALID, MDB_VERSION_MISMATCH:
            // Either file can give either code (their headers' magic and format): the message names both.
            let what = rc == MDB_INVALID ? "is not an LMDB environment (no LMDB header)" : "has another LMDB format"
            throw StoreError(
                .unreadableStore,
                "\(call) on \(path): the data file or its lock file \(what). A lock file made by an LMDB build of "
                    + "another word size (a process of another architecture using the group) is replaced once no process "
                    + "has it open; a damaged data file must be restored or moved away (a producer then creates a new, "
                    + "empty store).", lmdbCode: rc)
        default:
            throw StoreError(.lmdb, "\(call) failed on \(path).", lmdbCode: rc)
        }
    }
}
