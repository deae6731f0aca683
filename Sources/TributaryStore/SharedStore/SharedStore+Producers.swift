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

    /// The stored layout: lastSeq u64, kind u8, pid u32, firstSeen i64, lastSeen i64 (29 bytes,
    /// big-endian), then the CRC-32 of those 29 bytes (33 in all). A 29-byte value, as releases before
    /// the CRC wrote, is read as it is. Nil for anything else: too short, or a CRC that does not match.
    init?(id: String, encoded: UnsafeRawBufferPointer) {
        guard encoded.count == Self.fieldsSize || encoded.count >= Self.encodedSize else { return nil }
        if encoded.count >= Self.encodedSize {
            let fields = UnsafeRawBufferPointer(rebasing: encoded[0..<Self.fieldsSize])
            var r = ByteReader(UnsafeRawBufferPointer(rebasing: encoded[Self.fieldsSize...]))
            guard r.u32() == crc32Of(fields) else { return nil }
        }
        var r = ByteReader(encoded)
        self.id = id
        lastSeq = r.u64()
        kind = ProducerKind(rawValue: r.u8())
        pid = Int32(bitPattern: r.u32())
        firstSeenMillis = Int64(bitPattern: r.u64())
        lastSeenMillis = Int64(bitPattern: r.u64())
    }

    /// The fields' bytes, and with the CRC after them.
    static let fieldsSize = 29
    static let encodedSize = 33

    func encoded() -> [UInt8] {
        [UInt8](unsafeUninitializedCapacity: Self.encodedSize) { buffer, count in
            var w = ByteWriter(UnsafeMutableRawBufferPointer(buffer))
            w.u64(lastSeq)
            w.u8(kind.rawValue)
            w.u32(UInt32(bitPattern: pid))
            w.u64(UInt64(bitPattern: firstSeenMillis))
            w.u64(UInt64(bitPattern: lastSeenMillis))
            w.u32(crc32Of(UnsafeRawBufferPointer(rebasing: UnsafeRawBufferPointer(buffer)[0..<Self.fieldsSize])))
            count = Self.encodedSize
        }
    }
}

// MARK: Producers

extension SharedStore {
    /// Every producer that has appended to this store (one whose registration is damaged: see
    /// ``damagedProducers()``).
    public func producers() throws -> [ProducerRegistration] {
        try registrations().valid
    }

    /// The ids of producers whose stored registration is damaged (too short, or its CRC does not match).
    /// Each one's next append writes it anew, its `producer_seq` going on above every seq the store
    /// handed out (``registration(in:producerID:)``).
    public func damagedProducers() throws -> [String] {
        try registrations().damaged
    }

    private func registrations() throws -> (valid: [ProducerRegistration], damaged: [String]) {
        let dbi = environment.tables.producers
        return try environment.read { txn in
            var out: (valid: [ProducerRegistration], damaged: [String]) = ([], [])
            try txn.scan(dbi) { key, value in
                let id = String(decoding: UnsafeRawBufferPointer(start: key.mv_data, count: key.mv_size), as: UTF8.self)
                if let registration = ProducerRegistration(id: id, encoded: value) {
                    out.valid.append(registration)
                } else {
                    out.damaged.append(id)
                }
                return true
            }
            return out
        }
    }

    /// The registration of `producerID`: a new one when there is none. A damaged one (a bad page, a tool
    /// that wrote over it) used to be taken for none, and the producer's `producer_seq` started again
    /// at 1, handing out numbers its earlier events carry. It goes on instead above every global seq the
    /// store handed out: each of the producer's events took one of those too, so no number of it can be
    /// higher. (The collector sees a gap in that producer's numbers, not a repeat.)
    func registration(in txn: Transaction, producerID: String) throws -> ProducerRegistration {
        let dbi = environment.tables.producers
        let stored: ProducerRegistration?? = try withKey(producerID) { key in
            try txn.withValue(dbi, &key) { $0.map { ProducerRegistration(id: producerID, encoded: $0) } }
        }
        switch stored {
        case .some(.some(let registration)): return registration
        case .none: return ProducerRegistration(id: producerID)
        case .some(.none):
            var recovered = ProducerRegistration(id: producerID)
            recovered.lastSeq = max(try lastAssignedSeq(in: txn), try newestSeq(in: txn) ?? 0)
            return recovered
        }
    }

    func store(_ registration: ProducerRegistration, in txn: Transaction) throws {
        let dbi = environment.tables.producers
        try withKey(registration.id) { key in try registration.encoded().withUnsafeBytes { try txn.put(dbi, &key, $0) } }
    }
}
