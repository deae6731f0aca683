import Foundation
import GRDB
import TributaryErrors
import TributaryStore

// Dead letters: events the collector refused and corrupt store records; their run, inspection,
// replay and discard.

extension Outbox {
    /// What kind of dead-letter request failed.
    public struct DeadLetterCode: ErrorCode {
        private enum Kind: String { case unknownDeadLetters, replayInterrupted }
        private let kind: Kind
        private init(_ kind: Kind) { self.kind = kind }
        public init?(rawValue: String) {
            guard let kind = Kind(rawValue: rawValue) else { return nil }
            self.kind = kind
        }
        public var rawValue: String { kind.rawValue }

        /// Ids given to a replay or a discard name no such dead letter: nothing was done.
        public static let unknownDeadLetters = DeadLetterCode(.unknownDeadLetters)
        /// A replay failed part way: what moved before the failure stays moved.
        public static let replayInterrupted = DeadLetterCode(.replayInterrupted)
    }

    /// A dead letter: an event the collector rejected on its own, or a store record that was corrupt.
    public struct DeadLetter: Sendable, Hashable, Codable {
        public var id: Int64
        public var seq: UInt64
        public var eventID: String?
        public var producer: String?
        public var status: Int
        public var reason: String
        public var batchID: String?
        public var deadAtMillis: Int64
        public var body: String
    }

    /// Moves one event to the dead-letter table with the collector's status and reason.
    public func deadLetter(_ row: Row, status: Int, reason: String, beforeCommit: () -> Void = {}) throws {
        try write { db in
            try db.execute(
                sql: """
                    INSERT INTO dead_letters (seq, event_id, producer, producer_kind, producer_seq, wall_ms, boot_ns,
                        boot_id, status, reason, batch_id, dead_at_ms, body)
                    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                    """,
                arguments: [
                    Int64(row.seq), row.eventID, row.producer, Int(row.producerKind.rawValue), Int64(row.producerSeq),
                    row.wallMillis, Int64(bitPattern: row.bootNanos), Data(row.bootID.bytes), status, reason,
                    row.batchID, BootClock.wallMillis(), Data(row.body),
                ])
            var deleted = 0
            let tables = try Tables.read(db)
            let waitingFrom = max(row.id, tables.deliveredThrough + 1)  // a delivered row is not waiting
            for table in 0...1 {
                try db.cachedStatement(sql: Self.deleteRangeSQL[table]).execute(arguments: [waitingFrom, row.id])
                deleted += db.changesCount
            }
            // The row may have been the last one waiting in its table.
            try tables.emptyDelivered(db, turnRows: turnRows)
            // A batch in flight holding the row is over: its other rows go back to the pool. (No row of a
            // batch in flight stops waiting while it stays in flight, and a new row's id is one past the
            // largest ever handed out: it never falls inside one.)
            try db.execute(sql: "DELETE FROM in_flight WHERE ? BETWEEN first_id AND last_id", arguments: [row.id])
            try Self.bump(db, .pendingCount, -deleted)
            try Self.bump(db, .pendingBytes, -row.body.count * deleted)
            try Self.bump(db, .deadLetters, 1)
            try Self.bump(db, .deadLettersInARow, 1)
            beforeCommit()
        }
    }

    /// Events dead-lettered since an event was last delivered (by this agent's runs and the ones before):
    /// what ``UploadConfiguration/haltAfterDeadLetters`` is held against. A delivery sets it back to 0.
    public func deadLettersInARow() throws -> Int {
        try read { db in Int(try Self.state(db, .deadLettersInARow)) }
    }

    /// The run of dead letters as it stands for uploads to `destination` (a fingerprint of the collector
    /// URL and wire format): ``deadLettersInARow()``, set back to 0 first when the run was counted
    /// against another destination (a new one is judged afresh, also when it changed between two runs
    /// of the agent), and the seq of the event held back by the last halt, if any.
    public func deadLetterRun(destination: UInt64) throws -> (inARow: Int, heldSeq: UInt64?) {
        try write { db in
            let fingerprint = Int64(bitPattern: destination)
            if try Self.state(db, .deadLettersDestination) != fingerprint {
                try Self.setState(db, .deadLettersInARow, 0)
                try Self.setState(db, .haltedSeq, 0)
                try Self.setState(db, .deadLettersDestination, fingerprint)
            }
            let held = try Self.state(db, .haltedSeq)
            return (Int(try Self.state(db, .deadLettersInARow)), held > 0 ? UInt64(held) : nil)
        }
    }

