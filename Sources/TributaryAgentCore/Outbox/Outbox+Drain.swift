import Foundation
import GRDB
import TributarySQLite
import TributaryStore

// The drain side: drained store entries go into the outbox, once each, in store order.

extension Outbox {
    /// The highest store sequence number ever committed to this outbox (drained), or 0.
    public func lastDrainedSeq() throws -> UInt64 {
        try read { db in UInt64(try Self.state(db, .lastDrainedSeq)) }
    }

    /// What the drain hands the outbox for one store entry.
    public enum Incoming: Sendable {
        case event(Row)
        case corrupt(seq: UInt64, raw: [UInt8], reason: String)
    }

    /// Inserts drained entries and advances `last_drained_seq` in one durable transaction.
    ///
    /// Idempotent on the store's seq: an entry whose seq is not above both `last_drained_seq` and the
    /// entries before it is skipped (counted as `duplicatesSkipped`), so a drain repeated after a crash
    /// never copies a store record twice. `beforeCommit` runs inside the transaction (crash-point tests
    /// use it).
    @discardableResult
    public func insertDrained(_ entries: [Incoming], beforeCommit: () -> Void = {}) throws -> Int {
        var chunk = DrainedChunk()
        for entry in entries {
            switch entry {
            case .event(let row):
                row.body.withUnsafeBytes { body in
                    row.bootID.bytes.withUnsafeBytes { bootID in
                        chunk.appendEvent(
                            seq: row.seq, producerKind: row.producerKind, producerSeq: row.producerSeq,
                            wallMillis: row.wallMillis, bootNanos: row.bootNanos, producer: chunk.store(row.producer.utf8),
                            eventID: chunk.store(row.eventID.utf8), bootID: chunk.store(bootID), body: chunk.store(body))
                    }
                }
            case .corrupt(let seq, let raw, let reason):
                chunk.entries.append(.corrupt(seq: seq, raw: raw, reason: reason))
            }
        }
        return try insertDrained(chunk, beforeCommit: beforeCommit).inserted
    }

    /// Drained entries on their way into the outbox, their strings and bytes held back to back in one
    /// buffer (no arrays or strings per event), in store order.
    struct DrainedChunk {
        /// One drained event: its fields, and where its text and bytes are in ``bytes``.
        struct Event {
            var seq: UInt64
            var producerKind: ProducerKind
            var producerSeq: UInt64
            var wallMillis: Int64
            var bootNanos: UInt64
            var producer: Range<Int>
            var eventID: Range<Int>
            var bootID: Range<Int>
            var body: Range<Int>
        }

        /// An event, or a store record that goes to the dead-letter table.
        enum Entry {
            case event(Event)
            case corrupt(seq: UInt64, raw: [UInt8], reason: String)

            var seq: UInt64 {
                switch self {
                case .event(let event): event.seq
                case .corrupt(let seq, _, _): seq
                }
            }
        }

        var bytes: [UInt8] = []
        var entries: [Entry] = []
        /// ``Outbox/recordIdentity(_:)`` of the store record of the last entry (0: not known).
        var lastRecordIdentity: UInt64 = 0

        /// An empty chunk.
        init() {}

        /// An empty chunk with room for `events` events of about 1 KiB (a tracked event and its
        /// `_tributary` are about 0.9 KiB): growing the buffer by doubling copied each chunk's bytes
        /// about once more. Room not written to is never touched, so it costs no memory.
        init(reservingFor events: Int) {
            bytes.reserveCapacity(events * 1024)
            entries.reserveCapacity(events)
        }

        /// Appends `bytes` to the buffer; returns where they are.
        mutating func store<C: Collection<UInt8>>(_ bytes: C) -> Range<Int> {
            let start = self.bytes.count
            self.bytes.append(contentsOf: bytes)
            return start..<self.bytes.count
        }

        /// Appends an event whose text and bytes are already in the buffer.
        mutating func appendEvent(
            seq: UInt64, producerKind: ProducerKind, producerSeq: UInt64, wallMillis: Int64, bootNanos: UInt64,
            producer: Range<Int>, eventID: Range<Int>, bootID: Range<Int>, body: Range<Int>
        ) {
            entries.append(.event(Event(
                seq: seq, producerKind: producerKind, producerSeq: producerSeq, wallMillis: wallMillis,
                bootNanos: bootNanos, producer: producer, eventID: eventID, bootID: bootID, body: body)))
        }
    }

    /// What ``insertDrained(_:beforeCommit:)`` did with a chunk.
    struct Inserted {
        /// Entries inserted as events.
        var inserted = 0
        /// Entries skipped as already in the outbox (at or below `last_drained_seq`).
        var skipped = 0
    }

