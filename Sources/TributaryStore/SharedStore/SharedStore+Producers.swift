import CLMDB

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

// MARK: Producers

extension SharedStore {
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

    func registration(in txn: Transaction, producerID: String) throws -> ProducerRegistration {
        let dbi = environment.tables.producers
        return try withKey(producerID) { key in
            try txn.withValue(dbi, &key) { $0.flatMap { ProducerRegistration(id: producerID, encoded: $0) } }
        } ?? ProducerRegistration(id: producerID)
    }

    func store(_ registration: ProducerRegistration, in txn: Transaction) throws {
        let dbi = environment.tables.producers
        try withKey(registration.id) { key in try registration.encoded().withUnsafeBytes { try txn.put(dbi, &key, $0) } }
    }
}
