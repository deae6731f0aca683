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
        /// Whether a missing group directory is created. Default true.
        public var create: Bool = true

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
        let directoryStat = try GroupDirectory.prepare(directory, create: options.create)
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
    /// only the lock file was replaced (``deleteEvents(through:)``).
    private func producerWrite<T>(_ body: (Transaction) throws -> T) throws -> T {
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

    /// The refusal of a store whose schema is newer than this Tributary's.
    static func unsupportedSchema(_ stored: UInt32, groupDirectory: String) -> StoreError {
        StoreError(
            .unsupportedSchema,
            "The store in \(groupDirectory) has schema version \(stored); this Tributary reads up to "
                + "\(Self.schemaVersion). Upgrade Tributary; the store was left untouched.")
    }

    /// Checks the schema version and returns the store id; writes whichever of the two a new store (or,
    /// for the id, a store created before ids) does not have yet, in a write transaction that checks
    /// again that they are absent.
    private static func checkSchema(_ environment: Environment, groupDirectory: String) throws -> UInt64 {
        let meta = environment.tables.meta
        let (stored, storeID): (UInt32?, UInt64?) = try environment.read { txn in
            (try metaValue(MetaKey.schemaVersion, in: txn, meta), try metaValue(MetaKey.storeID, in: txn, meta))
        }
        if let stored, stored > Self.schemaVersion { throw unsupportedSchema(stored, groupDirectory: groupDirectory) }
        if stored != nil, let storeID { return storeID }
        return try environment.write { txn in
            try withKey(MetaKey.schemaVersion) { key in
                if try txn.withValue(meta, &key, { $0 == nil }) {
                    try withUnsafeBytes(of: Self.schemaVersion.bigEndian) { try txn.put(meta, &key, $0) }
                }
            }
            return try withKey(MetaKey.storeID) { key in
                if let existing: UInt64 = try metaValue(MetaKey.storeID, in: txn, meta) { return existing }
                let created = 1 + randomInteger(upTo: UInt64.max - 1)
                try withUnsafeBytes(of: created.bigEndian) { try txn.put(meta, &key, $0) }
                return created
            }
        }
    }

    // MARK: Appending

    /// The producer that appends events.
    public struct Producer: Sendable, Hashable {
        /// Which kind of process this is.
        public var kind: ProducerKind
        /// A stable id for the producer (for example `app`, `share-extension`); at most 255 UTF-8 bytes.
        public var id: String
        /// The process id.
        public var pid: Int32

        /// Describes a producer; `pid` defaults to the calling process.
        public init(kind: ProducerKind, id: String, pid: Int32 = getpid()) {
            self.kind = kind
            self.id = id
            self.pid = pid
        }
    }

    /// What a producer hands the store for one event.
    public struct Draft: Sendable {
        /// Wall-clock time at trigger, ms since the epoch.
        public var wallTimeMillis: Int64
        /// `CLOCK_BOOTTIME` at trigger, ns.
        public var bootTimeNanos: UInt64
        /// The boot of that reading.
        public var bootID: BootID
        /// The event JSON.
        public var body: [UInt8]

        /// Creates a draft.
        public init(wallTimeMillis: Int64, bootTimeNanos: UInt64, bootID: BootID = .current, body: [UInt8]) {
            self.wallTimeMillis = wallTimeMillis
            self.bootTimeNanos = bootTimeNanos
            self.bootID = bootID
            self.body = body
        }
    }

    /// Where an appended event landed.
    public struct Appended: Sendable, Hashable {
        /// The global sequence number (the store key): total commit order, gap-free.
        public var seq: UInt64
        /// The producer's own sequence number.
        public var producerSeq: UInt64
    }

    /// Appends `count` events in one durable write transaction and returns their sequence numbers.
    ///
    /// `build` is called inside the transaction, once per event, with the group's current identity
    /// (so an event can never carry an identity older than one committed before it). It must not block,
    /// `await` or read the store (its thread holds the writer lock). A transaction that must begin again
    /// (the map grown, here or by another process) calls `build` and `changingIdentity` again from the
    /// first event: they must give the same result each time. When the call returns, every event is
    /// durable; when it throws, none was written.
    ///
    /// `changingIdentity`, when given, changes the group's identity in the same transaction, before
    /// the events are built (a sign-up: the login and the event that carries it are stored together,
    /// or neither is).
    public func append(
        producer: Producer, count: Int, changingIdentity change: ((inout Identity) -> Void)? = nil,
        _ build: (_ index: Int, _ identity: Identity) throws -> Draft
    ) throws -> [Appended] {
        guard count > 0 else { return [] }
        let idBytes = producer.id.utf8.count
        guard idBytes > 0, idBytes <= EventRecord.maxProducerIDBytes else {
            throw StoreError(
                .valueTooLarge,
                "A producer id must have 1 to \(EventRecord.maxProducerIDBytes) UTF-8 bytes; this one has \(idBytes).")
        }
        let tables = environment.tables
        return try producerWrite { txn in
            var identity = try self.identity(in: txn, creating: true)!
            if let change {
                change(&identity)
                try self.store(identity, in: txn)
            }
            var registration = try self.registration(in: txn, producerID: producer.id)
            var lastSeq = try self.lastAssignedSeq(in: txn)
            // Never below the newest event's seq: a `last_seq` behind it (a store file put back beside a
            // newer lock file, a tool that rewrote it) would hand a seq out again.
            if let newest = try self.newestSeq(in: txn) { lastSeq = max(lastSeq, newest) }
            let now = BootClock.wallMillis()
            var appended: [Appended] = []
            appended.reserveCapacity(count)
            var footprint = 0
            var room = Environment.RoomCheck(environment)
            for index in 0..<count {
                let draft = try build(index, identity)
                lastSeq += 1
                registration.lastSeq += 1
                let record = EventRecord(
                    producerKind: producer.kind, producerID: producer.id, pid: producer.pid,
                    producerSeq: registration.lastSeq, wallTimeMillis: draft.wallTimeMillis,
                    // A boot time means nothing without its boot: the format keeps it 0 then.
                    bootTimeNanos: draft.bootID == .unknown ? 0 : draft.bootTimeNanos, bootID: draft.bootID, body: draft.body)
                footprint += Environment.footprint(ofRecord: record.encodedSize, pageSize: environment.pageSize)
                try room.check(adding: footprint)
                try withKey(lastSeq) { key in
                    // Keys only grow, so MDB_APPEND skips the B-tree search.
                    try txn.putReserved(tables.events, &key, count: record.encodedSize, flags: MDB_APPEND) {
                        record.encode(into: $0)
                    }
                }
                appended.append(Appended(seq: lastSeq, producerSeq: registration.lastSeq))
            }
            TestPause.hit("store.append")  // tests: freeze here, writer lock held, records put, not committed
            try withKey(MetaKey.lastSeq) { key in
                try withUnsafeBytes(of: lastSeq.bigEndian) { try txn.put(tables.meta, &key, $0) }
            }
            registration.kind = producer.kind
            registration.pid = producer.pid
            if registration.firstSeenMillis == 0 { registration.firstSeenMillis = now }
            registration.lastSeenMillis = now
            try self.store(registration, in: txn)
            return appended
        }
    }

    // MARK: Reading and deleting (the agent's side)

    /// One entry read from the store.
    public struct StoredEvent: Sendable {
        /// The global sequence number.
        public var seq: UInt64
        /// The decoded record, or why it could not be decoded (a corrupt record is never returned as data).
        public var record: Result<EventRecord, EventRecord.Corruption>
    }

    /// Reads up to `limit` events with `seq ≥ start`, oldest first, in one read transaction.
    public func events(from start: UInt64 = 0, limit: Int) throws -> [StoredEvent] {
        var out: [StoredEvent] = []
        try scanEvents(from: start, limit: limit, restart: { out.removeAll(keepingCapacity: true) }) { seq, _, record in
            out.append(StoredEvent(seq: seq, record: record.map(EventRecord.init)))
        }
        return out
    }

    /// Reads up to `limit` events with `seq ≥ start`, oldest first, in one read transaction, without
    /// copying them: `body` gets each one's sequence number, its stored bytes, and its verified view or
    /// why it could not be decoded. The bytes point into the store's memory map and are valid only
    /// during the call. `restart` runs before the first event of every attempt: a read that finds the
    /// map grown by another process runs again from the start.
    public func scanEvents(
        from start: UInt64 = 0, limit: Int, restart: () -> Void = {},
        _ body: (UInt64, UnsafeRawBufferPointer, Result<EventRecord.View, EventRecord.Corruption>) throws -> Void
    ) throws {
        let dbi = environment.tables.events
        try environment.read { txn in
            restart()
            var count = 0
            try txn.scan(dbi, from: start) { key, value in
                guard count < limit else { return false }
                guard let seq = decodeSequence(key) else { return true }
                let record: Result<EventRecord.View, EventRecord.Corruption>
                do throws(EventRecord.Corruption) {
                    record = .success(try EventRecord.view(value))
                } catch {
                    record = .failure(error)
                }
                try body(seq, value, record)
                count += 1
                return count < limit
            }
        }
    }

    /// Deletes every event with `seq ≤ last` in one durable write transaction; returns how many.
    ///
    /// The deletes go on in a data file deleted or replaced since it was opened (the agent drains what
    /// is left in it), but not beside a lock file replaced since: they are refused with
    /// ``StoreError/Code/storeReplaced`` then, since the processes that opened the store after that
    /// write the same file under another writer lock.
    @discardableResult
    public func deleteEvents(through last: UInt64) throws -> Int {
        let dbi = environment.tables.events
        return try environment.write { txn in
            try environment.checkNotReplaced(drainingOldFile: true)
            return try txn.deleteThrough(dbi, last)
        }
    }

    /// The stored bytes of event `seq` as they are (the record's header and body), nil when the store
    /// holds none: the agent tells by them whether the store still holds the record it drained at a seq.
    package func rawEvent(seq: UInt64) throws -> [UInt8]? {
        let dbi = environment.tables.events
        return try environment.read { txn in try withKey(seq) { key in try txn.get(dbi, &key) } }
    }

    /// Releases this process's resident view of the store's memory map: the pages stay in the page
    /// cache and are mapped again on the next read. The agent calls it after each drained chunk, so
    /// that its RSS does not grow with the number of events it has read (promise 4).
    public func releaseMappedPages() {
        environment.releaseMappedPages()
    }

    // MARK: Identity

    /// Reads the group's identity, creating the anonymous and device ids on first use.
    public func identity() throws -> Identity {
        if let existing = try existingIdentity() { return existing }
        return try producerWrite { txn in try self.identity(in: txn, creating: true)! }
    }

    /// The group's identity, or nil when no producer has created it yet. Read only: it waits for the
    /// writer lock only when every reader slot is taken (the agent reads it to drain).
    public func existingIdentity() throws -> Identity? {
        try environment.read { txn in try self.identity(in: txn, creating: false) }
    }

    /// Binds the group to a login id (shared by every process of the group).
    public func login(_ loginID: String) throws -> Identity {
        try updateIdentity { $0.loginID = loginID }
    }

    /// Clears the login id.
    public func logout() throws -> Identity {
        try updateIdentity { $0.loginID = nil }
    }

    /// Replaces the anonymous id.
    public func identify(anonymousID: String) throws -> Identity {
        try updateIdentity { $0.anonymousID = anonymousID }
    }

    private func updateIdentity(_ change: (inout Identity) -> Void) throws -> Identity {
        try producerWrite { txn in
            var identity = try self.identity(in: txn, creating: true)!
            change(&identity)
            try self.store(identity, in: txn)
            return identity
        }
    }

    /// Writes the anonymous and login ids of `identity` (the device id never changes).
    private func store(_ identity: Identity, in txn: Transaction) throws {
        let dbi = environment.tables.identity
        for (name, value) in [(IdentityKey.anonymousID, identity.anonymousID), (IdentityKey.loginID, identity.loginID)] {
            try withKey(name) { key in
                if let value {
                    try Array(value.utf8).withUnsafeBytes { try txn.put(dbi, &key, $0) }
                } else {
                    try txn.delete(dbi, &key)
                }
            }
        }
    }

    /// Reads the identity inside a transaction; in a write transaction, creates the missing ids.
    private func identity(in txn: Transaction, creating: Bool) throws -> Identity? {
        let dbi = environment.tables.identity
        func read(_ name: String) throws -> String? {
            try withKey(name) { key in try txn.withValue(dbi, &key) { $0.map { String(decoding: $0, as: UTF8.self) } } }
        }
        var anonymous = try read(IdentityKey.anonymousID)
        var device = try read(IdentityKey.deviceID)
        if anonymous == nil || device == nil {
            guard creating else { return nil }
            for (name, current) in [(IdentityKey.anonymousID, anonymous), (IdentityKey.deviceID, device)] where current == nil {
                let fresh = randomUUIDString()
                try withKey(name) { key in try Array(fresh.utf8).withUnsafeBytes { try txn.put(dbi, &key, $0) } }
                if name == IdentityKey.anonymousID { anonymous = fresh } else { device = fresh }
            }
        }
        return Identity(anonymousID: anonymous!, loginID: try read(IdentityKey.loginID), deviceID: device!)
    }

    // MARK: Configuration written by the main app

    /// Stores a configuration value (JSON text) under `key`.
    public func setConfiguration(_ key: String, json: String) throws {
        try updateConfiguration(key) { _ in json }
    }

    /// Removes a configuration value; returns whether it was there.
    @discardableResult
    public func removeConfiguration(_ key: String) throws -> Bool {
        var existed = false
        try updateConfiguration(key) { old in
            existed = old != nil
            return nil
        }
        return existed
    }

    /// One configuration value (JSON text), or nil.
    public func configurationValue(_ key: String) throws -> String? {
        let dbi = environment.tables.config
        return try environment.read { txn in try Self.configurationValue(key, dbi: dbi, in: txn) }
    }

    private static func configurationValue(_ key: String, dbi: MDB_dbi, in txn: Transaction) throws -> String? {
        try withKey(key) { k in try txn.withValue(dbi, &k) { $0.map { String(decoding: $0, as: UTF8.self) } } }
    }

    /// Reads a configuration value and writes what `change` makes of it (nil: removes it) in one write
    /// transaction, so that no other process's change between the two is lost.
    package func updateConfiguration(_ key: String, _ change: (String?) throws -> String?) throws {
        let dbi = environment.tables.config
        try producerWrite { txn in
            let old = try Self.configurationValue(key, dbi: dbi, in: txn)
            let new = try change(old)
            guard new != old else { return }
            if let new {
                try withKey(key) { k in try Array(new.utf8).withUnsafeBytes { try txn.put(dbi, &k, $0) } }
            } else {
                _ = try withKey(key) { k in try txn.delete(dbi, &k) }
            }
        }
    }

    /// Every configuration value (key → JSON text).
    public func configuration() throws -> [String: String] {
        let dbi = environment.tables.config
        return try environment.read { txn in
            var out: [String: String] = [:]
            try txn.scan(dbi) { key, value in
                let name = String(decoding: UnsafeRawBufferPointer(start: key.mv_data, count: key.mv_size), as: UTF8.self)
                out[name] = String(decoding: value, as: UTF8.self)
                return true
            }
            return out
        }
    }

    // MARK: Producers

    /// Every producer that has appended to this store.
    public func producers() throws -> [ProducerRegistration] {
        let dbi = environment.tables.producers
        return try environment.read { txn in
            var out: [ProducerRegistration] = []
            try txn.scan(dbi) { key, value in
                let id = String(decoding: UnsafeRawBufferPointer(start: key.mv_data, count: key.mv_size), as: UTF8.self)
                if let registration = ProducerRegistration(id: id, encoded: value) { out.append(registration) }
                return true
            }
            return out
        }
    }

    /// The store's `meta/last_seq` (0 before the first append).
    private func lastAssignedSeq(in txn: Transaction) throws -> UInt64 {
        try Self.metaValue(MetaKey.lastSeq, in: txn, environment.tables.meta) ?? 0
    }

    /// The integer stored under `key` in the `meta` table (nil when there is none), checked by
    /// ``decodeMeta(_:key:as:)``.
    private static func metaValue<T: FixedWidthInteger & UnsignedInteger>(
        _ key: String, in txn: Transaction, _ meta: MDB_dbi
    ) throws -> T? {
        try withKey(key) { bytes in try txn.withValue(meta, &bytes) { try $0.map { try decodeMeta($0, key: key, as: T.self) } } }
    }

    private func registration(in txn: Transaction, producerID: String) throws -> ProducerRegistration {
        let dbi = environment.tables.producers
        return try withKey(producerID) { key in
            try txn.withValue(dbi, &key) { $0.flatMap { ProducerRegistration(id: producerID, encoded: $0) } }
        } ?? ProducerRegistration(id: producerID)
    }

    private func store(_ registration: ProducerRegistration, in txn: Transaction) throws {
        let dbi = environment.tables.producers
        try withKey(registration.id) { key in try registration.encoded().withUnsafeBytes { try txn.put(dbi, &key, $0) } }
    }

    // MARK: Status

    /// A snapshot of the store, for `tributary status`.
    public struct Status: Sendable {
        /// Events waiting to be drained.
        public var pendingEvents: Int
        /// Sequence number of the oldest pending event.
        public var oldestSeq: UInt64?
        /// Sequence number of the newest pending event.
        public var newestSeq: UInt64?
        /// The last sequence number ever assigned (drained events included).
        public var lastAssignedSeq: UInt64
        /// Size of the data file in bytes.
        public var fileSize: Int
        /// Current LMDB map size in bytes.
        public var mapSize: Int
        /// Largest size the map may grow to.
        public var quota: Int
        /// Stale reader slots this process cleared when it opened the store.
        public var staleReadersCleared: Int
        /// The group's identity.
        public var identity: Identity?
        /// Producers that have appended.
        public var producers: [ProducerRegistration]
        /// Whether the group directory is on a file system held in memory (tmpfs, ramfs): the store's
        /// fsyncs then promise nothing, and every event in it is gone at the next reboot.
        public var isMemoryBacked = false
    }

    /// The seq of the newest event the store holds, nil when it holds none: one read, where ``status()``
    /// also counts, scans and reads the producers.
    public func newestSeq() throws -> UInt64? {
        try environment.read { txn in try newestSeq(in: txn) }
    }

    private func newestSeq(in txn: Transaction) throws -> UInt64? {
        try txn.lastKey(environment.tables.events).flatMap(decodeSequence)
    }

    /// Reads a consistent snapshot of the store's state.
    public func status() throws -> Status {
        let tables = environment.tables
        var status = try environment.read { txn in
            var status = Status(
                pendingEvents: try txn.count(tables.events), oldestSeq: nil, newestSeq: nil, lastAssignedSeq: 0,
                fileSize: 0, mapSize: 0, quota: environment.quota, staleReadersCleared: Int(environment.staleReadersCleared),
                identity: try self.identity(in: txn, creating: false), producers: [])
            try txn.scan(tables.events) { key, _ in
                status.oldestSeq = decodeSequence(key)
                return false
            }
            status.newestSeq = try self.newestSeq(in: txn)
            status.lastAssignedSeq = try self.lastAssignedSeq(in: txn)
            return status
        }
        status.producers = try producers()
        status.fileSize = environment.fileSize
        status.mapSize = environment.mapSize
        status.isMemoryBacked = isMemoryBacked
        return status
    }

    /// Whether the group directory is on a file system held in memory (tmpfs, ramfs, as `/run`,
    /// `/dev/shm` and `$XDG_RUNTIME_DIR` are): a durable store must not be there, since what its fsyncs
    /// made durable is gone at the next reboot. The store opens there all the same (tests and CI
    /// machines may have `/tmp` on tmpfs); the agent warns at its start and `tributary status` says so.
    public var isMemoryBacked: Bool {
        var info = statfs()
        guard statfs(groupDirectory, &info) == 0 else { return false }
        let tmpfs: UInt = 0x0102_1994  // TMPFS_MAGIC, linux/magic.h
        let ramfs: UInt = 0x8584_58F6  // RAMFS_MAGIC
        return [tmpfs, ramfs].contains(UInt(bitPattern: Int(info.f_type)))
    }
}

