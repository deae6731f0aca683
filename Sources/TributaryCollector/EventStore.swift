import Foundation
import GRDB
import TributarySQLite
import TributaryWire

/// `text`'s NUL-terminated UTF-8, or a nil pointer (which binds as NULL), for `body`.
private func withCString<Result>(
    _ text: String?,
    _ body: (UnsafePointer<CChar>?) throws -> Result
) rethrows -> Result {
    guard let text else { return try body(nil) }
    return try text.withCString(body)
}

/// The collector's SQLite database: unique events in arrival order, accepted batches, per-producer
/// order state and counters.
///
/// Every accepted batch is one write transaction (dedup, order checks, batch record, counters), so a
/// batch is stored whole or not at all. Files use WAL with `synchronous=FULL`: once a batch is
/// acknowledged (or its acknowledgement deliberately lost) it survives a crash of the collector.
final class EventStore: Sendable {
    private let writer: any DatabaseWriter

    /// Opens (creating if needed) the database at `path`, or an in-memory one when `path` is nil.
    init(path: String?) throws(CollectorError) {
        var configuration = Configuration()
        configuration.label = "tributary.collector"
        configuration.prepareDatabase { db in
            // sqlite: in WAL mode, only synchronous=FULL makes a committed transaction durable.
            try db.execute(sql: "PRAGMA synchronous = FULL")
            // As the agent's outbox: whole batches of rows per transaction, so fewer, larger pages
            // (on a new file only; about 8 % less collector CPU in the pipeline benchmark).
            try db.execute(sql: "PRAGMA page_size = 16384")
        }
        if let path { try Self.refuseForeignDatabase(at: path) }
        do {
            if let path {
                let pool = try DatabasePool(path: path, configuration: configuration)
                // DatabasePool sets synchronous=NORMAL while switching to WAL, after prepareDatabase:
                // set FULL again on the writer connection.
                try pool.writeWithoutTransaction { db in try db.execute(sql: "PRAGMA synchronous = FULL") }
                writer = pool
            } else {
                writer = try DatabaseQueue(configuration: configuration)
            }
            try Self.migrator.migrate(writer)
        } catch {
            let place = path.map { "at \($0)" } ?? "in memory"
            throw CollectorError(
                .database,
                "Cannot open the collector database \(place); check that its directory exists and is writable.",
                cause: error
            )
        }
    }

    /// Throws if `path` is another program's SQLite database (an agent's outbox, say): the migrator
    /// would take its `v1` for this one's and every upload would then fail. Read through a read-only
    /// connection: nothing is written. A file it cannot read so is left to the open, which says why; one
    /// another process keeps locked is refused (it could not be checked).
    private static func refuseForeignDatabase(at path: String) throws(CollectorError) {
        let tables: [String]
        switch ForeignDatabaseCheck.look(at: path) {
        case .nothing, .unreadable: return
        case .locked: throw CollectorError(.database, ForeignDatabaseCheck.lockedMessage(path, what: "a collector's database"))
        case .tables(let found): tables = found
        }
        guard !tables.isEmpty, !(tables.contains("events") && tables.contains("batches")) else { return }
        throw CollectorError(
            .database,
            "\(path) is an SQLite database but not a collector's (its \(tables.count) tables include no events and batches); "
                + "nothing was changed. Give --db a file of its own.")
    }

