import CLMDB
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// The tables of the shared store (LMDB named databases).
struct Tables {
    /// Event records keyed by the big-endian global sequence number.
    var events: MDB_dbi = 0
    /// Store-wide counters and the schema version.
    var meta: MDB_dbi = 0
    /// The app group's identity: anonymous id, login id, device id.
    var identity: MDB_dbi = 0
    /// Configuration written by the main app (key → JSON text).
    var config: MDB_dbi = 0
    /// Producer registrations keyed by producer id.
    var producers: MDB_dbi = 0
}

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
    private let resizeLock = ReadWriteLock()
    /// Where this process mapped the store, as ``releaseMappedPages()`` last read it from
    /// `/proc/self/maps`, and the map size then (every resize changes the size, and may move the map).
    private let mappedRanges = Mutex<(mapSize: Int, ranges: [(start: UInt, end: UInt)])?>(nil)

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
    private let dataFD: Int32?
    /// The group directory's modification and change times (ns since the epoch) when the data file
    /// was last found linked: while they stay the same, no file in the directory was removed or
    /// renamed since (``checkNotReplaced()``).
    private let directoryVerified = Mutex<(modified: Int64, changed: Int64)?>(nil)
    /// The directory holding the store's two files, open for `fstat`, or -1.
    private let directoryFD: Int32
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
            tables = try Environment.openTables(handle, path: path)
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
        // LMDB's own mapping of the lock file: by inode and by path (two stores on two file systems may
        // have lock files of the same inode number), and only if there is exactly one.
        if let lockFile, let resolved = resolvedPath(path + "-lock") {
            let mappings = Self.sharedMappings(ofInode: lockFile.inode, permissions: "rw-s")
                .filter { $0.offset == 0 && $0.path == resolved }
            if mappings.count == 1 {
                watchedLockWords = LockWordWatch.shared.watch(self, lockMapping: mappings[0].start)
            }
        }
    }

    /// What to do when a store cannot be opened beside its replaced predecessor, or written after one of
    /// its two files was replaced.
    private static let releaseAdvice =
        "Release every Tracker and SharedStore of the old store in this process (a new one would share one of "
        + "its files), or restart the process; remove a store by removing both files with every process of the "
        + "group stopped."

    private static func nanos(_ time: timespec) -> Int64 { Int64(time.tv_sec) * 1_000_000_000 + Int64(time.tv_nsec) }

    /// The device and inode of the file at `path`, or nil when it cannot be examined.
    private static func identity(of path: String) -> (device: UInt64, inode: UInt64)? {
        var info = Glibc.stat()
        guard stat(path, &info) == 0 else { return nil }
        return (UInt64(info.st_dev), UInt64(info.st_ino))
    }

    /// Opens the store's tables: in a read-only transaction when they all exist, so that opening a store
    /// (every `Tracker`, `tributary status`, the agent) never waits for the writer lock, which another
    /// process may hold for as long as it likes (stopped with SIGSTOP in a transaction, or in a debugger).
    /// Only a store that lacks a table (a new one) is opened in a write transaction, which creates it.
    private static func openTables(_ env: OpaquePointer, path: String) throws(StoreError) -> Tables {
        if let tables = try openTables(env, path: path, creating: false) { return tables }
        return try openTables(env, path: path, creating: true)!
    }

    /// The tables, opened in a write transaction that creates the missing ones when `creating`, else in
    /// a read-only one; nil when not `creating` and a table is missing (or no reader slot is free).
    ///
    /// lmdb.h, `mdb_dbi_open`: "The database handle will be private to the current transaction until
    /// the transaction is successfully committed. If the transaction is aborted the handle will be
    /// closed automatically. After a successful commit the handle will reside in the shared environment,
    /// and may be used by other transactions." That holds for a read-only transaction too (its commit
    /// keeps the handles it opened), so the read-only one is committed, not aborted.
    private static func openTables(_ env: OpaquePointer, path: String, creating: Bool) throws(StoreError) -> Tables? {
        let flags = creating ? 0 : UInt32(MDB_RDONLY)
        var txn: OpaquePointer?
        var rc = MDB.txnBegin(env, flags, &txn)
        // Another process may have grown the map and written past this one's since mdb_env_open sized
        // it: adopt the new size (lmdb.h, MDB_MAP_RESIZED) and begin again. Each round needs another
        // growth, which the quota bounds.
        while rc == MDB_MAP_RESIZED {
            try mapError(MDB.setMapSize(env, 0), "mdb_env_set_mapsize", path: path)
            rc = MDB.txnBegin(env, flags, &txn)
        }
        // Every reader slot taken by a live process (stale ones were cleared at open): a write transaction
        // needs none, so open the tables as before this read-only path existed.
        if rc == MDB_READERS_FULL && !creating { return nil }
        try mapError(rc, "mdb_txn_begin", path: path)
        // A store of a newer schema is refused before anything is created in it (a newer Tributary may
        // have other tables): only its meta table is read here, and the transaction is aborted.
        var meta: MDB_dbi = 0
        if MDB.dbiOpen(txn, "meta", 0, &meta) == MDB_SUCCESS {
            // The value stays valid (in the map) until the transaction ends.
            let value: UnsafeRawBufferPointer? = withKey(MetaKey.schemaVersion) { key in
                var value = MDB_val()
                guard MDB.get(txn, meta, &key, &value) == MDB_SUCCESS else { return nil }
                return UnsafeRawBufferPointer(start: value.mv_data, count: value.mv_size)
            }
            let stored: UInt32?
            do throws(StoreError) {
                stored = try value.map { bytes throws(StoreError) in try decodeMeta(bytes, key: MetaKey.schemaVersion) }
            } catch {
                MDB.txnAbort(txn)
                throw error
            }
            if let stored, stored > SharedStore.schemaVersion {
                MDB.txnAbort(txn)
                let directory = parentDirectory(of: path)
                throw SharedStore.unsupportedSchema(stored, groupDirectory: directory)
            }
        }
        var tables = Tables()
        let names: [(String, WritableKeyPath<Tables, MDB_dbi>)] = [
            ("events", \.events), ("meta", \.meta), ("identity", \.identity), ("config", \.config),
            ("producers", \.producers),
        ]
        for (name, keyPath) in names {
            var dbi: MDB_dbi = 0
            let rc = MDB.dbiOpen(txn, name, creating ? UInt32(MDB_CREATE) : 0, &dbi)
            if rc == MDB_NOTFOUND && !creating {
                MDB.txnAbort(txn)
                return nil
            }
            if rc != MDB_SUCCESS {
                MDB.txnAbort(txn)
                try mapError(rc, "mdb_dbi_open(\(name))", path: path)
            }
            tables[keyPath: keyPath] = dbi
        }
        try mapError(MDB.txnCommit(txn), "mdb_txn_commit", path: path)
        return tables
    }

    /// Whether either of the store's two files is no longer the one this environment opened: the store
    /// was deleted, or deleted and created anew, since (what this process reads and writes, no other
    /// process sees), or its lock file was (processes that open the store now take another writer lock
    /// than this one: their writes and this process's are no longer serialised).
    var isReplaced: Bool { isDataFileReplaced || isLockFileReplaced }

    /// Whether `path` no longer names the data file this environment has open.
    var isDataFileReplaced: Bool {
        guard let file else { return false }
        guard let now = Self.identity(of: path) else { return true }
        return now != file
    }

    /// Whether `<path>-lock` no longer names the lock file this environment opened (false when its
    /// identity could not be had at open: it is then never taken for replaced).
    private var isLockFileReplaced: Bool { lockFile != nil && !isLockFileKept }

    /// Whether `<path>-lock` still names the lock file this environment opened.
    private var isLockFileKept: Bool {
        guard let lockFile, let now = Self.identity(of: path + "-lock") else { return false }
        return now == lockFile
    }

    /// Throws ``StoreError/Code/storeReplaced`` when the data file this environment has open has no
    /// name left (deleted, or replaced by another file at the path): what a producer writes into it
    /// reaches no one. Called at the start of every producer write transaction (``SharedStore``'s
    /// `producerWrite`), so that the window in which a deletion can still go unnoticed is one
    /// transaction's.
    ///
    /// Asking the data file itself (`stat` or `fstat`) in every transaction made each commit's
    /// `fdatasync` about 30 µs slower on ext4 (Linux 6.18; one durable `track()` at a time: p50 275 →
    /// 310 µs, 10 % fewer events per second), most likely through multigrain time stamps (Linux 6.13
    /// and later): once its times have been read, the kernel gives the next write a fine-grained time
    /// stamp, which dirties the inode, which the sync then writes too. So the check reads the group
    /// directory's times instead (a removal or rename in it, or of it, changes them) and examines the
    /// files only when they changed: the data file's link count,
    /// and whether the path and the lock file's path still name the files this environment opened
    /// (a data file renamed or hard-linked away keeps a name; a kept lock file would be shared with
    /// the store now at the path). Directory times are trusted only once their change time (which no
    /// program can set) is 20 ms old, or 2 s when the file system keeps whole seconds: a second change
    /// within one tick of a coarse clock could leave them as they were.
    ///
    /// `drainingOldFile` (the agent's deletes): a data file deleted or replaced is no refusal, since the
    /// agent drains what is left in it to the end, but a lock file replaced beside a kept data file is:
    /// the processes that opened the store since write that same file under another writer lock.
    func checkNotReplaced(drainingOldFile: Bool = false) throws(StoreError) {
        guard let dataFD else { return }
        var clock = timespec()
        clock_gettime(CLOCK_REALTIME, &clock)
        var directory = Glibc.stat()
        var stamp: (modified: Int64, changed: Int64)?
        if directoryFD >= 0, fstat(directoryFD, &directory) == 0 {
            let now = (modified: Self.nanos(directory.st_mtim), changed: Self.nanos(directory.st_ctim))
            if directoryVerified.withLock({ $0.map { $0 == now } ?? false }) { return }
            stamp = now
        }
        var info = Glibc.stat()
        guard fstat(dataFD, &info) == 0 else { return }
        let lockKept = isLockFileKept
        let dataGone = info.st_nlink == 0 || isDataFileReplaced
        guard dataGone || (lockFile != nil && !lockKept) else {
            let settled = stamp.map { stamp in
                let coarse = stamp.changed % 1_000_000_000 == 0 && stamp.modified % 1_000_000_000 == 0
                return Self.nanos(clock) - stamp.changed > (coarse ? 2_000_000_000 : 20_000_000)
            } ?? false
            directoryVerified.withLock { $0 = settled ? stamp : nil }
            return
        }
        if drainingOldFile && dataGone { return }
        // Both files replaced: a new environment shares nothing with this one (Environment.open). One of
        // them kept: a new one would share it, so this one must be closed first.
        let reopen = dataGone && !lockKept
            ? "Open the store again: a new Tracker or SharedStore in this process, or restart it."
            : Self.releaseAdvice
        guard dataGone else {
            throw StoreError(
                .storeReplaced,
                "The lock file \(path)-lock was deleted or replaced while this process had the store open; nothing was "
                    + "written (the processes that opened the store since write it under another writer lock). " + reopen)
        }
        throw StoreError(
            .storeReplaced,
            "The shared store \(path) was deleted, moved or created anew while this process had it open; nothing was "
                + "written (no other process would ever read it). " + reopen)
    }

    // MARK: Room for appends

    /// The part of the quota appends leave free: 1/64 of it, at least 32 pages. LMDB copies every page
    /// it changes and records the pages it frees, so deleting events needs fresh pages too; if appends
    /// could fill the whole quota, the agent's drain could never delete what it moved to the outbox, and
    /// the store would stay full for good.
    var reserve: Int { Self.reserve(quota: quota, pageSize: pageSize) }

    /// ``reserve`` for a store of `quota` bytes in pages of `pageSize` bytes.
    static func reserve(quota: Int, pageSize: Int) -> Int { max(quota / 64, 32 * pageSize) }

    /// The page size LMDB gives a store it creates here: the system's, at most LMDB's largest (32 KiB).
    static let newStorePageSize = min(Int(sysconf(Int32(_SC_PAGESIZE))), 32 << 10)

    /// The bytes a record of `encodedSize` bytes takes in the events table: a record over about half
    /// a page goes to overflow pages of its own, whole pages; a smaller one shares a leaf page.
    static func footprint(ofRecord encodedSize: Int, pageSize: Int) -> Int {
        let node = encodedSize + 8 + 8  // the 8-byte key and LMDB's node header
        guard node > pageSize / 2 - 16 else { return node + 2 }  // and its 2-byte slot in the page
        let overflow = encodedSize + 16  // LMDB's page header
        return (overflow + pageSize - 1) / pageSize * pageSize
    }

    /// The id of the last committed write transaction (`mdb_env_info`'s `me_last_txnid`, read under the
    /// resize lock as ``mapSize`` is).
    var lastTransactionID: Int {
        resizeLock.withReadLock {
            var info = MDB_envinfo()
            MDB.envInfo(env, &info)
            return info.me_last_txnid
        }
    }

    /// An append's room check: throws ``StoreError/Code/storeFull`` unless records taking `bytes` (see
    /// ``footprint(ofRecord:pageSize:)``) leave ``reserve`` of the quota free.
    ///
    /// Made inside the append's write transaction, before each record is put, with the running total:
    /// an append that does not fit stops at its first record that does not (a group commit that does not
    /// fit is split and tried again, so a refused attempt must cost little under the writer lock). It
    /// reads what the last commit left once: the file's high-water mark and, only when that alone is too
    /// close to the quota, the free list.
    struct RoomCheck {
        private let environment: Environment
        private let highWater: Int
        /// The quota less the reserve left for the agent's deletes.
        private let limit: Int
        private var freeBytes: Int?

        init(_ environment: Environment) {
            self.environment = environment
            var info = MDB_envinfo()
            MDB.envInfo(environment.env, &info)
            highWater = (info.me_last_pgno + 1) * environment.pageSize
            limit = environment.quota - environment.reserve
        }

        mutating func check(adding bytes: Int) throws(StoreError) {
            let need = bytes + 8 * environment.pageSize  // and the pages its tree paths, meta and registration copy
            if highWater + need <= limit { return }
            let free = freeBytes ?? environment.freePages() * environment.pageSize
            freeBytes = free
            guard highWater - free + need <= limit else {
                throw StoreError(
                    .storeFull,
                    "The shared store \(environment.path) reached its quota of \(environment.quota) bytes (appends leave "
                        + "\(environment.reserve) of them for the agent's deletes). Nothing was written; start the agent to "
                        + "drain it, or raise the quota.")
            }
        }
    }

    /// The pages on LMDB's free list as the last commit left them (`mdb_stat -f` counts them the same
    /// way), read in a read-only transaction of its own: LMDB opens no cursor on the free list in a write
    /// transaction, and `MDB_NOTLS` lets this thread hold both. 0 when it cannot be read (the append is
    /// then judged by the high-water mark alone).
    fileprivate func freePages() -> Int {
        var txn: OpaquePointer?
        guard MDB.txnBegin(env, UInt32(MDB_RDONLY), &txn) == MDB_SUCCESS, let txn else { return 0 }
        defer { MDB.txnAbort(txn) }
        var cursor: OpaquePointer?
        guard MDB.cursorOpen(txn, 0, &cursor) == MDB_SUCCESS, let cursor else { return 0 }  // dbi 0: FREE_DBI
        defer { MDB.cursorClose(cursor) }
        var key = MDB_val()
        var value = MDB_val()
        var total = 0
        var op = MDB_FIRST
        while MDB.cursorGet(cursor, &key, &value, op) == MDB_SUCCESS {
            // A record is an array of page numbers (size_t) whose first element is their count.
            if value.mv_size >= MemoryLayout<Int>.size, let data = value.mv_data {
                total += data.loadUnaligned(as: Int.self)
            }
            op = MDB_NEXT
        }
        return total
    }

    /// The data file as an open finds it: LMDB's page size, and the file's descriptor and `fstat` (nil
    /// when LMDB gives no descriptor or the file cannot be stat'ed).
    private struct DataFile {
        var pageSize: Int
        var fd: Int32?
        var stat: Glibc.stat?
    }

    private static func dataFile(of handle: OpaquePointer) -> DataFile {
        var stat = MDB_stat()
        MDB.envStat(handle, &stat)
        var fd: Int32 = -1
        var info = Glibc.stat()
        guard MDB.envGetFD(handle, &fd) == MDB_SUCCESS, fstat(fd, &info) == 0 else {
            return DataFile(pageSize: Int(stat.ms_psize), fd: nil, stat: nil)
        }
        return DataFile(pageSize: Int(stat.ms_psize), fd: fd, stat: info)
    }

    /// Throws ``StoreError/Code/unreadableStore`` if the data file is shorter than the pages its newest
    /// meta page says are in use: a truncated copy (a backup cut short, a disk that filled while the file
    /// was copied). LMDB reads the store through its memory map, and a page past the end of the file is a
    /// SIGBUS that kills the process at its first read.
    private static func checkNotTruncated(_ handle: OpaquePointer, _ data: DataFile, path: String) throws(StoreError) {
        guard let file = data.stat else { return }
        var info = MDB_envinfo()
        MDB.envInfo(handle, &info)
        let needed = (info.me_last_pgno + 1) * data.pageSize
        guard Int(file.st_size) < needed else { return }
        throw StoreError(
            .unreadableStore,
            "The store \(path) is \(file.st_size) bytes long, shorter than the \(needed) bytes its pages reach: the "
                + "file was cut short (a copy or a backup that did not finish?). Nothing was read or written; move it "
                + "aside (a producer then creates a new store) or restore it whole.")
    }

    /// The current map size (what LMDB uses: the larger of ours and the one another process set).
    var mapSize: Int { resizeLock.withReadLock { mapSizeLocked } }

    /// ``mapSize``, for a caller holding the resize lock (shared or exclusive): `mdb_env_info` reads the
    /// meta pages through the memory map, which a resize on another thread unmaps and maps again.
    private var mapSizeLocked: Int {
        var info = MDB_envinfo()
        MDB.envInfo(env, &info)
        return info.me_mapsize
    }

    /// Drops this process's page-table entries for the store's memory map (`madvise(MADV_DONTNEED)`).
    ///
    /// LMDB maps the file read-only and `MAP_SHARED` (no `MDB_WRITEMAP`), so the pages stay in the
    /// kernel's page cache with their data; the next access to one maps it again (a minor fault). Only
    /// this process's resident set shrinks: a reader that has walked the whole store otherwise keeps
    /// every page it read counted in its RSS. LMDB does not publish where it mapped the file
    /// (`mdb_env_info`'s `me_mapaddr` is only set with `MDB_FIXEDMAP`), so the ranges come from
    /// `/proc/self/maps`, read again only when the map size changed (a resize may move the map):
    /// reading and parsing it on every drain chunk cost 4 % of the agent's CPU. The resize lock, held
    /// shared, keeps the map where it is meanwhile.
    func releaseMappedPages() {
        resizeLock.withReadLock {
            let mapSize = mapSizeLocked
            let ranges = mappedRanges.withLock { cached in
                if let cached, cached.mapSize == mapSize { return cached.ranges }
                let found = storeMappings()
                cached = found.isEmpty ? nil : (mapSize, found)
                return found
            }
            for range in ranges {
                _ = madvise(UnsafeMutableRawPointer(bitPattern: range.start), Int(range.end - range.start), MADV_DONTNEED)
            }
        }
    }

    /// The read-only shared mappings of the store's data file in `/proc/self/maps`. Only those
    /// ("r--s"): MADV_DONTNEED would discard a private mapping's written pages, never a shared read-only
    /// one's.
    private func storeMappings() -> [(start: UInt, end: UInt)] {
        var st = stat()
        guard stat(path, &st) == 0 else { return [] }
        return Self.sharedMappings(ofInode: UInt64(st.st_ino), permissions: "r--s").map { ($0.start, $0.end) }
    }

    /// This process's mappings of the file with inode `inode` and permissions `permissions` (as
    /// `/proc/self/maps` writes them), with the file offset each begins at and the path it names.
    private static func sharedMappings(
        ofInode inode: UInt64, permissions: String
    ) -> [(start: UInt, end: UInt, offset: UInt, path: String)] {
        guard let maps = fopen("/proc/self/maps", "r") else { return [] }
        defer { fclose(maps) }
        var buffer: UnsafeMutablePointer<CChar>?
        var capacity = 0
        defer { free(buffer) }
        var ranges: [(start: UInt, end: UInt, offset: UInt, path: String)] = []
        // Lines: "start-end perms offset dev inode path"; a file's maps are the ones with its inode.
        // (getline, not String(contentsOfFile:): /proc files report size 0 and may be read short.)
        while getline(&buffer, &capacity, maps) > 0, let buffer {
            let line = String(cString: buffer)
            let fields = line.split(separator: " ", maxSplits: 5, omittingEmptySubsequences: true)
            guard fields.count == 6, fields[1] == permissions, UInt64(fields[4]) == inode,
                let offset = UInt(fields[2], radix: 16)
            else { continue }
            let bounds = fields[0].split(separator: "-")
            guard bounds.count == 2, let start = UInt(bounds[0], radix: 16), let end = UInt(bounds[1], radix: 16),
                end > start, start != 0
            else { continue }
            ranges.append((start, end, offset, fields[5].trimmingCharacters(in: .whitespacesAndNewlines)))
        }
        return ranges
    }

    /// Size of the data file on disk, in bytes.
    var fileSize: Int {
        var st = stat()
        return stat(path, &st) == 0 ? Int(st.st_size) : 0
    }

    // MARK: Transactions

    /// Runs `body` in a read-only transaction.
    ///
    /// Each one takes a slot of the lock file's reader table (126) while it runs. When none is free,
    /// `mdb_reader_check` frees those of dead processes and the read begins again; when every slot is
    /// held by a live process, `body` runs in a write transaction instead, which needs no slot, and that
    /// transaction is aborted. It waits for the writer lock, but the read does not fail. So a read must
    /// not be made on a thread in the middle of a write transaction (`append`'s `build`): that thread
    /// would wait for its own lock.
    func read<T>(_ body: (Transaction) throws -> T) throws -> T {
        while true {
            do {
                return try resizeLock.withReadLock {
                    var txn: OpaquePointer?
                    try check(mdb.txnBegin(env, UInt32(MDB_RDONLY), &txn), "mdb_txn_begin")
                    defer { MDB.txnAbort(txn) }
                    TestPause.hit("store.read")
                    return try body(Transaction(txn: txn!, mdb: mdb))
                }
            } catch let failure as LMDBFailure where failure.rc == MDB_READERS_FULL {
                var dead: Int32 = 0
                MDB.readerCheck(env, &dead)
                if dead > 0 { continue }
                return try write(mayNudge: false, commit: false, body)
            } catch let failure as LMDBFailure where failure.rc == MDB_MAP_RESIZED {
                try adoptMapSize(waitingAtMost: Self.adoptionWait)
            } catch let failure as LMDBFailure {
                try recover(from: failure)
            }
        }
    }

    /// Runs `body` in a write transaction and commits it (durably unless the store was opened with
    /// `durable: false`). If the map is full the transaction is aborted, the map grown up to the quota,
    /// and `body` run again from the start; at the quota, after one ``nudge()``,
    /// ``StoreError/Code/storeFull`` is thrown and nothing is written.
    func write<T>(_ body: (Transaction) throws -> T) throws -> T {
        try write(mayNudge: true, commit: true, body)
    }

    /// ``write(_:)``, with or without the ``nudge()`` at the quota (the nudge's own write has none), and
    /// committed or, for a read that no reader slot was left for, aborted.
    private func write<T>(mayNudge: Bool, commit: Bool, _ body: (Transaction) throws -> T) throws -> T {
        var nudged = !mayNudge
        while true {
            // The map size a transaction found full: another thread of this process may have grown the
            // map by the time this one gets to grow it.
            var fullAt = 0
            do {
                return try resizeLock.withReadLock {
                    do {
                        var txn: OpaquePointer?
                        try check(mdb.txnBegin(env, 0, &txn), "mdb_txn_begin")
                        let value: T
                        do {
                            value = try body(Transaction(txn: txn!, mdb: mdb))
                        } catch {
                            MDB.txnAbort(txn)
                            throw error
                        }
                        guard commit else {
                            MDB.txnAbort(txn)
                            return value
                        }
                        try check(mdb.txnCommit(txn!), "mdb_txn_commit")
                        return value
                    } catch let failure as LMDBFailure where failure.rc == MDB_MAP_FULL {
                        fullAt = mapSizeLocked  // no resize meanwhile: it waits for this lock
                        throw failure
                    }
                }
            } catch let failure as LMDBFailure {
                guard failure.rc == MDB_MAP_FULL else {
                    try recover(from: failure)
                    continue
                }
                if !nudged, fullAt >= quota {
                    nudged = true
                    try nudge()
                    continue
                }
                try grow(from: fullAt)
            }
        }
    }

    /// Commits a transaction that changes nothing but LMDB's bookkeeping (it writes `schema_version`
    /// back as it is). LMDB reuses a page freed by a commit only from the second commit after it (the
    /// snapshot before the last stays readable): at the quota, right after a drain freed most of the
    /// store in one commit, the next append would find no page it may use, and fail again and again
    /// while nothing else commits. One small commit makes the freed pages usable.
    private func nudge() throws {
        try write(mayNudge: false, commit: true) { txn in
            try withKey(MetaKey.schemaVersion) { key in
                if let version = try txn.withValue(tables.meta, &key, { $0.map(Array.init) }) {
                    try version.withUnsafeBytes { try txn.put(tables.meta, &key, $0) }
                }
            }
        }
    }

    /// How long a read waits to adopt a map another process grew (``adoptMapSize(waitingAtMost:)``).
    static let adoptionWait: Duration = .milliseconds(500)

    /// Adopts the map size another process grew the store to, once no transaction of this process is
    /// running, waiting at most `limit` for that; throws ``StoreError/Code/busy`` after it.
    ///
    /// A read waits no longer: a write of this process waiting for LMDB's writer lock holds the resize
    /// lock shared all along, and the writer lock may be held by a process that is stopped (SIGSTOP, a
    /// debugger). The agent's deletes wait so, on a thread of their own; its loop, whose reads would
    /// otherwise wait with them, skips a drain instead, and goes on uploading and keeping its deadlines.
    private func adoptMapSize(waitingAtMost limit: Duration) throws(StoreError) {
        let adopted: Bool? = try resizeLock.withWriteLock(waitingAtMost: limit) { () throws(StoreError) in
            try adoptMapSize()
            return true
        }
        guard adopted != nil else {
            throw StoreError(
                .busy,
                "The shared store \(path) was grown by another process, and this process could not adopt its new size "
                    + "within \(limit): one of its own writes is waiting for the store's writer lock, which another "
                    + "process holds (stopped, or slow). Nothing was read; try again.")
        }
    }

    /// Adopts the size another process grew the map to (lmdb.h: "call mdb_env_set_mapsize() with a size
    /// of zero to adopt the new size"); the resize lock is held exclusively.
    private func adoptMapSize() throws(StoreError) {
        try Environment.mapError(mdb.setMapSize(env, 0), "mdb_env_set_mapsize", path: path)
    }

    /// Handles the LMDB failures that a retry can cure; throws a ``StoreError`` for the rest.
    private func recover(from failure: LMDBFailure) throws(StoreError) {
        switch failure.rc {
        case MDB_MAP_RESIZED:
            // A write waits to adopt the size as it waits for the writer lock.
            try resizeLock.withWriteLock { () throws(StoreError) in try adoptMapSize() }
        default:
            try Environment.mapError(failure.rc, failure.call, path: path)
        }
    }

    /// Doubles the map size a transaction found full (`fullAt`), up to the quota; does nothing when the
    /// map is larger already (another thread of this process grew it meanwhile: the caller tries again).
    private func grow(from fullAt: Int) throws(StoreError) {
        try resizeLock.withWriteLock { () throws(StoreError) in
            let current = mapSizeLocked
            guard current <= fullAt else { return }
            guard current < quota else {
                throw StoreError(
                    .storeFull,
                    "The shared store \(path) reached its quota of \(quota) bytes. Nothing was written; "
                        + "start the agent to drain it, or raise the quota.")
            }
            let target = min(quota, max(current * 2, current + 1 << 20))
            try Environment.mapError(mdb.setMapSize(env, target), "mdb_env_set_mapsize", path: path)
        }
    }

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

// MARK: Reader table

extension Environment {
    /// lmdb.h: "mdb_reader_check: Check for stale entries in the reader lock table." Returns how many
    /// slots of dead processes were cleared.
    func clearStaleReaders() throws(StoreError) -> Int {
        var dead: Int32 = 0
        try Environment.mapError(MDB.readerCheck(env, &dead), "mdb_reader_check", path: path)
        return Int(dead)
    }

    /// The lines of `mdb_reader_list` ("pid thread txnid"), without its header; one per occupied slot.
    func readerSlots() -> [String] {
        final class Lines { var text = "" }
        let lines = Lines()
        _ = MDB.readerList(env, { message, context in
            guard let message, let context else { return 0 }
            Unmanaged<Lines>.fromOpaque(context).takeUnretainedValue().text += String(cString: message)
            return 0
        }, Unmanaged.passUnretained(lines).toOpaque())
        return withExtendedLifetime(lines) {
            lines.text.split(separator: "\n").map { String($0.drop(while: { $0 == " " })) }
                .filter { !$0.isEmpty && !$0.hasPrefix("pid") && $0 != "(no active readers)" }
        }
    }
}
