import CLMDB

// MARK: Transactions

extension Environment {
    /// Runs `body` in a read-only transaction.
    ///
    /// Each one takes a slot of the lock file's reader table (126) while it runs. When none is free,
    /// `mdb_reader_check` frees those of dead processes and the read begins again; when every slot is
    /// held by a live process, `body` runs in a write transaction instead, which needs no slot, and that
    /// transaction is aborted. It waits for the writer lock up to ``readerFallbackWait``, then fails with
    /// ``StoreError/Code/busy``. So a read must not be made on a thread in the middle of a write
    /// transaction (`append`'s `build`): that thread would wait for its own lock, and fail.
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
                // With the writer lock held by a stopped process, the write waited for ever (the agent's
                // loop with it): bounded, as a map adoption is.
                guard writerLockFree(within: Self.readerFallbackWait) else { throw Self.readersFullBusy(path) }
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
}
