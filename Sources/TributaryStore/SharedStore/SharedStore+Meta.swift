import CLMDB

enum MetaKey {
    static let schemaVersion = "schema_version"
    static let lastSeq = "last_seq"
    static let storeID = "store_id"
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

// MARK: Schema and meta values

extension SharedStore {
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
    static func checkSchema(_ environment: Environment, groupDirectory: String) throws -> UInt64 {
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

    /// The store's `meta/last_seq` (0 before the first append).
    func lastAssignedSeq(in txn: Transaction) throws -> UInt64 {
        try Self.metaValue(MetaKey.lastSeq, in: txn, environment.tables.meta) ?? 0
    }

    /// The integer stored under `key` in the `meta` table (nil when there is none), checked by
    /// ``decodeMeta(_:key:as:)``.
    private static func metaValue<T: FixedWidthInteger & UnsignedInteger>(
        _ key: String, in txn: Transaction, _ meta: MDB_dbi
    ) throws -> T? {
        try withKey(key) { bytes in try txn.withValue(meta, &bytes) { try $0.map { try decodeMeta($0, key: key, as: T.self) } } }
    }
}
