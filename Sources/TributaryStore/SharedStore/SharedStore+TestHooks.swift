import CLMDB

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

    /// Writes `bytes` as the registration of `producerID` (tests plant a damaged one).
    package func overwriteRegistration(producerID: String, bytes: [UInt8]) throws {
        let dbi = environment.tables.producers
        try environment.write { txn in
            try withKey(producerID) { key in try bytes.withUnsafeBytes { try txn.put(dbi, &key, $0) } }
        }
    }
}