    private static var migrator: DatabaseMigrator {
        var migrator = DatabaseMigrator()
        migrator.registerMigration("v1") { db in
            try db.execute(
                sql: """
                    -- One row per accepted batch (ingest request whose events were committed).
                    CREATE TABLE batches (
                        id INTEGER PRIMARY KEY,
                        idempotency_key TEXT,
                        format TEXT NOT NULL,
                        events INTEGER NOT NULL,
                        accepted INTEGER NOT NULL DEFAULT 0,
                        duplicates INTEGER NOT NULL DEFAULT 0,
                        lost_ack INTEGER NOT NULL DEFAULT 0,
                        received_at REAL NOT NULL
                    );
                    CREATE INDEX batches_by_key ON batches(idempotency_key);
                    -- Unique events; arrival is the 1-based arrival order.
                    CREATE TABLE events (
                        arrival INTEGER PRIMARY KEY,
                        event_id TEXT NOT NULL UNIQUE,
                        type TEXT NOT NULL,
                        event TEXT,
                        seq INTEGER,
                        producer TEXT,
                        producer_seq INTEGER,
                        batch INTEGER NOT NULL REFERENCES batches(id),
                        batch_id TEXT,
                        body TEXT NOT NULL
                    );
                    -- Order state and unique counts per producer.
                    CREATE TABLE producers (
                        producer TEXT PRIMARY KEY,
                        unique_events INTEGER NOT NULL,
                        order_violations INTEGER NOT NULL,
                        producer_seq_high_water INTEGER
                    );
                    -- Monotonic counters served by /stats (requests, batches, fault.<kind>, ...).
                    CREATE TABLE counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
                    -- Highest values seen so far (seq).
                    CREATE TABLE high_water (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
                    """
            )
        }
        migrator.registerMigration("v2: event text in the batch's payload") { db in
            // A batch keeps its events' text as it came, compressed if it came so, and each event its
            // range of it: an event's text was a row of its own, about 0.8 KiB each, and the in-memory
            // database's growth (new pages, zeroed by the kernel) was a fifth of the collector's CPU in
            // the pipeline benchmark (docs/performance.md). Events stored before keep their `body`.
            // SQLite cannot drop a NOT NULL constraint, so `events` is rebuilt, arrivals unchanged.
            try db.execute(
                sql: """
                    ALTER TABLE batches ADD COLUMN payload BLOB;
                    ALTER TABLE batches ADD COLUMN payload_encoding TEXT;
                    CREATE TABLE events_v2 (
                        arrival INTEGER PRIMARY KEY,
                        event_id TEXT NOT NULL UNIQUE,
                        type TEXT NOT NULL,
                        event TEXT,
                        seq INTEGER,
                        producer TEXT,
                        producer_seq INTEGER,
                        batch INTEGER NOT NULL REFERENCES batches(id),
                        batch_id TEXT,
                        body TEXT,
                        body_start INTEGER,
                        body_length INTEGER,
                        CHECK ((body IS NOT NULL AND body_start IS NULL AND body_length IS NULL)
                            OR (body IS NULL AND body_start IS NOT NULL AND body_length IS NOT NULL))
                    );
                    INSERT INTO events_v2
                        (arrival, event_id, type, event, seq, producer, producer_seq, batch, batch_id, body)
                        SELECT arrival, event_id, type, event, seq, producer, producer_seq, batch, batch_id, body
                        FROM events;
                    DROP TABLE events;
                    ALTER TABLE events_v2 RENAME TO events;
                    """
            )
        }
        migrator.registerMigration("v3: user profiles") { db in try db.execute(sql: ProfileTable.schema) }
        return migrator
    }

    // MARK: Writing

    /// Counts an ingest request that was not accepted, and the fault that caused it, if any.
    func recordRejected(fault: FaultKind?) async throws(CollectorError) {
        try await write { db in
            try Self.bump(Counter.requests, in: db)
            try Self.bump(Counter.rejectedBatches, in: db)
            if let fault { try Self.bump(fault.counterName, in: db) }
        }
    }

    /// Stores a batch in one transaction: dedup on `event_id`, order checks among the unique events,
    /// the batch record and the counters.
    func accept(_ batch: IncomingBatch, lostAck: Bool) async throws(CollectorError) -> BatchReceipt {
        try await write { db in try Self.accept(batch, lostAck: lostAck, in: db) }
    }

