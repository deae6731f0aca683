import Foundation
import GRDB
import TributarySQLite
import TributaryStore

// The upload side: batches read from the rows waiting, the one batch in flight, acknowledgements.

extension Outbox {
    /// The batch to send next: the batch already in flight (same rows, same id) if a previous attempt
    /// did not finish, else the oldest rows up to `maxCount` events and `maxBytes` body bytes, given a
    /// new batch id. A batch in flight over either limit is cut to its first rows, under a new id.
    /// Returns an empty array when the outbox is empty.
    public func nextBatch(maxCount: Int, maxBytes: Int) throws -> [Row] {
        guard let batch = try nextBatch(maxCount: maxCount, maxBytes: maxBytes, each: { _ in }) else { return [] }
        return try rows(inBatch: batch.id)
    }

    /// One event of a batch as the outbox stores it, handed to ``nextBatch(maxCount:maxBytes:each:)``'s
    /// closure. The buffers point into SQLite's row and are valid only during the call.
    public struct BatchEvent {
        /// Wall-clock time at trigger (ms) and `CLOCK_BOOTTIME` (ns) with its 16-byte boot id.
        public var wallMillis: Int64
        public var bootNanos: UInt64
        public var bootID: UnsafeRawBufferPointer
        /// The event JSON as drained (enriched, with `_tributary`).
        public var body: UnsafeRawBufferPointer
    }

    /// The batch ``nextBatch(maxCount:maxBytes:each:)`` chose.
    public struct BatchInfo: Sendable, Hashable {
        /// Its stable id (the `Idempotency-Key`).
        public var id: String
        /// Its number of events.
        public var count: Int
    }

    /// The same batch as ``nextBatch(maxCount:maxBytes:)``, handed to `each` event by event straight
    /// from SQLite's rows (no per-row Swift values), in upload order. Returns nil when the outbox is
    /// empty. `each` runs inside the outbox's write transaction: it must only copy the bytes.
    public func nextBatch(
        maxCount: Int, maxBytes: Int, each: (BatchEvent) throws -> Void
    ) throws -> BatchInfo? {
        try write { db in
            if let inFlight = try Self.inFlight(db) {
                let scanned = try Self.scan(
                    db, from: inFlight.firstID, through: inFlight.lastID, maxCount: maxCount, maxBytes: maxBytes, each)
                if scanned.count > 0 && scanned.lastID >= inFlight.lastID {
                    if inFlight.count != scanned.count || inFlight.bytes != scanned.bytes {
                        // Recorded by an agent before migration v7 (not at all), or an outbox edited by
                        // hand: the acknowledgement takes what was read now.
                        var counted = inFlight
                        (counted.count, counted.bytes) = (scanned.count, scanned.bytes)
                        try Self.setInFlight(db, counted)
                    }
                    return BatchInfo(id: inFlight.id, count: scanned.count)
                }
                if scanned.count > 0 {
                    // More than may be sent now (a deadline leaves time for fewer events, or the agent
                    // restarted with smaller batches): the first rows become a batch of their own, with a
                    // new id; the rest go back to the pool. Sending the whole batch again could time out
                    // again, every run.
                    return try Self.startBatch(scanned, in: db)
                }
                // No row left in its range (every ending of a batch also ends `in_flight`, so this is an
                // outbox edited by hand): never send an empty batch; start a new one.
                try Self.endInFlight(db)
            }
            let scanned = try Self.scan(db, from: .min, through: .max, maxCount: maxCount, maxBytes: maxBytes, each)
            guard scanned.count > 0 else { return nil }
            return try Self.startBatch(scanned, in: db)
        }
    }

    /// Makes the rows `scanned` covers the batch in flight, under a new id.
    private static func startBatch(_ scanned: Scanned, in db: Database) throws -> BatchInfo {
        let batch = InFlight(
            id: newBatchID(), firstID: scanned.firstID, lastID: scanned.lastID, count: scanned.count,
            bytes: scanned.bytes)
        try setInFlight(db, batch)
        return BatchInfo(id: batch.id, count: scanned.count)
    }

