import CLMDB

#if canImport(Glibc)
import Glibc
#endif

// MARK: Appending

extension SharedStore {
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
        /// The `distinct_id` of the identity the event was built with (the group's, read in the write).
        public var distinctID: String
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
                appended.append(
                    Appended(seq: lastSeq, producerSeq: registration.lastSeq, distinctID: identity.distinctID))
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
}