    /// Makes the store whose ``SharedStore/storeID`` is `storeID` the one this outbox drains.
    ///
    /// `last_drained_seq` counts in one store's sequence numbers. When the outbox drained another store
    /// before (the group's store was deleted and created anew: an app reinstalled, a store removed by
    /// hand), the new store numbers its events from 1 again, and the drain would skip them as drained
    /// and delete them unsent: so `last_drained_seq` starts again at 0. Rows still waiting keep their
    /// places and go first. An outbox that never recorded a store (new, or from before store ids)
    /// takes this one as the store it drained.
    ///
    /// - Returns: the previous store's id and the last seq drained from it, when the store changed.
    public func adoptStore(_ storeID: UInt64) throws -> (previousStoreID: UInt64, lastDrainedSeq: UInt64)? {
        try write { db in
            let recorded = UInt64(bitPattern: try Self.state(db, .storeID))
            guard recorded != storeID else { return nil }
            try Self.setState(db, .storeID, Int64(bitPattern: storeID))
            guard recorded != 0 else { return nil }
            let drained = UInt64(try Self.state(db, .lastDrainedSeq))
            try Self.setState(db, .lastDrainedSeq, 0)
            try Self.forgetDrainedRecord(db)  // the other store's
            return (recorded, drained)
        }
    }

    /// ``insertDrained(_:beforeCommit:)`` for a chunk built by the drain.
    @discardableResult
    func insertDrained(_ chunk: DrainedChunk, beforeCommit: () -> Void = {}) throws -> Inserted {
        guard !chunk.entries.isEmpty else { return Inserted() }
        return try write { db in
            // The highest seq ever drained, then the highest of this chunk so far: an entry must be above
            // it to be inserted (no index makes a seq unique in the table; see migration v4).
            let already = UInt64(try Self.state(db, .lastDrainedSeq))
            var highest = already
            var inserted = 0
            var skipped = 0
            var corrupt = 0
            var insertedBytes = 0
            var tables = try Tables.read(db)
            let spans = try tables.turnIfDue(db, turnRows: turnRows)
            var id = try tables.lastID(db, spans: spans)
            let insert = try db.cachedStatement(sql: Self.insertSQL[tables.newer])
            try chunk.bytes.withUnsafeBytes { bytes in
                for entry in chunk.entries {
                    switch entry {
                    case .event(let event):
                        guard event.seq > highest else {
                            skipped += 1
                            continue
                        }
                        id += 1
                        try Self.insert(event, id: id, from: bytes, with: insert, in: db)
                        highest = event.seq
                        inserted += 1
                        insertedBytes += event.body.count
                    case .corrupt(let seq, let raw, let reason):
                        guard seq > highest else { continue }
                        highest = seq
                        try db.execute(
                            sql: """
                                INSERT INTO dead_letters (seq, status, reason, dead_at_ms, body)
                                VALUES (?, 0, ?, ?, ?)
                                """,
                            arguments: [Int64(seq), "corrupt store record: \(reason)", BootClock.wallMillis(), Data(raw)])
                        corrupt += 1
                    }
                }
            }
            if highest > already { try Self.setState(db, .lastDrainedSeq, Int64(highest)) }
            if inserted > 0 { try Self.setState(db, .lastID, id) }
            try Self.bump(db, .drained, inserted)
            try Self.bump(db, .pendingCount, inserted)
            try Self.bump(db, .pendingBytes, insertedBytes)
            try Self.bump(db, .duplicatesSkipped, skipped)
            try Self.bump(db, .corruptRecords, corrupt)
            try Self.bump(db, .deadLetters, corrupt)
            // Which record the chunk ended with, and at which seq (``reconcile(lastAssignedSeq:oldestSeq:identityAt:)``
            // takes it only while that seq is `last_drained_seq`: an agent from before identities were kept
            // may have moved it on since, without a word about the record there).
            if highest > already, let last = chunk.entries.last?.seq {
                try Self.setState(db, .lastDrainedRecord, Int64(bitPattern: chunk.lastRecordIdentity))
                try Self.setState(db, .lastDrainedRecordSeq, Int64(last))
            }
            beforeCommit()
            return Inserted(inserted: inserted, skipped: skipped)
        }
    }

    /// A store record's identity: FNV-1a of its first 64 bytes, its header (with the CRC-32 of the whole
    /// record, the producer and the sequence numbers); never 0.
    static func recordIdentity(_ record: [UInt8]) -> UInt64 {
        let hash = fnv1a64(record.prefix(64))
        return hash == 0 ? 1 : hash
    }

