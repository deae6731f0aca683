import GRDB

// The `agent_state` table: the outbox's counters and positions, one integer per key.

extension Outbox {
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
        try writer.read { db in
            let select = try db.cachedStatement(sql: """
                SELECT (SELECT value FROM agent_state WHERE key = 'pending_count'),
                       (SELECT value FROM agent_state WHERE key = 'pending_bytes'),
                       (SELECT value FROM agent_state WHERE key = 'dead_letter_body_bytes')
                """)
            let row = try GRDB.Row.fetchOne(select)
            return (Int(row?[0] as Int64? ?? 0), Int(row?[1] as Int64? ?? 0), Int(row?[2] as Int64? ?? 0))
        }
    }

    /// Counts a retry (for status).
    public func countRetry() throws {
        try writer.write { db in try Self.bump(db, "retries", 1) }
    }

    /// The persistent counters.
    public func counters() throws -> Counters {
        try writer.read { db in
            Counters(
                drained: try Self.state(db, "drained"), delivered: try Self.state(db, "delivered"),
                batches: try Self.state(db, "batches"), retries: try Self.state(db, "retries"),
                deadLetters: try Self.state(db, "dead_letters"), corruptRecords: try Self.state(db, "corrupt_records"),
                duplicatesSkipped: try Self.state(db, "duplicates_skipped"))
        }
    }

    // The statements below run several times per drained chunk and per batch, and on every turn of the
    // agent's loop: they are cached per connection (`cachedStatement`), where `execute(sql:)` and
    // `fetchOne(db, sql:)` would compile them each time (a tenth of the agent's CPU in a profile of
    // `--once`, most of it SQLite's parser).

    static func state(_ db: Database, _ key: String) throws -> Int64 {
        let select = try db.cachedStatement(sql: "SELECT value FROM agent_state WHERE key = ?")
        return try Int64.fetchOne(select, arguments: [key]) ?? 0
    }

    static func setState(_ db: Database, _ key: String, _ value: Int64) throws {
        try db.cachedStatement(
            sql: "INSERT INTO agent_state (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value"
        ).execute(arguments: [key, value])
    }

    static func bump(_ db: Database, _ key: String, _ by: Int) throws {
        guard by != 0 else { return }
        try db.cachedStatement(
            sql: "INSERT INTO agent_state (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = value + excluded.value"
        ).execute(arguments: [key, by])
    }
}