    private static func accept(_ batch: IncomingBatch, lostAck: Bool, in db: Database) throws -> BatchReceipt {
        let repeated =
            try batch.idempotencyKey.map { key in
                try Bool.fetchOne(
                    db,
                    sql: "SELECT EXISTS (SELECT 1 FROM batches WHERE idempotency_key = ?)",
                    arguments: [key]
                )
                    ?? false
            } ?? false
        try db.execute(
            sql: "INSERT INTO batches (idempotency_key, format, events, lost_ack, received_at) VALUES (?, ?, ?, ?, ?)",
            arguments: [batch.idempotencyKey, batch.format, batch.events.count, lostAck, Date().timeIntervalSince1970]
        )
        let batchRow = db.lastInsertedRowID

        var receipt = BatchReceipt()
        // Per-producer order state, read once per batch and written back once (not per event).
        var producers: [ExactString: ProducerOrder] = [:]
        var seqHighWater = try Int64.fetchOne(db, sql: "SELECT value FROM high_water WHERE name = 'seq'")
        let insert = try db.cachedStatement(
            sql: """
                INSERT INTO events (event_id, type, event, seq, producer, producer_seq, batch, batch_id, body_start,
                    body_length)
                VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (event_id) DO NOTHING
                """
        )
        // The batch's columns are bound once; SQLITE_STATIC: the key's C string lives until the loop
        // ends, and the bindings are cleared before it goes.
        let statement = RawStatement(insert)
        statement.reset()
        statement.bind(7, batchRow)
        try withCString(batch.idempotencyKey) { key in
            statement.bindCString(8, key)
            defer { statement.clearBindings() }
            for event in batch.events {
                guard try Self.insert(event, with: insert, in: db) else {
                    receipt.duplicates += 1
                    continue
                }
                receipt.accepted += 1
                if event.hybridH5 { receipt.hybridH5 += 1 }
                if let profile = event.profile {
                    try ProfileTable.apply(profile, in: db)
                    try bump(profile.operation.counterName, in: db)
                }
                if let seq = event.seq {
                    if let highWater = seqHighWater, seq <= highWater { receipt.seqViolations += 1 }
                    seqHighWater = max(seqHighWater ?? seq, seq)
                }
                if let producer = event.producer {
                    let key = ExactString(producer)
                    var order = try producers[key] ?? ProducerOrder(producer, in: db)
                    order.count(producerSeq: event.producerSeq)
                    producers[key] = order
                }
            }
        }
        for order in producers.values { try order.save(in: db) }
        if let seqHighWater {
            try db.execute(
                sql: "INSERT OR REPLACE INTO high_water (name, value) VALUES ('seq', ?)",
                arguments: [seqHighWater]
            )
        }
        // The payload only when it holds a stored event's text (a batch sent again holds none).
        let payload = receipt.accepted > 0 ? Data(batch.payload) : nil
        try db.execute(
            sql: "UPDATE batches SET accepted = ?, duplicates = ?, payload = ?, payload_encoding = ? WHERE id = ?",
            arguments: [
                receipt.accepted, receipt.duplicates, payload, payload == nil ? nil : batch.payloadEncoding, batchRow,
            ]
        )
        try bump(Counter.requests, in: db)
        try bump(Counter.batches, in: db)
        try bump(Counter.received, by: batch.events.count, in: db)
        try bump(Counter.unique, by: receipt.accepted, in: db)
        try bump(Counter.duplicates, by: receipt.duplicates, in: db)
        try bump(Counter.seqViolations, by: receipt.seqViolations, in: db)
        try bump(Counter.hybridH5, by: receipt.hybridH5, in: db)
        if repeated { try bump(Counter.repeatedBatches, in: db) }
        if lostAck { try bump(FaultKind.lostAck.counterName, in: db) }
        return receipt
    }

    /// Runs the cached `INSERT … ON CONFLICT (event_id) DO NOTHING` for one event (the batch's columns
    /// 7 and 8 already bound); whether it was new. The event's text is stored as its range of the
    /// batch's payload.
    ///
    /// Binds through SQLite's C API (`RawStatement`) instead of GRDB's `StatementArguments` (an array of
    /// `DatabaseValue`s per event). Strings are bound as GRDB binds them (NUL-terminated C strings;
    /// nil is NULL), with SQLITE_STATIC (no copy by SQLite): they outlive the step, and the statement
    /// is reset before they go.
    private static func insert(
        _ event: IncomingEvent,
        with statement: Statement,
        in db: Database
    ) throws -> Bool {
        let raw = RawStatement(statement)
        raw.reset()
        raw.bind(4, event.seq)
        raw.bind(6, event.producerSeq)
        raw.bind(9, Int64(event.text.lowerBound))
        raw.bind(10, Int64(event.text.count))
        let rc = event.eventID.withCString { eventID in
            withCString(event.type) { type in
                withCString(event.name) { name in
                    withCString(event.producer) { producer in
                        raw.bindCString(1, eventID)
                        raw.bindCString(2, type)
                        raw.bindCString(3, name)
                        raw.bindCString(5, producer)
                        defer { raw.reset() }
                        return raw.step()
                    }
                }
            }
        }
        if rc != RawStatement.done { throw raw.error(rc, in: db, sql: statement.sql) }
        return RawStatement.changes(in: db) == 1
    }

    /// A string compared and hashed by its UTF-8 bytes, as SQLite compares the `producer` column:
    /// Swift's `String` equality is canonical equivalence, which would take "pé" precomposed and
    /// decomposed, two producers in the table, for one.
    struct ExactString: Hashable {
        let value: String
        init(_ value: String) { self.value = value }
        static func == (a: Self, b: Self) -> Bool { a.value.utf8.elementsEqual(b.value.utf8) }
        func hash(into hasher: inout Hasher) {
            var value = value
            value.withUTF8 { hasher.combine(bytes: UnsafeRawBufferPointer($0)) }
        }
    }

    /// One producer's unique events and `producer_seq` order within a batch, on top of its stored row.
    private struct ProducerOrder {
        let producer: String
        var highWater: Int64?
        var uniqueEvents = 0
        var violations = 0

