import CLMDB

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

// MARK: Opening the tables

extension Environment {
    /// Opens the store's tables: in a read-only transaction when they all exist, so that opening a store
    /// (every `Tracker`, `tributary status`, the agent) never waits for the writer lock, which another
    /// process may hold for as long as it likes (stopped with SIGSTOP in a transaction, or in a debugger).
    /// Only a store that lacks a table (a new one) is opened in a write transaction, which creates it.
    ///
    /// With every reader slot taken by a live process, the tables are opened in the write transaction too,
    /// which waits for the writer lock (`writerLockWord`: its mutex word) at most
    /// ``readerFallbackWait``, as a read does; then the open fails with ``StoreError/Code/busy``.
    static func openTables(_ env: OpaquePointer, path: String, writerLockWord: UInt?) throws(StoreError) -> Tables {
        var readersFull = false
        if let tables = try openTables(env, path: path, creating: false, readersFull: &readersFull) { return tables }
        if readersFull, !writerLockFree(writerLockWord, within: readerFallbackWait) {
            throw readersFullBusy(path)
        }
        return try openTables(env, path: path, creating: true, readersFull: &readersFull)!
    }

    /// The tables, opened in a write transaction that creates the missing ones when `creating`, else in
    /// a read-only one; nil when not `creating` and a table is missing (or no reader slot is free:
    /// `readersFull` is then set).
    ///
    /// lmdb.h, `mdb_dbi_open`: "The database handle will be private to the current transaction until
    /// the transaction is successfully committed. If the transaction is aborted the handle will be
    /// closed automatically. After a successful commit the handle will reside in the shared environment,
    /// and may be used by other transactions." That holds for a read-only transaction too (its commit
    /// keeps the handles it opened), so the read-only one is committed, not aborted.
    private static func openTables(
        _ env: OpaquePointer, path: String, creating: Bool, readersFull: inout Bool
    ) throws(StoreError) -> Tables? {
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
        if rc == MDB_READERS_FULL && !creating {
            readersFull = true
            return nil
        }
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
}