/// The app group's identity, shared by every process through the store (the group's "keychain").
public struct Identity: Sendable, Hashable, Codable {
    /// A random id created once for the group, or set with `identify(anonymousID:)`.
    public var anonymousID: String
    /// The logged-in user's id, if any.
    public var loginID: String?
    /// A random id created once for the group, never reset (like iOS's identifierForVendor).
    public var deviceID: String

    /// The id events are attributed to: the login id when logged in, else the anonymous id.
    public var distinctID: String { loginID ?? anonymousID }

    /// Creates an identity.
    public init(anonymousID: String, loginID: String?, deviceID: String) {
        self.anonymousID = anonymousID
        self.loginID = loginID
        self.deviceID = deviceID
    }
}

/// What the store knows about one producer.
public struct ProducerRegistration: Sendable, Hashable {
    /// The producer id.
    public var id: String
    /// Its kind, as of its last append.
    public var kind: ProducerKind = .app
    /// The last producer sequence number assigned.
    public var lastSeq: UInt64 = 0
    /// Its process id at its last append.
    public var pid: Int32 = 0
    /// When it first appended (wall clock, ms).
    public var firstSeenMillis: Int64 = 0
    /// When it last appended (wall clock, ms).
    public var lastSeenMillis: Int64 = 0

    init(id: String) { self.id = id }

