import CLMDB

// MARK: Reading and deleting (the agent's side)

extension SharedStore {
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
    ///
    /// `held`, when given, is told how long the transaction held the store's writer lock: from the
    /// moment it had it to its commit's end (the last attempt's, when a full map made it run again).
    /// Every producer's append waits that long at most behind it.
    @discardableResult
    public func deleteEvents(through last: UInt64, held: ((Duration) -> Void)? = nil) throws -> Int {
        let dbi = environment.tables.events
        let clock = ContinuousClock()
        var since = clock.now
        let deleted = try environment.write { txn in
            since = clock.now
            try environment.checkNotReplaced(drainingOldFile: true)
            return try txn.deleteThrough(dbi, last)
        }
        held?(clock.now - since)
        return deleted
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
}