    /// Checks that the store still numbers its events as it did when this outbox drained it.
    ///
    /// A store restored from an earlier copy of itself (a backup, a snapshot of the group directory
    /// without the agent's state directory) keeps its ``SharedStore/storeID``, and numbers new events
    /// from its older `last_seq`: seqs this outbox drained from the lost copy, which the drain would skip
    /// as drained and delete unsent. Such a store has handed out fewer seqs than `last_drained_seq`
    /// (`lastAssignedSeq` below it), or holds another record at `last_drained_seq` than the one drained
    /// there (`identityAt` gives the ``recordIdentity(_:)`` of the store's record at a seq, nil when it
    /// holds none). Then `last_drained_seq` goes back to just below the store's oldest event (`oldestSeq`;
    /// to `lastAssignedSeq` when it holds none), and all it holds is drained again: events delivered
    /// before the restore go again, with their ids, and the collector drops them as duplicates.
    ///
    /// The same record still at `last_drained_seq` is a chunk that a crash left in both places (its store
    /// delete never committed, once or more): nothing to do.
    ///
    /// - Returns: the last seq drained before and after, when it went back.
    public func reconcile(
        lastAssignedSeq: UInt64, oldestSeq: UInt64?, identityAt: (UInt64) throws -> UInt64?
    ) throws -> (before: UInt64, after: UInt64)? {
        let (drained, identity) = try read { db in
            let seq = UInt64(try Self.state(db, .lastDrainedSeq))
            let identitySeq = UInt64(try Self.state(db, .lastDrainedRecordSeq))
            // Not known unless it is the record at `last_drained_seq`.
            return (seq, identitySeq == seq ? UInt64(bitPattern: try Self.state(db, .lastDrainedRecord)) : 0)
        }
        guard drained > 0 else { return nil }
        let reused: Bool
        if lastAssignedSeq < drained {
            reused = true
        } else if identity != 0, let found = try identityAt(drained) {
            reused = found != identity
        } else {
            reused = false  // deleted once drained (the usual case), or drained before identities were kept
        }
        guard reused else { return nil }
        let after = oldestSeq.map { $0 - 1 } ?? lastAssignedSeq
        try write { db in
            try Self.setState(db, .lastDrainedSeq, Int64(after))
            try Self.forgetDrainedRecord(db)
        }
        return (drained, after)
    }

    /// Forgets which record was drained last, and the event a halt held back: seqs from here on name
    /// other records (another store's, or the same seqs handed out again).
    private static func forgetDrainedRecord(_ db: Database) throws {
        try setState(db, .lastDrainedRecord, 0)
        try setState(db, .lastDrainedRecordSeq, 0)
        try setState(db, .haltedSeq, 0)
    }

    /// For each table: the `INSERT` of one row, every column bound (``insert(_:id:from:with:in:)``).
    static let insertSQL = Tables.sql {
        """
        INSERT INTO \($0) (id, seq, event_id, producer, producer_kind, producer_seq, wall_ms, boot_ns, boot_id, body)
        VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
        """
    }

    /// Runs a cached ``insertSQL`` for one event of a chunk, as row `id`.
    ///
    /// Binds with `sqlite3_bind_*` directly (``RawStatement``) instead of GRDB's `StatementArguments`:
    /// building an array of `DatabaseValue`s and two `Data` copies per row was the largest cost of a
    /// drain after the SQLite work itself. SQLITE_STATIC: the chunk's buffer outlives the statement's
    /// step; the bindings are cleared before the buffer goes.
    private static func insert(
        _ event: DrainedChunk.Event, id: Int64, from bytes: UnsafeRawBufferPointer, with statement: Statement,
        in db: Database
    ) throws {
        let raw = RawStatement(statement)
        defer { raw.clearBindings() }
        func text(_ index: Int32, _ range: Range<Int>) {
            raw.bindText(index, bytes.baseAddress!.advanced(by: range.lowerBound), count: range.count)
        }
        func blob(_ index: Int32, _ range: Range<Int>) {
            if range.isEmpty {
                raw.bindEmptyBlob(index)  // a nil pointer would store NULL; the columns are NOT NULL
            } else {
                raw.bindBlob(index, bytes.baseAddress!.advanced(by: range.lowerBound), count: range.count)
            }
        }
        raw.reset()
        raw.bind(1, id)
        raw.bind(2, Int64(event.seq))
        text(3, event.eventID)
        text(4, event.producer)
        raw.bind(5, Int64(event.producerKind.rawValue))
        raw.bind(6, Int64(event.producerSeq))
        raw.bind(7, event.wallMillis)
        raw.bind(8, Int64(bitPattern: event.bootNanos))
        blob(9, event.bootID)
        blob(10, event.body)
        let rc = raw.step()
        raw.reset()
        guard rc == RawStatement.done else { throw raw.error(rc, in: db, sql: statement.sql) }
    }
}
