import CLMDB

#if canImport(Glibc)
import Glibc
#endif

// MARK: Status

extension SharedStore {
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
        /// Producers whose registration is damaged (``SharedStore/damagedProducers()``).
        public var damagedProducers: [String] = []
        /// Whether the group directory is on a file system held in memory (tmpfs, ramfs): the store's
        /// fsyncs then promise nothing, and every event in it is gone at the next reboot.
        public var isMemoryBacked = false
    }

    /// The seq of the newest event the store holds, nil when it holds none: one read, where ``status()``
    /// also counts, scans and reads the producers.
    public func newestSeq() throws -> UInt64? {
        try environment.read { txn in try newestSeq(in: txn) }
    }

    func newestSeq(in txn: Transaction) throws -> UInt64? {
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
        status.damagedProducers = try damagedProducers()
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