    /// Fixed 29-byte layout: lastSeq u64, kind u8, pid u32, firstSeen i64, lastSeen i64 (big-endian).
    init?(id: String, encoded: UnsafeRawBufferPointer) {
        guard encoded.count >= 29 else { return nil }
        var r = ByteReader(encoded)
        self.id = id
        lastSeq = r.u64()
        kind = ProducerKind(rawValue: r.u8())
        pid = Int32(bitPattern: r.u32())
        firstSeenMillis = Int64(bitPattern: r.u64())
        lastSeenMillis = Int64(bitPattern: r.u64())
    }

    func encoded() -> [UInt8] {
        [UInt8](unsafeUninitializedCapacity: 29) { buffer, count in
            var w = ByteWriter(UnsafeMutableRawBufferPointer(buffer))
            w.u64(lastSeq)
            w.u8(kind.rawValue)
            w.u32(UInt32(bitPattern: pid))
            w.u64(UInt64(bitPattern: firstSeenMillis))
            w.u64(UInt64(bitPattern: lastSeenMillis))
            count = 29
        }
    }
}

enum MetaKey {
    static let schemaVersion = "schema_version"
    static let lastSeq = "last_seq"
    static let storeID = "store_id"
}

enum IdentityKey {
    static let anonymousID = "anonymous_id"
    static let loginID = "login_id"
    static let deviceID = "device_id"
}