    /// Records that uploads halted holding back the refused event `seq`: sent alone again after the
    /// halt, by this run or a later one, it is dead-lettered if refused once more.
    public func holdAfterHalt(seq: UInt64) throws {
        try write { db in try Self.setState(db, .haltedSeq, Int64(seq)) }
    }

    /// How many dead letters the outbox holds.
    public func deadLetterCount() throws -> Int {
        try read { db in try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM dead_letters") ?? 0 }
    }

    /// Dead letters, oldest first.
    public func deadLetters(limit: Int = 1000) throws -> [DeadLetter] {
        try read { db in
            try GRDB.Row.fetchAll(db, sql: "SELECT * FROM dead_letters ORDER BY id LIMIT ?", arguments: [limit]).map { r in
                DeadLetter(
                    id: r["id"], seq: UInt64(r["seq"] as Int64), eventID: r["event_id"], producer: r["producer"],
                    status: r["status"], reason: r["reason"], batchID: r["batch_id"], deadAtMillis: r["dead_at_ms"],
                    body: String(decoding: (r["body"] as Data), as: UTF8.self))
            }
        }
    }

    /// Dead letter ids given to ``replayDeadLetters(ids:)`` that name no replayable dead letter (none
    /// with that id, or a corrupt store record, which has no event to send), or given to
    /// ``discardDeadLetters(ids:)`` that name none. Nothing was replayed or discarded.
    public struct UnknownDeadLetters: TributaryError {
        public var code: DeadLetterCode { .unknownDeadLetters }
        public var ids: [Int64]
        /// Whether a replay (else a discard) was refused.
        public var replaying = true
        public var cause: (any Error & Sendable)? { nil }
        public var location: SourceLocation

        init(ids: [Int64], replaying: Bool = true, file: String = #fileID, line: Int = #line) {
            self.ids = ids
            self.replaying = replaying
            location = SourceLocation(file: file, line: line)
        }

        public var message: String { description }
        public var description: String {
            let list = ids.map(String.init).joined(separator: ", ")
            return replaying
                ? "No replayable dead letter with id \(list) (`tributary dead-letters` lists them; a corrupt store "
                    + "record cannot be replayed); nothing was replayed."
                : "No dead letter with id \(list) (`tributary dead-letters` lists them); nothing was discarded."
        }
    }

    /// Moves dead letters (all, or those with the given ids) back into the outbox for another upload.
    /// Corrupt store records cannot be replayed and stay. Returns how many were moved.
    ///
    /// With `ids`, every id is checked first: when one of them names no replayable dead letter, throws
    /// ``UnknownDeadLetters`` and moves none. They then move ``replayChunk`` per transaction: a failure
    /// part way (a full disk) throws ``ReplayInterrupted``, saying how many moved before it.
    @discardableResult
    public func replayDeadLetters(ids: [Int64]? = nil) throws -> Int {
        // Which ones, decided first (all or nothing with `ids`), then moved a chunk per transaction: a
        // running agent waits for the outbox's writer one chunk at a time, never for the whole replay
        // (its busy timeout would stop it), and the bodies in memory are one chunk's. Oldest first, in
        // the order they were refused (`id`; seqs of two stores, or handed out again, do not order them).
        let chosen = try read { db in
            try Self.chosenDeadLetters(db, columns: "id", filter: "event_id IS NOT NULL", ids: ids, replaying: true)
                .map { $0["id"] as Int64 }
        }
        var moved = 0
        for start in stride(from: 0, to: chosen.count, by: Self.replayChunk) {
            let chunk = Array(chosen[start..<min(start + Self.replayChunk, chosen.count)])
            moved += try ReplayInterrupted.saying(moved: moved, of: chosen.count) { try write { db in
                let select = try db.cachedStatement(sql: "SELECT * FROM dead_letters WHERE id = ?")
                // Appended after every id ever handed out (``Tables/lastID(_:)``), as the drain appends.
                let tables = try Tables.read(db)
                var lastID = try tables.lastID(db)
                let insert = try db.cachedStatement(sql: Self.insertSQL[tables.newer])
                let delete = try db.cachedStatement(sql: "DELETE FROM dead_letters WHERE id = ?")
                var moved = 0
                var bytes = 0
                for id in chunk {
                    // Gone meanwhile (discarded, or replayed by another command): nothing to move.
                    guard let r = try GRDB.Row.fetchOne(select, arguments: [id]) else { continue }
                    lastID += 1
                    try insert.execute(arguments: [
                        lastID, r["seq"], r["event_id"], r["producer"], r["producer_kind"], r["producer_seq"],
                        r["wall_ms"], r["boot_ns"], r["boot_id"], r["body"],
                    ])
                    try delete.execute(arguments: [id])
                    bytes += (r["body"] as Data).count
                    moved += 1
                }
                if moved > 0 { try Self.setState(db, .lastID, lastID) }
                try Self.bump(db, .pendingCount, moved)
                try Self.bump(db, .pendingBytes, bytes)
                return moved
            } }
        }
        return moved
    }

    /// A replay that failed part way: `moved` of `total` dead letters are back in the outbox (whole
    /// transactions of them), the rest still dead letters.
    public struct ReplayInterrupted: TributaryError {
        public var code: DeadLetterCode { .replayInterrupted }
        public var moved: Int
        public var total: Int
        public var reason: String
        public var cause: (any Error & Sendable)?
        public var location: SourceLocation

        init(
            moved: Int, total: Int, reason: String, cause: (any Error & Sendable)? = nil, file: String = #fileID,
            line: Int = #line
        ) {
            (self.moved, self.total, self.reason, self.cause) = (moved, total, reason, cause)
            location = SourceLocation(file: file, line: line)
        }

        public var message: String { description }
        public var description: String {
            "replayed \(moved) of \(total) dead letter(s) before the failure (the rest are still dead letters): \(reason)"
        }

        /// `body`, its failure thrown as a replay interrupted after `moved` of `total`.
        static func saying<T>(moved: Int, of total: Int, _ body: () throws -> T) throws -> T {
            do { return try body() } catch {
                throw ReplayInterrupted(moved: moved, total: total, reason: "\(error)", cause: error)
            }
        }
    }

    /// Dead letters moved back per transaction by ``replayDeadLetters(ids:)``.
    static let replayChunk = 200

    /// Deletes dead letters (all, or those with the given ids) for good, corrupt records too, and
    /// frees their room in the outbox quota. Returns how many were deleted. With `ids`, all or
    /// nothing: when one of them names no dead letter, throws ``UnknownDeadLetters`` and deletes none.
    @discardableResult
    public func discardDeadLetters(ids: [Int64]? = nil) throws -> Int {
        try write { db in
            let rows = try Self.chosenDeadLetters(db, columns: "id", filter: "1", ids: ids, replaying: false)
            let delete = try db.cachedStatement(sql: "DELETE FROM dead_letters WHERE id = ?")
            for row in rows { try delete.execute(arguments: [row["id"] as Int64]) }
            return rows.count
        }
    }

    /// The dead letters (`columns` of each, oldest first) that `filter` admits, all or those `ids`
    /// names; with `ids`, all or nothing: one that names none of them throws ``UnknownDeadLetters``.
    private static func chosenDeadLetters(
        _ db: Database, columns: String, filter: String, ids: [Int64]?, replaying: Bool
    ) throws -> [GRDB.Row] {
        var sql = "SELECT \(columns) FROM dead_letters WHERE \(filter)"
        var arguments: StatementArguments = []
        if let ids {
            sql += " AND id IN (\(ids.map { _ in "?" }.joined(separator: ",")))"
            arguments = StatementArguments(ids)
        }
        let rows = try GRDB.Row.fetchAll(db, sql: sql + " ORDER BY id", arguments: arguments)
        if let ids {
            let unknown = Array(Set(ids).subtracting(rows.map { $0["id"] as Int64 })).sorted()
            guard unknown.isEmpty else { throw UnknownDeadLetters(ids: unknown, replaying: replaying) }
        }
        return rows
    }
}