    /// A batch id (the `Idempotency-Key`): a random UUID, lower-case.
    private static func newBatchID() -> String { UUID().uuidString.lowercased() }

    /// A batch read ahead by ``peekBatch(after:maxCount:maxBytes:each:)``: the rows right after the
    /// batch in flight. Nothing records it until ``acknowledge(_:then:)`` makes it the batch in flight.
    public struct PreparedBatch: Sendable, Hashable {
        /// The id it will have (the `Idempotency-Key`).
        public var id: String
        /// Its number of events, and their bodies' bytes.
        public var count: Int
        public var bytes: Int
        /// Its first and last row ids.
        public var firstID: Int64
        public var lastID: Int64
        /// The outbox's count of dead letters when it was read: while that is unchanged and the batch
        /// before it stayed in flight, no row of it has left the outbox (``acknowledge(_:then:patience:)``).
        var deadLettersWhenRead: Int64
    }

    /// The rows that follow the batch in flight `batchID`, chosen as ``nextBatch(maxCount:maxBytes:each:)``
    /// would choose them once that batch is acknowledged, handed to `each` in a read transaction (the
    /// drain and the uploader may write after it and before the batch is sent: only rows after these
    /// are ever added, only the uploader ends a row's wait, and the drain removes only delivered rows,
    /// emptying or trimming a table, ``Tables``). Nil when `batchID` is not in flight or no row follows it.
    public func peekBatch(
        after batchID: String, maxCount: Int, maxBytes: Int, each: (BatchEvent) throws -> Void
    ) throws -> PreparedBatch? {
        try read { db in
            guard let inFlight = try Self.inFlight(db), inFlight.id == batchID else { return nil }
            let scanned = try Self.scan(
                db, from: inFlight.lastID + 1, through: .max, maxCount: maxCount, maxBytes: maxBytes, each)
            guard scanned.count > 0 else { return nil }
            return PreparedBatch(
                id: Self.newBatchID(), count: scanned.count, bytes: scanned.bytes,
                firstID: scanned.firstID, lastID: scanned.lastID,
                deadLettersWhenRead: try Self.state(db, .deadLetters))
        }
    }

    /// What ``scan(_:from:through:maxCount:maxBytes:_:)`` handed on: how many rows, their body bytes,
    /// and the ids of the first and last.
    private struct Scanned {
        var count = 0
        var bytes = 0
        var firstID: Int64 = 0
        var lastID: Int64 = 0
        /// Whether the next row would have passed the byte limit.
        var full = false
    }

    /// Hands the rows waiting with ids from `firstID` through `lastID` to `each`, in upload order (the
    /// older table's, then the newer's: ``Tables``), until `maxCount` rows or until the next body would
    /// pass `maxBytes` (the first row always goes).
    private static func scan(
        _ db: Database, from firstID: Int64, through lastID: Int64, maxCount: Int, maxBytes: Int,
        _ each: (BatchEvent) throws -> Void
    ) throws -> Scanned {
        let tables = try Tables.read(db)
        var scanned = Scanned()
        for table in tables.inOrder where scanned.count < maxCount && !scanned.full {
            let select = try db.cachedStatement(sql: selectBatchSQL[table])
            let raw = RawStatement(select)
            raw.reset()
            raw.bind(1, max(firstID, tables.deliveredThrough + 1))
            raw.bind(2, lastID)
            raw.bind(3, Int64(maxCount - scanned.count))
            try scan(select, in: db, maxBytes: maxBytes, into: &scanned, each)
        }
        return scanned
    }

    /// For each table: at most `?3` rows with ids from `?1` through `?2`, in upload order.
    static let selectBatchSQL = Tables.sql {
        "SELECT id, wall_ms, boot_ns, boot_id, body FROM \($0) WHERE id BETWEEN ? AND ? ORDER BY id LIMIT ?"
    }

