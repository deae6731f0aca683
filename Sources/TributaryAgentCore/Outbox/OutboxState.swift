import GRDB

// The `agent_state` table: the outbox's counters and positions, one integer per key.

extension Outbox {
    /// A key of the `agent_state` table (docs/outbox.md, "`agent_state`: counters and the drain
    /// position", says what each holds). The raw values are the keys on disk: an outbox keeps them
    /// across agent versions, and migrations and the view `outbox` name some in their SQL (``migrator``),
    /// so a raw value never changes. The table also holds `dead_letter_bytes`, which migration v5 added
    /// and no agent reads any more.
    enum StateKey: String {
        /// The highest store seq ever drained (``lastDrainedSeq()``).
        case lastDrainedSeq = "last_drained_seq"
        /// The ``SharedStore/storeID`` of the store drained (``adoptStore(_:)``); 0: none recorded.
        case storeID = "store_id"
        /// ``recordIdentity(_:)`` of the store record drained last (0: not known), and its seq
        /// (``reconcile(lastAssignedSeq:oldestSeq:identityAt:)``).
        case lastDrainedRecord = "last_drained_record"
        case lastDrainedRecordSeq = "last_drained_record_seq"
        /// The largest row id ever handed out (``Tables/lastID(_:spans:)``).
        case lastID = "last_id"
        /// Which table the drain appends to (0 or 1), and the id through which rows are delivered
        /// (``Tables``).
        case newerTable = "newer_table"
        case deliveredThrough = "delivered_through"
        /// The rows waiting and their body bytes (``pending()``).
        case pendingCount = "pending_count"
        case pendingBytes = "pending_bytes"
        /// The dead letters' body bytes, kept by SQLite triggers (migration v6; ``pending()``).
        case deadLetterBodyBytes = "dead_letter_body_bytes"
        /// The run of dead letters: how many in a row, the destination they were counted against, and
        /// the seq of the event a halt held back (``deadLetterRun(destination:)``).
        case deadLettersInARow = "dead_letters_in_a_row"
        case deadLettersDestination = "dead_letters_destination"
        case haltedSeq = "halted_seq"
        /// The persistent ``Counters``.
        case drained = "drained"
        case delivered = "delivered"
        case batches = "batches"
        case retries = "retries"
        case deadLetters = "dead_letters"
        case corruptRecords = "corrupt_records"
        case duplicatesSkipped = "duplicates_skipped"
    }

    /// Counters kept in the outbox (they survive restarts).
    public struct Counters: Sendable, Hashable, Codable {
        public var drained: Int64 = 0
        public var delivered: Int64 = 0
        public var batches: Int64 = 0
        public var retries: Int64 = 0
        public var deadLetters: Int64 = 0
        public var corruptRecords: Int64 = 0
        public var duplicatesSkipped: Int64 = 0
    }

    /// The bytes the dead letters hold (their bodies, or a corrupt record's raw bytes). They count
    /// against the outbox quota with the pending events.
    public func deadLetterBytes() throws -> Int { try pending().deadLetterBytes }

    /// Number of events waiting and their total body size, and the dead letters' bytes (with the
    /// pending bytes, what the outbox quota bounds): one read of the counters.
    public func pending() throws -> (count: Int, bytes: Int, deadLetterBytes: Int) {
        try read { db in try pending(db) }
    }

    private func pending(_ db: Database) throws -> (count: Int, bytes: Int, deadLetterBytes: Int) {
        let select = try db.cachedStatement(sql: """
            SELECT (SELECT value FROM agent_state WHERE key = 'pending_count'),
                   (SELECT value FROM agent_state WHERE key = 'pending_bytes'),
                   (SELECT value FROM agent_state WHERE key = 'dead_letter_body_bytes')
            """)
        let row = try GRDB.Row.fetchOne(select)
        return (Int(row?[0] as Int64? ?? 0), Int(row?[1] as Int64? ?? 0), Int(row?[2] as Int64? ?? 0))
    }

    /// The counters and what waits, as the status file reports them, read in one transaction: the
    /// events of `settling` (a batch the collector acknowledged whose acknowledgement is not recorded
    /// yet: ``UploadSession/settle()``) count as delivered, not waiting, while that batch is still the
    /// one in flight, and are left as the outbox says once its acknowledgement has committed. Read apart
    /// (the batch's count, then the outbox), a write at the instant the acknowledgement committed
    /// counted the batch twice.
    public func statusFigures(
        settling: (batchID: String, count: Int)?
    ) throws -> (counters: Counters, pending: (count: Int, bytes: Int, deadLetterBytes: Int)) {
        try read { db in
            var counters = try counters(db)
            var pending = try pending(db)
            if let settling, try Self.inFlightBatchID(db) == settling.batchID {
                counters.delivered += Int64(settling.count)
                counters.batches += 1
                pending.count = max(0, pending.count - settling.count)
            }
            return (counters, pending)
        }
    }

    /// Counts a retry (for status).
    public func countRetry() throws {
        try write { db in try Self.bump(db, .retries, 1) }
    }

    /// The persistent counters.
    public func counters() throws -> Counters {
        try read { db in try counters(db) }
    }

    private func counters(_ db: Database) throws -> Counters {
        Counters(
            drained: try Self.state(db, .drained), delivered: try Self.state(db, .delivered),
            batches: try Self.state(db, .batches), retries: try Self.state(db, .retries),
            deadLetters: try Self.state(db, .deadLetters), corruptRecords: try Self.state(db, .corruptRecords),
            duplicatesSkipped: try Self.state(db, .duplicatesSkipped))
    }

    // The statements below run several times per drained chunk and per batch, and on every turn of the
    // agent's loop: they are cached per connection (`cachedStatement`), where `execute(sql:)` and
    // `fetchOne(db, sql:)` would compile them each time (a tenth of the agent's CPU in a profile of
    // `--once`, most of it SQLite's parser).

    static func state(_ db: Database, _ key: StateKey) throws -> Int64 {
        let select = try db.cachedStatement(sql: "SELECT value FROM agent_state WHERE key = ?")
        return try Int64.fetchOne(select, arguments: [key.rawValue]) ?? 0
    }

    static func setState(_ db: Database, _ key: StateKey, _ value: Int64) throws {
        try db.cachedStatement(
            sql: "INSERT INTO agent_state (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value"
        ).execute(arguments: [key.rawValue, value])
    }

    static func bump(_ db: Database, _ key: StateKey, _ by: Int) throws {
        guard by != 0 else { return }
        try db.cachedStatement(
            sql: "INSERT INTO agent_state (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = value + excluded.value"
        ).execute(arguments: [key.rawValue, by])
    }

    /// Sets ``StateKey/deadLettersInARow`` and ``StateKey/haltedSeq`` back to 0, in one statement that
    /// writes only those not 0 already.
    static func endDeadLetterRun(_ db: Database) throws {
        try db.cachedStatement(
            sql: "UPDATE agent_state SET value = 0 WHERE key IN ('dead_letters_in_a_row', 'halted_seq') AND value != 0"
        ).execute()
    }
}