        /// The stored state of `producer` (none yet: no high water).
        init(_ producer: String, in db: Database) throws {
            self.producer = producer
            let row = try Row.fetchOne(
                db.cachedStatement(sql: "SELECT producer_seq_high_water FROM producers WHERE producer = ?"),
                arguments: [producer]
            )
            highWater = row?["producer_seq_high_water"]
        }

        /// Counts a unique event; a `producer_seq` not above every earlier one is an order violation.
        mutating func count(producerSeq: Int64?) {
            uniqueEvents += 1
            guard let producerSeq else { return }
            if let highWater, producerSeq <= highWater { violations += 1 }
            highWater = max(highWater ?? producerSeq, producerSeq)
        }

        func save(in db: Database) throws {
            try db.cachedStatement(
                sql: """
                    INSERT INTO producers (producer, unique_events, order_violations, producer_seq_high_water)
                    VALUES (?, ?, ?, ?)
                    ON CONFLICT (producer) DO UPDATE SET
                        unique_events = unique_events + excluded.unique_events,
                        order_violations = order_violations + excluded.order_violations,
                        producer_seq_high_water = excluded.producer_seq_high_water
                    """
            ).execute(arguments: [producer, uniqueEvents, violations, highWater])
        }
    }

    private static func bump(_ name: String, by amount: Int = 1, in db: Database) throws {
        guard amount != 0 else { return }
        try db.cachedStatement(
            sql: """
                INSERT INTO counters (name, value) VALUES (?, ?)
                ON CONFLICT (name) DO UPDATE SET value = value + excluded.value
                """
        ).execute(arguments: [name, amount])
    }

    // MARK: Reading

    /// The counters and per-producer figures served by `/stats`.
    func stats() async throws(CollectorError) -> CollectorStats {
        try await read { db in
            var counters: [String: Int] = [:]
            for row in try Row.fetchAll(db, sql: "SELECT name, value FROM counters") {
                counters[row["name"]] = row["value"]
            }
            var stats = CollectorStats(
                requests: counters[Counter.requests] ?? 0,
                batches: counters[Counter.batches] ?? 0,
                rejectedBatches: counters[Counter.rejectedBatches] ?? 0,
                repeatedBatches: counters[Counter.repeatedBatches] ?? 0,
                received: counters[Counter.received] ?? 0,
                unique: counters[Counter.unique] ?? 0,
                duplicates: counters[Counter.duplicates] ?? 0,
                seqViolations: counters[Counter.seqViolations] ?? 0,
                hybridH5: counters[Counter.hybridH5] ?? 0,
                faults: FaultCounts(counters: counters)
            )
            stats.profiles = try ProfileTable.count(in: db)
            for operation in ProfileUpdate.Operation.allCases {
                if let records = counters[operation.counterName] { stats.profileRecords[operation.rawValue] = records }
            }
            for row in try Row.fetchAll(db, sql: "SELECT producer, unique_events, order_violations FROM producers") {
                // Two producers whose ids differ only in Unicode normalization are one key of a Swift
                // dictionary (and of most JSON readers): their counts add up rather than one hiding the other.
                let producer: String = row["producer"]
                stats.producers[producer, default: 0] += row["unique_events"] as Int
                let violations: Int = row["order_violations"]
                if violations > 0 { stats.orderViolations[producer, default: 0] += violations }
            }
            return stats
        }
    }

    /// Unique events with an arrival index above `after`, in arrival order, at most `limit` (nil: all).
    func events(after: Int64, limit: Int?) async throws(CollectorError) -> [ReceivedEvent] {
        try await read { db in
            var texts = EventTexts()
            return try Row.fetchAll(
                db,
                sql: """
                    SELECT event_id, type, event, seq, producer, producer_seq, batch_id, \(EventTexts.columns)
                    FROM events WHERE arrival > ? ORDER BY arrival LIMIT ?
                    """,
                arguments: [after, limit ?? -1]
            ).map { row in
                let seq: Int64? = row["seq"]
                let producerSeq: Int64? = row["producer_seq"]
                return ReceivedEvent(
                    arrival: row["arrival"],
                    eventID: row["event_id"],
                    type: row["type"],
                    event: row["event"],
                    seq: seq.map(UInt64.init),
                    producer: row["producer"],
                    producerSeq: producerSeq.map(UInt64.init),
                    batchID: row["batch_id"],
                    json: try texts.text(of: row, in: db)
                )
            }
        }
    }

    /// A user's profile as `{"distinct_id":…,"properties":{…}}` (for `GET /profile`), nil when none.
    func profileJSON(of distinctID: String) async throws(CollectorError) -> String? {
        try await read { db in try ProfileTable.profileJSON(of: distinctID, in: db) }
    }