    /// Steps a bound ``selectBatchSQL`` statement, handing each row to `each` and adding it to `scanned`,
    /// until the rows run out or the next body would pass `maxBytes` (the first row of all always goes).
    private static func scan(
        _ statement: Statement, in db: Database, maxBytes: Int, into scanned: inout Scanned,
        _ each: (BatchEvent) throws -> Void
    ) throws {
        let raw = RawStatement(statement)
        defer { raw.reset() }
        while true {
            let rc = raw.step()
            if rc == RawStatement.done { break }
            guard rc == RawStatement.row else { throw raw.error(rc, in: db, sql: statement.sql) }
            let body = raw.blob(4)
            if scanned.count > 0 && scanned.bytes + body.count > maxBytes {
                scanned.full = true
                break
            }
            let bootID = raw.blob(3)
            let id = raw.int64(0)
            if scanned.count == 0 { scanned.firstID = id }
            scanned.lastID = id
            try each(BatchEvent(
                wallMillis: raw.int64(1), bootNanos: UInt64(bitPattern: raw.int64(2)), bootID: bootID, body: body))
            scanned.count += 1
            scanned.bytes += body.count
        }
    }

    /// The rows of batch `batchID`, in upload order (to bisect or dead-letter a batch the collector refused);
    /// empty unless `batchID` is the batch in flight.
    public func rows(inBatch batchID: String) throws -> [Row] {
        try read { db in
            guard let inFlight = try Self.inFlight(db), inFlight.id == batchID else { return [] }
            return try Self.rows(db, inFlight)
        }
    }

    /// Makes `rows` (consecutive rows of a failed batch, in upload order) a new batch of their own with a
    /// new id; the other rows of the batch in flight go back to the pool of unbatched rows.
    public func rebatch(_ rows: [Row]) throws -> [Row] {
        try write { db in
            guard let first = rows.first, let last = rows.last else {
                try Self.endInFlight(db)
                return []
            }
            var batch = InFlight(id: Self.newBatchID(), firstID: first.id, lastID: last.id)
            let rows = try Self.rows(db, batch)
            batch.count = rows.count
            batch.bytes = rows.reduce(0) { $0 + $1.body.count }
            try Self.setInFlight(db, batch)
            return rows
        }
    }

    /// Returns a batch's rows to the pool of unbatched rows.
    public func unbatch(_ batchID: String) throws {
        try write { db in try db.execute(sql: "DELETE FROM in_flight WHERE batch_id = ?", arguments: [batchID]) }
    }

    /// Removes an acknowledged batch from the rows waiting (see ``acknowledge(_:then:patience:)``).
    public func acknowledge(_ batchID: String) throws {
        _ = try acknowledge(batchID, then: nil)
    }

    /// Removes an acknowledged batch from the rows waiting and, in the same transaction, makes `next`
    /// (read ahead while `batchID` was out) the batch in flight, if its rows are still exactly the
    /// oldest ones. Its rows are delivered by moving `delivered_through` past them, not deleted one by
    /// one; a table whose rows are then all delivered is emptied whole, and one holding more delivered
    /// rows than ``Tables/heldRows(turnRows:)`` has those deleted (``Tables``).
    ///
    /// The transaction commits with `synchronous=NORMAL`: its WAL frames are written but not synced
    /// (the next `FULL` commit, a drain's, syncs them with its own). A power loss can only undo an
    /// acknowledgement, never a drain: the batch is then sent again under its id and the collector's
    /// dedup drops it (delivery is at least once on the wire). A process crash loses nothing: the
    /// frames are in the kernel's page cache. The sync was 5 of the acknowledgement's 7.5 ms per
    /// 2,000-event batch, then on the path between one request and the next (the agent now runs the
    /// acknowledgement while the next request is out: ``UploadSession/settle()``).
    ///
    /// `patience`: how long to wait for another process's write lock (nil: the connection's 10 s);
    /// past it the acknowledgement fails with `SQLITE_BUSY` and nothing changes.
    ///
    /// - Returns: whether `next` is now the batch in flight (false: build the next batch anew).
    @discardableResult
    public func acknowledge(_ batchID: String, then next: PreparedBatch?, patience: Duration? = nil) throws -> Bool {
        try writeOutsideTransaction { db in
            try Self.withPatience(patience, db) {
                // Cached: compiled once, not at every acknowledgement (a statement a batch).
                try db.cachedStatement(sql: "PRAGMA synchronous = NORMAL").execute()
                var madeInFlight = false
                let outcome = Result {
                    try db.inTransaction {
                        madeInFlight = try acknowledge(batchID, in: db, then: next)
                        return .commit
                    }
                }
                // Every other transaction commits FULL: set it back before anything else can run here.
                try db.cachedStatement(sql: "PRAGMA synchronous = FULL").execute()
                try outcome.get()
                return madeInFlight
            }
        }
    }