/// The big-endian integer the meta value of `key` holds. A value of another size is damage (a tool
/// that rewrote it, a damaged page): refused by name rather than read as 0, which would number events
/// from 1 again (`last_seq`), take a newer schema for a readable one, or make a store id of 0.
func decodeMeta<T: FixedWidthInteger & UnsignedInteger>(
    _ bytes: UnsafeRawBufferPointer, key: String, as type: T.Type = T.self
) throws(StoreError) -> T {
    guard bytes.count == MemoryLayout<T>.size else {
        throw StoreError(
            .corruptRecord,
            "The store's meta/\(key) holds \(bytes.count) bytes, not \(MemoryLayout<T>.size): its metadata is damaged. "
                + "Nothing was written; restore the group directory from a backup, or move the store away (a producer "
                + "then creates a new one).")
    }
    return T(bigEndian: bytes.loadUnaligned(as: T.self))
}

// MARK: Test hooks (package access only)

extension SharedStore {
    /// Overwrites the stored bytes of event `seq` (tests use it to plant a corrupt record).
    package func overwriteRawEvent(seq: UInt64, bytes: [UInt8]) throws {
        let dbi = environment.tables.events
        try environment.write { txn in
            try withKey(seq) { key in try bytes.withUnsafeBytes { try txn.put(dbi, &key, $0) } }
        }
    }

