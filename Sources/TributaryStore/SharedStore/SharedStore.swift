import CLMDB

#if canImport(Glibc)
import Glibc
#endif

/// The shared, crash-safe event store of one app group: an LMDB environment in the group directory.
///
/// Every producer process appends to it; the sync agent drains it. Any number of processes may open
/// the same group at once. Within a process, instances for the same directory share one LMDB
/// environment. Do not `fork()` a process that has a store open (lmdb.h: "Use an MDB_env* in the
/// process which opened it, without fork()ing"); spawn child processes instead.
public final class SharedStore: Sendable {
    /// How a store is opened.
    public struct Options: Sendable {
        /// Map size to start with; the map doubles on demand up to ``quota``. Default 32 MiB.
        public var initialMapSize: Int = 32 << 20
        /// Largest size the store may grow to; past it appends fail with `storeFull`. Default 1 GiB, at
        /// least ``SharedStore/minimumQuota``.
        public var quota: Int = 1 << 30
        /// Whether each commit is fsynced before it returns. Default true; only benchmarks turn it off.
        public var durable: Bool = true
        /// Whether a missing group directory and store are created. Default true; false opens only an
        /// existing store.
        public var create: Bool = true
        /// With ``create``: whether a missing group directory is created too. Default true; false (the
        /// `tributary track` command without `--create`) refuses a missing directory, a mistyped path
        /// that would otherwise become a group and a store no agent drains, and creates only the store.
        public var createDirectory: Bool = true

        /// The defaults.
        public init() {}
    }

    /// The smallest quota a store may have on this machine: 512 KiB, or 96 LMDB pages where pages are
    /// larger than 4 KiB (1.5 MiB with 16 KiB pages; 3 MiB with LMDB's largest, 32 KiB, which kernels
    /// with 64 KiB pages get). Appends leave part of the quota to the agent's deletes (at least 32
    /// pages, docs/store-format.md); a quota much smaller would hold no event at all.
    public static let minimumQuota = minimumQuota(pageSize: Environment.newStorePageSize)

    /// The smallest quota for a store of LMDB pages of `pageSize` bytes: room for the reserve, a new
    /// store's pages and the largest event, with some to spare.
    static func minimumQuota(pageSize: Int) -> Int { max(512 << 10, 96 * pageSize) }

    /// The schema this code writes, stored under `meta/schema_version`.
    public static let schemaVersion: UInt32 = 1
    /// Name of the LMDB data file inside the group directory (the lock file adds `-lock`).
    public static let fileName = "tributary.mdb"

    /// The app group directory.
    public let groupDirectory: String
    /// A random number given to the store when it was created (`meta/store_id`, never 0), and never
    /// changed: a store deleted and created again at the same path is told apart by it. The agent
    /// keeps the id of the store it drains with the outbox's progress, which counts in this store's
    /// sequence numbers.
    public let storeID: UInt64
    let environment: Environment

    /// Opens the store of the app group at `groupDirectory`, creating the directory and store if needed.
    public init(groupDirectory: String, options: Options = Options()) throws {
        guard options.quota >= Self.minimumQuota else {
            throw StoreError(
                .invalidOptions,
                "A store's quota must be at least \(Self.minimumQuota) bytes on this machine, not \(options.quota): appends "
                    + "leave at least 32 of its pages (\(32 * Environment.newStorePageSize) bytes) for the agent's deletes.")
        }
        guard options.initialMapSize > 0 else {
            throw StoreError(
                .invalidOptions,
                "A store's initial map size must be positive, not \(options.initialMapSize) (the map starts at the "
                    + "smaller of it and the quota, and doubles on demand).")
        }
        // Before any file is opened: the store's must not become the process's stdout.
        StandardDescriptors.takeClosed()
        var directory = groupDirectory
        while directory.count > 1 && directory.hasSuffix("/") { directory.removeLast() }
        let directoryStat = try GroupDirectory.prepare(
            directory, create: options.create, creatingDirectory: options.createDirectory)
        self.groupDirectory = directory
        // One environment per file per process (see Environment): key it by the canonical path.
        let canonical = resolvedPath(directory) ?? directory
        let path = canonical + "/" + Self.fileName
        if !options.create { try GroupDirectory.checkStoreExists(directory) }
        let environment = try Environment.open(path: path, options: options)
        do {
            storeID = try Self.checkSchema(environment, groupDirectory: directory)
        } catch {
            environment.release()
            throw error
        }
        self.environment = environment
        GroupDirectory.addSetGroupID(directory, directoryStat)
    }

    deinit { environment.release() }

    /// Throws unless the group at `groupDirectory` has a store; opens nothing.
    ///
    /// - Throws: ``StoreError/Code/directoryUnavailable`` when there is none,
    ///   ``StoreError/Code/notADirectory`` when the path is not a directory, and
    ///   ``StoreError/Code/permissionDenied`` when this user may not look inside it.
    package static func checkExists(groupDirectory: String) throws(StoreError) {
        try GroupDirectory.checkStoreExists(groupDirectory)
    }

    /// Throws unless `groupDirectory` is a directory this user may look inside (whether or not it holds a
    /// store yet); opens nothing.
    ///
    /// - Throws: ``StoreError/Code/directoryUnavailable`` when there is nothing there,
    ///   ``StoreError/Code/notADirectory`` when the path is not a directory, and
    ///   ``StoreError/Code/permissionDenied`` when this user may not list or enter it.
    package static func checkDirectory(groupDirectory: String) throws(StoreError) {
        try GroupDirectory.checkReadable(groupDirectory)
    }

    /// The reader lock table's occupied slots, as `mdb_reader_list` prints them ("pid thread txnid").
    ///
    /// A slot whose process died while reading stays until ``clearStaleReaders()`` (every process runs it
    /// when it opens the store); until then it pins old pages and the file grows.
    public func readerSlots() -> [String] { environment.readerSlots() }

    /// Clears the reader slots of processes that died (`mdb_reader_check`); returns how many it cleared.
    public func clearStaleReaders() throws -> Int { try environment.clearStaleReaders() }

    /// Whether the group's store file or its lock file is no longer the one this `SharedStore` has open:
    /// it was deleted, or deleted and created anew (an app reinstalled), since it was opened. A
    /// long-running process (the agent) then sees nothing other processes write (the data file), or
    /// would write beside them under another writer lock (the lock file), and must open the store again.
    public var isReplaced: Bool { environment.isReplaced }

    /// A write transaction of a producer (an append, identity, configuration): refused with
    /// ``StoreError/Code/storeReplaced`` before anything is put when the store file was deleted, moved
    /// or created anew under this process, since nobody would ever read what it wrote there (and a full
    /// store that was deleted is not the agent's to drain: that error comes before `storeFull`). The
    /// agent's own writes (its deletes) go on in the old file, whose events it drains to the end, unless
    /// only the lock file was replaced (``deleteEvents(through:held:)``).
    func producerWrite<T>(_ body: (Transaction) throws -> T) throws -> T {
        try environment.write { txn in
            try environment.checkNotReplaced()
            return try body(txn)
        }
    }

    /// Fault injection for this store's LMDB calls (tests only).
    package var faults: LMDBFaults { environment.faults }

    /// The addresses of the lock file's mutex words that ``LockWordWatch`` wakes every second (reader
    /// table's, writer's), or nil when none are watched (tests: a lost wake-up made by hand).
    package var watchedLockWords: [UInt]? { environment.watchedLockWords }

    /// The id of the last write transaction committed to the store by any process (tests: that a
    /// refused write committed nothing).
    package var lastTransactionID: Int { environment.lastTransactionID }
}