    /// ``acknowledge(_:then:patience:)``'s transaction.
    private func acknowledge(_ batchID: String, in db: Database, then next: PreparedBatch?) throws -> Bool {
        guard try acknowledge(batchID, in: db) else { return false }
        guard let next else { return false }
        let tables = try Tables.read(db)
        var oldest: Int64?
        for table in tables.inOrder where oldest == nil {
            oldest = try Int64.fetchOne(
                db.cachedStatement(sql: Self.firstWaitingSQL[table]), arguments: [tables.deliveredThrough])
        }
        guard oldest == next.firstID else { return false }
        // Its rows are all still there unless one was taken from the middle of what waits. Rows are
        // added only after every other; the batch before it stayed in flight since the read (its id is
        // new each time), so no other acknowledgement ran; of the other writers, only a dead letter
        // takes a waiting row (a hand edit of the outbox could too, and is not looked for). With no dead
        // letter since the read, counting them (reading each of their pages on this connection) is not
        // needed.
        if try Self.state(db, .deadLetters) != next.deadLettersWhenRead {
            var count = 0
            for table in tables.inOrder {
                let statement = try db.cachedStatement(sql: Self.waitingThroughSQL[table])
                count += try Int.fetchOne(statement, arguments: [tables.deliveredThrough, next.lastID]) ?? 0
            }
            guard count == next.count else { return false }
        }
        try Self.setInFlight(
            db, InFlight(id: next.id, firstID: next.firstID, lastID: next.lastID, count: next.count, bytes: next.bytes))
        return true
    }

    /// For each table: the first id above `?1`.
    static let firstWaitingSQL = Tables.sql { "SELECT MIN(id) FROM \($0) WHERE id > ?" }
    /// For each table: how many rows have ids above `?1` and up to `?2`.
    static let waitingThroughSQL = Tables.sql { "SELECT COUNT(*) FROM \($0) WHERE id > ? AND id <= ?" }

    /// Ends the batch in flight if it is `batchID`, its rows delivered; false when it is not.
    ///
    /// When no row waits before it (always so, unless the outbox was edited by hand), its rows are
    /// delivered by moving `delivered_through` to its last id, and a table whose rows are then all
    /// delivered is emptied whole (``Tables``); otherwise its rows are deleted one by one.
    private func acknowledge(_ batchID: String, in db: Database) throws -> Bool {
        guard let inFlight = try Self.inFlight(db), inFlight.id == batchID else { return false }
        var tables = try Tables.read(db)
        var delivered = 0
        var bytes = 0
        if let count = inFlight.count, let recorded = inFlight.bytes {
            (delivered, bytes) = (count, recorded)  // no read of its rows
        } else {
            let from = max(inFlight.firstID, tables.deliveredThrough + 1)
            for table in tables.inOrder {
                let row = try GRDB.Row.fetchOne(
                    db.cachedStatement(sql: Self.countSQL[table]), arguments: [from, inFlight.lastID])
                delivered += row?[0] ?? 0
                bytes += row?[1] ?? 0
            }
        }
        var earlierWaiting = false
        for table in tables.inOrder {
            let statement = try db.cachedStatement(sql: Self.waitingBetweenSQL[table])
            earlierWaiting = try earlierWaiting
                || Bool.fetchOne(statement, arguments: [tables.deliveredThrough, inFlight.firstID]) == true
        }
        if earlierWaiting {
            for table in tables.inOrder {
                try db.cachedStatement(sql: Self.deleteRangeSQL[table])
                    .execute(arguments: [inFlight.firstID, inFlight.lastID])
            }
        } else {
            tables.deliveredThrough = max(tables.deliveredThrough, inFlight.lastID)
            try Self.setState(db, .deliveredThrough, tables.deliveredThrough)
        }
        try tables.emptyDelivered(db, turnRows: turnRows)
        try Self.endInFlight(db)
        if delivered > 0 {
            // A delivery ends the run of dead letters, and any hold a halt made (the held event was the
            // first waiting: delivered, or dead-lettered before this).
            try Self.endDeadLetterRun(db)
        }
        try Self.bump(db, .delivered, delivered)
        try Self.bump(db, .pendingCount, -delivered)
        try Self.bump(db, .pendingBytes, -bytes)
        try Self.bump(db, .batches, 1)
        return true
    }