    /// Deletes the table `name` from the store (tests: a store of another schema).
    package func dropTable(_ name: String) throws {
        try environment.write { txn in
            var dbi: MDB_dbi = 0
            try check(MDB.dbiOpen(txn.txn, name, 0, &dbi), "mdb_dbi_open")
            try check(MDB.drop(txn.txn, dbi, 1), "mdb_drop")
        }
    }

    /// Writes a schema version (tests use it to simulate a store from a newer Tributary).
    package func overwriteSchemaVersion(_ version: UInt32) throws {
        try withUnsafeBytes(of: version.bigEndian) { try overwriteMeta(MetaKey.schemaVersion, bytes: Array($0)) }
    }

    /// Writes `bytes` as the meta value of `key` (`last_seq`, `store_id`, `schema_version`: tests plant
    /// damaged or stale metadata).
    package func overwriteMeta(_ key: String, bytes: [UInt8]) throws {
        let dbi = environment.tables.meta
        try environment.write { txn in
            try withKey(key) { key in try bytes.withUnsafeBytes { try txn.put(dbi, &key, $0) } }
        }
    }
}

/// Keys of the `config` table that Tributary itself reads and writes.
public enum ConfigurationKey {
    /// The main app's preset properties (a JSON object), published by the app's `Tracker` so the agent
    /// can give extension events the app's presets at drain time.
    public static let appPresets = "app.preset_properties"
}