    /// The stored JSON text of unique events after `after`, as one JSON array (for `GET /events`).
    func eventsJSONArray(after: Int64, limit: Int?) async throws(CollectorError) -> String {
        try await read { db in
            var texts = EventTexts()
            let bodies = try Row.fetchAll(
                db,
                sql: "SELECT \(EventTexts.columns) FROM events WHERE arrival > ? ORDER BY arrival LIMIT ?",
                arguments: [after, limit ?? -1]
            ).map { row in try texts.text(of: row, in: db) }
            return "[" + bodies.joined(separator: ",") + "]"
        }
    }

    /// Stored events' text: an event's own `body` (stored before schema v2), or its range of its batch's
    /// payload, which is decoded once per batch (the batches of one read, in arrival order, one after
    /// another).
    private struct EventTexts {
        /// The columns of `events` that ``text(of:in:)`` reads.
        static let columns = "arrival, body, batch, body_start, body_length"

        private var batch: Int64?
        private var json: [UInt8] = []

        mutating func text(of row: Row, in db: Database) throws -> String {
            if let body = row["body"] as String? { return body }
            let arrival: Int64 = row["arrival"]
            let batch: Int64 = row["batch"]
            if batch != self.batch {
                let stored = try Row.fetchOne(
                    db.cachedStatement(sql: "SELECT payload, payload_encoding FROM batches WHERE id = ?"),
                    arguments: [batch])
                guard let payload = stored?["payload"] as Data? else {
                    throw StoredTextError(arrival: arrival, batch: batch, problem: "that batch kept no payload")
                }
                do {
                    json = try Gzip.undoContentEncoding(stored?["payload_encoding"], of: [UInt8](payload), limit: .max)
                } catch {
                    throw StoredTextError(
                        arrival: arrival, batch: batch, problem: "its payload cannot be decoded: \(error)")
                }
                self.batch = batch
            }
            guard let start = row["body_start"] as Int?, let length = row["body_length"] as Int?,
                start >= 0, length >= 0, start + length <= json.count
            else {
                throw StoredTextError(arrival: arrival, batch: batch, problem: "its range is not within the payload")
            }
            return String(decoding: json[start..<(start + length)], as: UTF8.self)
        }
    }

    /// An event whose text cannot be read back: the database was changed by something other than the
    /// collector (which writes an event's range and its batch's payload in one transaction).
    struct StoredTextError: Error, CustomStringConvertible {
        var arrival: Int64
        var batch: Int64
        var problem: String
        var description: String {
            "the text of event \(arrival) (batch \(batch)) is not in the database: \(problem); the database was "
                + "changed outside the collector"
        }
    }

    // MARK: Helpers

    private func write<T: Sendable>(
        _ updates: @escaping @Sendable (Database) throws -> T
    ) async throws(CollectorError) -> T {
        do {
            return try await writer.write(updates)
        } catch {
            throw CollectorError(.database, "Writing to the collector database failed.", cause: error)
        }
    }

    private func read<T: Sendable>(
        _ value: @escaping @Sendable (Database) throws -> T
    ) async throws(CollectorError) -> T {
        do {
            return try await writer.read(value)
        } catch {
            throw CollectorError(.database, "Reading the collector database failed.", cause: error)
        }
    }
}

/// An ingest batch ready to store.
struct IncomingBatch: Sendable {
    /// The request's `Idempotency-Key` header.
    var idempotencyKey: String?
    /// The wire format it came in (`sensors`, `ndjson`).
    var format: String
    var events: [IncomingEvent]
    /// The bytes the events' text ranges point into (``DecodedBody/json``) as they came, in
    /// `payloadEncoding` (``DecodedBody/payload``): what is stored.
    var payload: [UInt8]
    var payloadEncoding: String?
}

/// What storing a batch did.
struct BatchReceipt: Sendable, Equatable {
    /// Events stored for the first time.
    var accepted = 0
    /// Events whose `event_id` was already stored (earlier, or earlier in the same batch).
    var duplicates = 0
    /// Unique events whose `seq` was not above every earlier one.
    var seqViolations = 0
    /// Unique events marked `_hybrid_h5: true`.
    var hybridH5 = 0
}

/// Names of rows in the `counters` table.
enum Counter {
    static let requests = "requests"
    static let batches = "batches"
    static let rejectedBatches = "rejected_batches"
    static let repeatedBatches = "repeated_batches"
    static let received = "received"
    static let unique = "unique"
    static let duplicates = "duplicates"
    static let seqViolations = "seq_violations"
    static let hybridH5 = "hybrid_h5"
}