    /// For each table: how many rows have ids from `?1` through `?2`, and their body bytes.
    static let countSQL = Tables.sql {
        "SELECT COUNT(*), COALESCE(SUM(LENGTH(body)), 0) FROM \($0) WHERE id BETWEEN ? AND ?"
    }
    /// For each table: whether a row has an id above `?1` and below `?2`.
    static let waitingBetweenSQL = Tables.sql {
        "SELECT EXISTS (SELECT 1 FROM \($0) WHERE id > ? AND id < ?)"
    }
    /// For each table: deletes the rows with ids from `?1` through `?2`.
    static let deleteRangeSQL = Tables.sql { "DELETE FROM \($0) WHERE id BETWEEN ? AND ?" }

    /// The batch in flight: its id and the ids of its first and last rows (every row waiting between them
    /// belongs to it), with their number and their bodies' bytes (nil: not recorded, as by an agent before
    /// migration v7).
    private struct InFlight {
        var id: String
        var firstID: Int64
        var lastID: Int64
        var count: Int?
        var bytes: Int?
    }

    /// The id of the batch in flight, if any.
    static func inFlightBatchID(_ db: Database) throws -> String? { try inFlight(db)?.id }

    private static func inFlight(_ db: Database) throws -> InFlight? {
        try GRDB.Row.fetchOne(
            db.cachedStatement(
                sql: "SELECT batch_id, first_id, last_id, event_count, body_bytes FROM in_flight LIMIT 1")
        ).map { r in
            InFlight(id: r[0], firstID: r[1], lastID: r[2], count: r[3], bytes: r[4])
        }
    }

    private static func setInFlight(_ db: Database, _ batch: InFlight) throws {
        try endInFlight(db)
        try db.cachedStatement(
            sql: "INSERT INTO in_flight (batch_id, first_id, last_id, event_count, body_bytes) VALUES (?, ?, ?, ?, ?)"
        ).execute(arguments: [batch.id, batch.firstID, batch.lastID, batch.count, batch.bytes])
    }

    /// Ends the batch in flight, if any: its rows go back to the pool of unbatched rows.
    private static func endInFlight(_ db: Database) throws {
        try db.cachedStatement(sql: "DELETE FROM in_flight").execute()
    }

    /// The rows of the batch in flight, with its id.
    private static func rows(_ db: Database, _ batch: InFlight) throws -> [Row] {
        try GRDB.Row.fetchAll(
            db, sql: "SELECT * FROM outbox WHERE id BETWEEN ? AND ? ORDER BY id", arguments: [batch.firstID, batch.lastID]
        ).map { r in
            Row(
                id: r["id"], seq: UInt64(r["seq"] as Int64), eventID: r["event_id"], producer: r["producer"],
                producerKind: ProducerKind(rawValue: UInt8(r["producer_kind"] as Int)),
                producerSeq: UInt64(r["producer_seq"] as Int64), wallMillis: r["wall_ms"],
                bootNanos: UInt64(bitPattern: r["boot_ns"] as Int64), bootID: BootID(bytes: (r["boot_id"] as Data)),
                body: Array(r["body"] as Data), batchID: batch.id)
        }
    }
}
