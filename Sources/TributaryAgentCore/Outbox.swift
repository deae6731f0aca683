import Foundation
import GRDB
import GRDBSQLite
import TributaryStore

/// SQLite's `SQLITE_STATIC` (nil): "the value stays valid and unchanged until rebound or cleared".
private let sqliteStatic: sqlite3_destructor_type? = nil

/// The agent's private SQLite outbox: events drained from the shared store, waiting for upload.
///
/// WAL mode with `synchronous=FULL` (sqlite.org: in WAL mode, FULL syncs the WAL on every commit, so
/// a committed transaction survives power loss). Rows are uploaded in `id` order, which is the
/// store's global sequence order. See `docs/outbox.md` for the schema.
public final class Outbox: Sendable {
    /// One event waiting for upload.
    public struct Row: Sendable, Hashable {
        /// Upload order: above every id handed out before it (``Tables/lastID(_:)``).
        public var id: Int64
        /// Global store sequence number.
        public var seq: UInt64
        public var eventID: String
        public var producer: String
        public var producerKind: ProducerKind
        public var producerSeq: UInt64
        /// Wall-clock time at trigger (ms) and `CLOCK_BOOTTIME` (ns) with its boot id.
        public var wallMillis: Int64
        public var bootNanos: UInt64
        public var bootID: BootID
        /// The event JSON, enriched, with `_tributary`; `_flush_time` is added at upload.
        public var body: [UInt8]
        /// The batch this row was last sent in, stable across retries.
        public var batchID: String?
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

    /// Where the outbox lives.
    public let path: String
    let writer: DatabasePool
    /// How many ids' worth the newer table holds before the drain turns to the other one, once that one
    /// is empty (``Tables``).
    let turnRows: Int64

    /// ``turnRows`` unless a test sets another: about 7 MiB of 0.85 KiB events, a tenth of a second of the
    /// pipeline benchmark.
    static let defaultTurnRows: Int64 = 8_192

    /// Creates the directory an outbox at `path` lives in (mode 0700: the outbox is the agent's alone).
    static func createDirectory(of path: String) throws {
        let directory = (path as NSString).deletingLastPathComponent
        // A bare file name lives in the working directory, which exists ("" is no path to create).
        guard !directory.isEmpty else { return }
        try FileManager.default.createDirectory(
            atPath: directory, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
    }

    /// Opens (creating and migrating) the outbox at `path`. `whileMigrating`, when the outbox needs a
    /// migration (a new outbox too), runs around it: a migration that rebuilds a table takes time in
    /// proportion to what the outbox holds.
    public convenience init(path: String, whileMigrating: ((() throws -> Void) throws -> Void)? = nil) throws {
        try self.init(path: path, turnRows: Self.defaultTurnRows, whileMigrating: whileMigrating)
    }

    /// ``init(path:whileMigrating:)`` with the tables turning every `turnRows` ids (tests).
    init(path: String, turnRows: Int64, whileMigrating: ((() throws -> Void) throws -> Void)? = nil) throws {
        precondition(turnRows > 0, "turnRows must be positive")
        self.path = path
        self.turnRows = turnRows
        try Self.createDirectory(of: path)
        var config = Configuration()
        config.busyMode = .timeout(Self.busyTimeout)
        config.prepareDatabase { db in
            // sqlite.org/pragma.html#pragma_synchronous: "FULL ... ensures that an operating system
            // crash or power failure will not corrupt the database" and, in WAL mode, that every
            // committed transaction is durable.
            try db.execute(sql: "PRAGMA synchronous = FULL")
            // 16 KiB pages instead of 4 KiB: a quarter of the WAL frames (two writes each), B-tree
            // pages and page reads per drained or acknowledged event (agent CPU per event -17 % in
            // the pipeline benchmark; 64 KiB measured about the same). Effective only on a new file,
            // before the pool switches it to WAL: an existing outbox keeps its page size.
            try db.execute(sql: "PRAGMA page_size = 16384")
            // Debian's SQLite is built with SQLITE_SECURE_DELETE, which zeroes every freed page and so
            // writes it into the WAL: emptying a delivered table (``Tables``) would then cost as many
            // page writes as deleting its rows one by one. FAST zeroes deleted content only on pages
            // written anyway: the pages of an emptied table keep their bytes until the drain reuses
            // them (the outbox is the agent's own file, 0600 in a 0700 directory).
            try db.execute(sql: "PRAGMA secure_delete = FAST")
        }
        try Self.refuseForeignDatabase(at: path)
        writer = try DatabasePool(path: path, configuration: config)
        // DatabasePool sets `synchronous = NORMAL` while it switches to WAL, after prepareDatabase ran:
        // set FULL again on the writer connection, the only one that commits.
        try writer.writeWithoutTransaction { db in try db.execute(sql: "PRAGMA synchronous = FULL") }
        // No automatic checkpoints: SQLite ignores an I/O error in one (an fsync of the database file
        // that failed would be retried by the next). The agent checkpoints explicitly (checkpoint()),
        // where the error is seen and stops it.
        try writer.writeWithoutTransaction { db in try db.execute(sql: "PRAGMA wal_autocheckpoint = 0") }
        let migrator = Self.migrator
        if try !writer.read({ db in try migrator.hasCompletedMigrations(db) }) {
            // A migration rebuilds tables: its WAL is as large as they are. Emptied and cut at once.
            let migrate = { [self] in
                try migrator.migrate(writer)
                try checkpoint()
            }
            if let whileMigrating { try whileMigrating(migrate) } else { try migrate() }
        }
    }

    /// Throws if `path` is another program's SQLite database (a collector's, an app's): given as an
    /// outbox, it was switched to WAL and migrated into an outbox beside its own tables, or failed half
    /// way. Read through a read-only connection: nothing is written. A file it cannot read so is left to
    /// the outbox's own open, which says why.
    private static func refuseForeignDatabase(at path: String) throws(AgentError) {
        var info = stat()
        guard stat(path, &info) == 0, info.st_size > 0 else { return }
        var configuration = Configuration()
        configuration.readonly = true
        let tables: [String]
        do {
            tables = try DatabaseQueue(path: path, configuration: configuration).read { db in
                try String.fetchAll(
                    db,
                    sql: "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' "
                        + "AND name != 'grdb_migrations' ORDER BY name")
            }
        } catch {
            return
        }
        guard !tables.isEmpty, !tables.contains("agent_state") else { return }
        throw AgentError(
            .configuration,
            "\(path) is an SQLite database but not a Tributary outbox (it has the tables "
                + tables.prefix(5).joined(separator: ", ") + (tables.count > 5 ? ", …" : "")
                + "); nothing was changed. Give --outbox a file of its own (the default is per group).")
    }

    /// The size of the outbox's WAL file (0 when there is none). A checkpoint that empties the WAL
    /// leaves the file at its size, for the next transactions to write over: one grown by a burst or
    /// a large transaction (a replay of many dead letters) keeps its disk space until a `TRUNCATE`
    /// checkpoint (``checkpoint(truncate:patience:)``), which the agent runs once it is idle.
    public var walFileBytes: Int {
        var info = stat()
        return stat(path + "-wal", &info) == 0 ? Int(info.st_size) : 0
    }

    /// The writer connection's `PRAGMA synchronous` (2 = FULL).
    public func synchronousMode() throws -> Int {
        try writer.writeWithoutTransaction { db in try Int.fetchOne(db, sql: "PRAGMA synchronous") ?? -1 }
    }

    private static var migrator: DatabaseMigrator {
        var m = DatabaseMigrator()
        m.registerMigration("v1") { db in
            try db.execute(sql: """
                CREATE TABLE outbox (
                    id INTEGER PRIMARY KEY,
                    seq INTEGER NOT NULL UNIQUE,
                    event_id TEXT NOT NULL UNIQUE,
                    producer TEXT NOT NULL,
                    producer_kind INTEGER NOT NULL,
                    producer_seq INTEGER NOT NULL,
                    wall_ms INTEGER NOT NULL,
                    boot_ns INTEGER NOT NULL,
                    boot_id BLOB NOT NULL,
                    body BLOB NOT NULL,
                    batch_id TEXT
                );
                CREATE INDEX outbox_batch ON outbox(batch_id) WHERE batch_id IS NOT NULL;
                CREATE TABLE dead_letters (
                    id INTEGER PRIMARY KEY,
                    seq INTEGER NOT NULL,
                    event_id TEXT,
                    producer TEXT,
                    producer_kind INTEGER,
                    producer_seq INTEGER,
                    wall_ms INTEGER,
                    boot_ns INTEGER,
                    boot_id BLOB,
                    status INTEGER NOT NULL,
                    reason TEXT NOT NULL,
                    batch_id TEXT,
                    dead_at_ms INTEGER NOT NULL,
                    body BLOB NOT NULL
                );
                CREATE TABLE agent_state (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
                """)
        }
        m.registerMigration("v2: pending counters") { db in
            // Kept in agent_state so that the loop never counts the outbox table (a full scan).
            try db.execute(sql: """
                INSERT OR REPLACE INTO agent_state (key, value) SELECT 'pending_count', COUNT(*) FROM outbox;
                INSERT OR REPLACE INTO agent_state (key, value)
                    SELECT 'pending_bytes', COALESCE(SUM(LENGTH(body)), 0) FROM outbox;
                """)
        }
        m.registerMigration("v3: no event_id index, the batch in flight as an id range") { db in
            // Two per-event costs go (docs/outbox.md, "Schema history"):
            // - the UNIQUE index on event_id: random ids dirtied index pages all over the file on every
            //   insert and delete. The drain is idempotent on the store's seq (UNIQUE, and
            //   `last_drained_seq` checked in the same transaction); the collector dedups on event_id.
            // - `batch_id` on every row: each batch rewrote its rows and their partial index once more.
            //   A batch is always a run of consecutive ids, and at most one is in flight: `in_flight`
            //   holds it.
            // SQLite cannot drop a column constraint, so the table is rebuilt, rows and ids unchanged.
            try db.execute(sql: """
                CREATE TABLE in_flight (
                    batch_id TEXT NOT NULL,
                    first_id INTEGER NOT NULL,
                    last_id INTEGER NOT NULL
                );
                INSERT INTO in_flight (batch_id, first_id, last_id)
                    SELECT batch_id, MIN(id), MAX(id) FROM outbox WHERE batch_id IS NOT NULL
                    GROUP BY batch_id ORDER BY MIN(id) LIMIT 1;
                CREATE TABLE outbox_v3 (
                    id INTEGER PRIMARY KEY,
                    seq INTEGER NOT NULL UNIQUE,
                    event_id TEXT NOT NULL,
                    producer TEXT NOT NULL,
                    producer_kind INTEGER NOT NULL,
                    producer_seq INTEGER NOT NULL,
                    wall_ms INTEGER NOT NULL,
                    boot_ns INTEGER NOT NULL,
                    boot_id BLOB NOT NULL,
                    body BLOB NOT NULL
                );
                INSERT INTO outbox_v3 SELECT id, seq, event_id, producer, producer_kind, producer_seq, wall_ms,
                    boot_ns, boot_id, body FROM outbox;
                DROP TABLE outbox;
                ALTER TABLE outbox_v3 RENAME TO outbox;
                """)
        }
        m.registerMigration("v4: no seq index") { db in
            // The UNIQUE index on seq was a second B-tree written on every insert and every delete
            // (about 0.9 µs of SQLite work per event in a model of the drain; docs/outbox.md, "Schema
            // history"). It guarded what `last_drained_seq` already guarantees: the drain inserts only
            // seqs above it, in increasing order, and advances it in the same transaction. Rebuilt as
            // v3 was, rows and ids unchanged.
            try db.execute(sql: """
                CREATE TABLE outbox_v4 (
                    id INTEGER PRIMARY KEY,
                    seq INTEGER NOT NULL,
                    event_id TEXT NOT NULL,
                    producer TEXT NOT NULL,
                    producer_kind INTEGER NOT NULL,
                    producer_seq INTEGER NOT NULL,
                    wall_ms INTEGER NOT NULL,
                    boot_ns INTEGER NOT NULL,
                    boot_id BLOB NOT NULL,
                    body BLOB NOT NULL
                );
                INSERT INTO outbox_v4 SELECT id, seq, event_id, producer, producer_kind, producer_seq, wall_ms,
                    boot_ns, boot_id, body FROM outbox;
                DROP TABLE outbox;
                ALTER TABLE outbox_v4 RENAME TO outbox;
                """)
        }
        m.registerMigration("v5: dead-letter bytes") { db in
            // Dead letters count against the outbox quota with the pending events (promise 4): kept in
            // agent_state like the pending counters, so that no check sums the table.
            try db.execute(sql: """
                INSERT OR REPLACE INTO agent_state (key, value)
                    SELECT 'dead_letter_bytes', COALESCE(SUM(LENGTH(body)), 0) FROM dead_letters;
                """)
        }
        m.registerMigration("v6: dead-letter bytes kept by triggers") { db in
            // Kept by SQLite itself, for every program that adds or removes a dead letter: an agent from
            // before v5 knows no such count, and keeping it right after one ran took a sum over the whole
            // table at every start (up to the quota's worth of pages, on a timer's every run). A key of its
            // own: agents from v5 on bump `dead_letter_bytes` themselves, and recount it at their start.
            try db.execute(sql: """
                INSERT OR REPLACE INTO agent_state (key, value)
                    SELECT 'dead_letter_body_bytes', COALESCE(SUM(LENGTH(body)), 0) FROM dead_letters;
                -- The record identity an agent before v6 kept is that of the record at last_drained_seq.
                INSERT OR REPLACE INTO agent_state (key, value)
                    SELECT 'last_drained_record_seq', value FROM agent_state WHERE key = 'last_drained_seq'
                        AND EXISTS (SELECT 1 FROM agent_state WHERE key = 'last_drained_record' AND value != 0);
                CREATE TRIGGER dead_letter_added AFTER INSERT ON dead_letters BEGIN
                    UPDATE agent_state SET value = value + LENGTH(NEW.body) WHERE key = 'dead_letter_body_bytes';
                END;
                CREATE TRIGGER dead_letter_removed AFTER DELETE ON dead_letters BEGIN
                    UPDATE agent_state SET value = value - LENGTH(OLD.body) WHERE key = 'dead_letter_body_bytes';
                END;
                """)
        }
        m.registerMigration("v7: two tables in turn") { db in
            // Deleting an acknowledged batch's rows rewrote every page they were on into the WAL (as many
            // page writes as their drain had cost); emptying a table whose rows are all delivered frees
            // its pages without writing them (docs/outbox.md, "Two tables in turn"). The rows keep their
            // ids in `outbox_0`, which the drain goes on appending to; the view `outbox` shows what waits.
            try db.execute(sql: """
                ALTER TABLE outbox RENAME TO outbox_0;
                CREATE TABLE outbox_1 (
                    id INTEGER PRIMARY KEY,
                    seq INTEGER NOT NULL,
                    event_id TEXT NOT NULL,
                    producer TEXT NOT NULL,
                    producer_kind INTEGER NOT NULL,
                    producer_seq INTEGER NOT NULL,
                    wall_ms INTEGER NOT NULL,
                    boot_ns INTEGER NOT NULL,
                    boot_id BLOB NOT NULL,
                    body BLOB NOT NULL
                );
                -- What the batch in flight holds, so that its acknowledgement need not read its rows (null:
                -- a batch an agent of v6 made, counted when it is acknowledged).
                ALTER TABLE in_flight ADD COLUMN event_count INTEGER;
                ALTER TABLE in_flight ADD COLUMN body_bytes INTEGER;
                INSERT OR REPLACE INTO agent_state (key, value) VALUES ('newer_table', 0);
                INSERT OR REPLACE INTO agent_state (key, value)
                    SELECT 'delivered_through', COALESCE(MIN(id) - 1, 0) FROM outbox_0;
                CREATE VIEW outbox AS
                    SELECT * FROM outbox_0
                        WHERE id > COALESCE((SELECT value FROM agent_state WHERE key = 'delivered_through'), 0)
                    UNION ALL
                    SELECT * FROM outbox_1
                        WHERE id > COALESCE((SELECT value FROM agent_state WHERE key = 'delivered_through'), 0);
                """)
        }
        return m
    }

    // MARK: Two tables in turn

    /// Where the outbox's rows are: two tables, `outbox_0` and `outbox_1`, used in turn
    /// (docs/outbox.md, "Two tables in turn").
    ///
    /// - The drain appends to the newer table, each row with an id above every one handed out before
    ///   (``lastID(_:)``): every id in the newer table is above every id in the older one, so upload
    ///   order is the older table's rows, then the newer's.
    /// - An acknowledgement of the oldest rows waiting moves `delivered_through` past them instead of
    ///   deleting them. A table whose rows are all delivered is emptied whole: SQLite's truncate
    ///   optimization frees its pages without writing them, where deleting its rows one by one wrote
    ///   every page they were on into the WAL again (as many page writes as the drain had made).
    /// - Once the older table is empty and the newer one holds ``turnRows`` ids' worth, the older
    ///   becomes the newer: the drain appends to it from then on, and the other one empties as the
    ///   collector acknowledges it.
    /// - A table that holds more than ``heldRows(turnRows:)`` delivered rows while some of its rows
    ///   still wait (one filled during an outage, while its backlog is sent) has its delivered rows
    ///   deleted, one by one as before: the disk the delivered rows take stays bounded (a flapping
    ///   collector could otherwise keep a quota's worth of them beside a newer table filling up), and
    ///   so does the time emptying a table takes (SQLite reads each of its pages to free it).
    ///
    /// The view `outbox` shows the rows waiting (both tables, above `delivered_through`). No GRDB
    /// transaction observer may watch deletions from the tables: GRDB would then turn the truncate
    /// optimization off, to report each row.
    struct Tables {
        /// Which table the drain appends to: 0 or 1.
        var newer: Int
        /// Every row with an id up to this one is delivered; it stays until its table is emptied.
        var deliveredThrough: Int64

        var older: Int { 1 - newer }
        /// The two tables in upload order.
        var inOrder: [Int] { [older, newer] }

        static func read(_ db: Database) throws -> Tables {
            Tables(
                newer: try Outbox.state(db, "newer_table") == 1 ? 1 : 0,
                deliveredThrough: try Outbox.state(db, "delivered_through"))
        }

        /// The largest id ever handed out (`last_id`), or the largest either table holds, or
        /// `delivered_through`, whichever is largest: the next row's id is one more. No id is handed out
        /// twice: one at or below `delivered_through` would count as delivered, and one freed by a dead
        /// letter of the last row could fall inside a batch read ahead. `spans`: the tables' spans when
        /// the caller has just read them (``turnIfDue(_:turnRows:)``), else their largest ids are read.
        func lastID(_ db: Database, spans: [Span?]? = nil) throws -> Int64 {
            var last = max(deliveredThrough, try Outbox.state(db, "last_id"))
            for table in 0...1 {
                let tableLast = try spans.map { $0[table]?.last } ?? Self.maxID(db, table)
                last = max(last, tableLast ?? 0)
            }
            return last
        }

        /// The largest id in `table`, nil when it is empty.
        static func maxID(_ db: Database, _ table: Int) throws -> Int64? {
            try Int64.fetchOne(db.cachedStatement(sql: maxIDSQL[table]))
        }

        /// A table's smallest and largest ids.
        typealias Span = (first: Int64, last: Int64)

        /// The smallest and largest ids in `table`, nil when it is empty.
        static func span(_ db: Database, _ table: Int) throws -> Span? {
            guard let row = try GRDB.Row.fetchOne(db.cachedStatement(sql: spanSQL[table])),
                let first = row[0] as Int64?, let last = row[1] as Int64?
            else { return nil }
            return (first, last)
        }

        /// How many ids' worth of delivered rows a table keeps, at most, while some of its rows wait.
        static func heldRows(turnRows: Int64) -> Int64 { 4 * turnRows }

        /// Empties each table whose rows are all delivered (its pages go to SQLite's free list unwritten),
        /// and deletes the delivered rows of one that holds more than ``heldRows(turnRows:)`` of them.
        /// Returns each table's span after that (nil: empty).
        @discardableResult
        func emptyDelivered(_ db: Database, turnRows: Int64) throws -> [Span?] {
            try (0...1).map { table in
                guard let span = try Self.span(db, table) else { return nil }
                guard span.first <= deliveredThrough else { return span }
                if span.last <= deliveredThrough {
                    try db.cachedStatement(sql: Self.emptySQL[table]).execute()
                    return nil
                }
                if deliveredThrough - span.first + 1 > Self.heldRows(turnRows: turnRows) {
                    try db.cachedStatement(sql: Self.deleteThroughSQL[table]).execute(arguments: [deliveredThrough])
                    return try Self.span(db, table)
                }
                return span
            }
        }

        /// ``emptyDelivered(_:turnRows:)``; then, when the older table is empty and the newer one spans at
        /// least `turnRows` ids, makes the older one the newer (recorded in `db`). Returns the tables'
        /// spans.
        mutating func turnIfDue(_ db: Database, turnRows: Int64) throws -> [Span?] {
            let spans = try emptyDelivered(db, turnRows: turnRows)
            if spans[older] == nil, let span = spans[newer], span.last - span.first + 1 >= turnRows {
                newer = older
                try Outbox.setState(db, "newer_table", Int64(newer))
            }
            return spans
        }

        /// Each statement per table (cached per connection under its text).
        fileprivate static let maxIDSQL = sql { "SELECT MAX(id) FROM \($0)" }
        // Two subqueries: SQLite answers a lone MIN() or MAX() from the B-tree's edge, but scans the
        // whole table for both in one SELECT.
        fileprivate static let spanSQL = sql { "SELECT (SELECT MIN(id) FROM \($0)), (SELECT MAX(id) FROM \($0))" }
        private static let emptySQL = sql { "DELETE FROM \($0)" }  // no WHERE: the truncate optimization
        fileprivate static let deleteThroughSQL = sql { "DELETE FROM \($0) WHERE id <= ?" }

        /// `text` for `outbox_0` and `outbox_1`.
        static func sql(_ text: (String) -> String) -> [String] { [text("outbox_0"), text("outbox_1")] }
    }

    /// Every statement the outbox runs on one table but the one that empties it: each must find its rows
    /// through the B-tree (a test checks their query plans: a scan of a table is a cost per row waiting).
    static var statementsOnOneTable: [String] {
        [
            Tables.maxIDSQL, Tables.spanSQL, Tables.deleteThroughSQL, insertSQL, selectBatchSQL, firstWaitingSQL,
            waitingThroughSQL, countSQL, waitingBetweenSQL, deleteRangeSQL,
        ].flatMap { $0 }
    }

    // MARK: Drain side

    /// The highest store sequence number ever committed to this outbox (drained), or 0.
    public func lastDrainedSeq() throws -> UInt64 {
        try writer.read { db in UInt64(try Self.state(db, "last_drained_seq")) }
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
        try writer.write { db in
            let recorded = UInt64(bitPattern: try Self.state(db, "store_id"))
            guard recorded != storeID else { return nil }
            try Self.setState(db, "store_id", Int64(bitPattern: storeID))
            guard recorded != 0 else { return nil }
            let drained = UInt64(try Self.state(db, "last_drained_seq"))
            try Self.setState(db, "last_drained_seq", 0)
            try Self.forgetDrainedRecord(db)  // the other store's
            return (recorded, drained)
        }
    }

    /// ``insertDrained(_:beforeCommit:)`` for a chunk built by the drain.
    @discardableResult
    func insertDrained(_ chunk: DrainedChunk, beforeCommit: () -> Void = {}) throws -> Inserted {
        guard !chunk.entries.isEmpty else { return Inserted() }
        return try writer.write { db in
            // The highest seq ever drained, then the highest of this chunk so far: an entry must be above
            // it to be inserted (no index makes a seq unique in the table; see migration v4).
            let already = UInt64(try Self.state(db, "last_drained_seq"))
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
            if highest > already { try Self.setState(db, "last_drained_seq", Int64(highest)) }
            if inserted > 0 { try Self.setState(db, "last_id", id) }
            try Self.bump(db, "drained", inserted)
            try Self.bump(db, "pending_count", inserted)
            try Self.bump(db, "pending_bytes", insertedBytes)
            try Self.bump(db, "duplicates_skipped", skipped)
            try Self.bump(db, "corrupt_records", corrupt)
            try Self.bump(db, "dead_letters", corrupt)
            // Which record the chunk ended with, and at which seq (``reconcile(lastAssignedSeq:oldestSeq:identityAt:)``
            // takes it only while that seq is `last_drained_seq`: an agent from before identities were kept
            // may have moved it on since, without a word about the record there).
            if highest > already, let last = chunk.entries.last?.seq {
                try Self.setState(db, "last_drained_record", Int64(bitPattern: chunk.lastRecordIdentity))
                try Self.setState(db, "last_drained_record_seq", Int64(last))
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
        let (drained, identity) = try writer.read { db in
            let seq = UInt64(try Self.state(db, "last_drained_seq"))
            let identitySeq = UInt64(try Self.state(db, "last_drained_record_seq"))
            // Not known unless it is the record at `last_drained_seq`.
            return (seq, identitySeq == seq ? UInt64(bitPattern: try Self.state(db, "last_drained_record")) : 0)
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
        try writer.write { db in
            try Self.setState(db, "last_drained_seq", Int64(after))
            try Self.forgetDrainedRecord(db)
        }
        return (drained, after)
    }

    /// Forgets which record was drained last, and the event a halt held back: seqs from here on name
    /// other records (another store's, or the same seqs handed out again).
    private static func forgetDrainedRecord(_ db: Database) throws {
        try setState(db, "last_drained_record", 0)
        try setState(db, "last_drained_record_seq", 0)
        try setState(db, "halted_seq", 0)
    }

    /// For each table: the `INSERT` of one row, every column bound (``insert(_:id:from:with:in:)``).
    fileprivate static let insertSQL = Tables.sql {
        """
        INSERT INTO \($0) (id, seq, event_id, producer, producer_kind, producer_seq, wall_ms, boot_ns, boot_id, body)
        VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
        """
    }

    /// Runs a cached ``insertSQL`` for one event of a chunk, as row `id`.
    ///
    /// Binds with `sqlite3_bind_*` directly instead of GRDB's `StatementArguments`: building an array
    /// of `DatabaseValue`s and two `Data` copies per row was the largest cost of a drain after the
    /// SQLite work itself. SQLITE_STATIC: the chunk's buffer outlives the statement's step; the
    /// bindings are cleared before the buffer goes.
    private static func insert(
        _ event: DrainedChunk.Event, id: Int64, from bytes: UnsafeRawBufferPointer, with statement: Statement,
        in db: Database
    ) throws {
        let handle = statement.sqliteStatement
        defer { sqlite3_clear_bindings(handle) }
        func text(_ index: Int32, _ range: Range<Int>) {
            sqlite3_bind_text(
                handle, index, bytes.baseAddress!.advanced(by: range.lowerBound).assumingMemoryBound(to: CChar.self),
                Int32(range.count), sqliteStatic)
        }
        func blob(_ index: Int32, _ range: Range<Int>) {
            if range.isEmpty {
                sqlite3_bind_zeroblob(handle, index, 0)  // a nil pointer would store NULL; the columns are NOT NULL
            } else {
                sqlite3_bind_blob(handle, index, bytes.baseAddress!.advanced(by: range.lowerBound), Int32(range.count), sqliteStatic)
            }
        }
        sqlite3_reset(handle)
        sqlite3_bind_int64(handle, 1, id)
        sqlite3_bind_int64(handle, 2, Int64(event.seq))
        text(3, event.eventID)
        text(4, event.producer)
        sqlite3_bind_int64(handle, 5, Int64(event.producerKind.rawValue))
        sqlite3_bind_int64(handle, 6, Int64(event.producerSeq))
        sqlite3_bind_int64(handle, 7, event.wallMillis)
        sqlite3_bind_int64(handle, 8, Int64(bitPattern: event.bootNanos))
        blob(9, event.bootID)
        blob(10, event.body)
        let rc = sqlite3_step(handle)
        sqlite3_reset(handle)
        guard rc == SQLITE_DONE else {
            throw DatabaseError(
                resultCode: ResultCode(rawValue: rc), message: String(cString: sqlite3_errmsg(db.sqliteConnection)),
                sql: statement.sql)
        }
    }

    // MARK: Upload side

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
        try writer.write { db in
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
    /// would choose them once that batch is acknowledged, handed to `each` on a reader connection (the
    /// drain and the uploader may write meanwhile: only rows after these are ever added, only the
    /// uploader ends a row's wait, and the drain removes only delivered rows, emptying or trimming a
    /// table, ``Tables``). Nil when `batchID` is not in flight or no row follows it.
    public func peekBatch(
        after batchID: String, maxCount: Int, maxBytes: Int, each: (BatchEvent) throws -> Void
    ) throws -> PreparedBatch? {
        try writer.read { db in
            guard let inFlight = try Self.inFlight(db), inFlight.id == batchID else { return nil }
            let scanned = try Self.scan(
                db, from: inFlight.lastID + 1, through: .max, maxCount: maxCount, maxBytes: maxBytes, each)
            guard scanned.count > 0 else { return nil }
            return PreparedBatch(
                id: Self.newBatchID(), count: scanned.count, bytes: scanned.bytes,
                firstID: scanned.firstID, lastID: scanned.lastID,
                deadLettersWhenRead: try Self.state(db, "dead_letters"))
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
            let handle = select.sqliteStatement
            sqlite3_reset(handle)
            sqlite3_bind_int64(handle, 1, max(firstID, tables.deliveredThrough + 1))
            sqlite3_bind_int64(handle, 2, lastID)
            sqlite3_bind_int64(handle, 3, Int64(maxCount - scanned.count))
            try scan(select, in: db, maxBytes: maxBytes, into: &scanned, each)
        }
        return scanned
    }

    /// For each table: at most `?3` rows with ids from `?1` through `?2`, in upload order.
    fileprivate static let selectBatchSQL = Tables.sql {
        "SELECT id, wall_ms, boot_ns, boot_id, body FROM \($0) WHERE id BETWEEN ? AND ? ORDER BY id LIMIT ?"
    }

    /// Steps a bound ``selectBatchSQL`` statement, handing each row to `each` and adding it to `scanned`,
    /// until the rows run out or the next body would pass `maxBytes` (the first row of all always goes).
    private static func scan(
        _ statement: Statement, in db: Database, maxBytes: Int, into scanned: inout Scanned,
        _ each: (BatchEvent) throws -> Void
    ) throws {
        let handle = statement.sqliteStatement
        defer { sqlite3_reset(handle) }
        while true {
            let rc = sqlite3_step(handle)
            if rc == SQLITE_DONE { break }
            guard rc == SQLITE_ROW else {
                throw DatabaseError(
                    resultCode: ResultCode(rawValue: rc), message: String(cString: sqlite3_errmsg(db.sqliteConnection)),
                    sql: statement.sql)
            }
            // sqlite.org/c3ref/column_blob.html: call _blob first, then _bytes, for the pointer to stay valid.
            let body = UnsafeRawBufferPointer(start: sqlite3_column_blob(handle, 4), count: Int(sqlite3_column_bytes(handle, 4)))
            if scanned.count > 0 && scanned.bytes + body.count > maxBytes {
                scanned.full = true
                break
            }
            let bootID = UnsafeRawBufferPointer(start: sqlite3_column_blob(handle, 3), count: Int(sqlite3_column_bytes(handle, 3)))
            let id = sqlite3_column_int64(handle, 0)
            if scanned.count == 0 { scanned.firstID = id }
            scanned.lastID = id
            try each(BatchEvent(
                wallMillis: sqlite3_column_int64(handle, 1), bootNanos: UInt64(bitPattern: sqlite3_column_int64(handle, 2)),
                bootID: bootID, body: body))
            scanned.count += 1
            scanned.bytes += body.count
        }
    }

    /// The rows of batch `batchID`, in upload order (to bisect or dead-letter a batch the collector refused);
    /// empty unless `batchID` is the batch in flight.
    public func rows(inBatch batchID: String) throws -> [Row] {
        try writer.read { db in
            guard let inFlight = try Self.inFlight(db), inFlight.id == batchID else { return [] }
            return try Self.rows(db, inFlight)
        }
    }

    /// Makes `rows` (consecutive rows of a failed batch, in upload order) a new batch of their own with a
    /// new id; the other rows of the batch in flight go back to the pool of unbatched rows.
    public func rebatch(_ rows: [Row]) throws -> [Row] {
        try writer.write { db in
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
        try writer.write { db in try db.execute(sql: "DELETE FROM in_flight WHERE batch_id = ?", arguments: [batchID]) }
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
        try writer.writeWithoutTransaction { db in
            try Self.withPatience(patience, db) {
                try db.execute(sql: "PRAGMA synchronous = NORMAL")
                var madeInFlight = false
                let outcome = Result {
                    try db.inTransaction {
                        madeInFlight = try acknowledge(batchID, in: db, then: next)
                        return .commit
                    }
                }
                // Every other transaction commits FULL: set it back before anything else can run here.
                try db.execute(sql: "PRAGMA synchronous = FULL")
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
        if try Self.state(db, "dead_letters") != next.deadLettersWhenRead {
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
    fileprivate static let firstWaitingSQL = Tables.sql { "SELECT MIN(id) FROM \($0) WHERE id > ?" }
    /// For each table: how many rows have ids above `?1` and up to `?2`.
    fileprivate static let waitingThroughSQL = Tables.sql { "SELECT COUNT(*) FROM \($0) WHERE id > ? AND id <= ?" }

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
            try Self.setState(db, "delivered_through", tables.deliveredThrough)
        }
        try tables.emptyDelivered(db, turnRows: turnRows)
        try Self.endInFlight(db)
        if delivered > 0 {
            // A delivery ends the run of dead letters, and any hold a halt made (the held event was the
            // first waiting: delivered, or dead-lettered before this).
            try db.cachedStatement(
                sql: "UPDATE agent_state SET value = 0 WHERE key IN ('dead_letters_in_a_row', 'halted_seq') AND value != 0"
            ).execute()
        }
        try Self.bump(db, "delivered", delivered)
        try Self.bump(db, "pending_count", -delivered)
        try Self.bump(db, "pending_bytes", -bytes)
        try Self.bump(db, "batches", 1)
        return true
    }

    /// For each table: how many rows have ids from `?1` through `?2`, and their body bytes.
    fileprivate static let countSQL = Tables.sql {
        "SELECT COUNT(*), COALESCE(SUM(LENGTH(body)), 0) FROM \($0) WHERE id BETWEEN ? AND ?"
    }
    /// For each table: whether a row has an id above `?1` and below `?2`.
    fileprivate static let waitingBetweenSQL = Tables.sql {
        "SELECT EXISTS (SELECT 1 FROM \($0) WHERE id > ? AND id < ?)"
    }
    /// For each table: deletes the rows with ids from `?1` through `?2`.
    fileprivate static let deleteRangeSQL = Tables.sql { "DELETE FROM \($0) WHERE id BETWEEN ? AND ?" }

    /// Moves one event to the dead-letter table with the collector's status and reason.
    public func deadLetter(_ row: Row, status: Int, reason: String, beforeCommit: () -> Void = {}) throws {
        try writer.write { db in
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
            try Self.bump(db, "pending_count", -deleted)
            try Self.bump(db, "pending_bytes", -row.body.count * deleted)
            try Self.bump(db, "dead_letters", 1)
            try Self.bump(db, "dead_letters_in_a_row", 1)
            beforeCommit()
        }
    }

    /// Events dead-lettered since an event was last delivered (by this agent's runs and the ones before):
    /// what ``UploadConfiguration/haltAfterDeadLetters`` is held against. A delivery sets it back to 0.
    public func deadLettersInARow() throws -> Int {
        try writer.read { db in Int(try Self.state(db, "dead_letters_in_a_row")) }
    }

    /// The run of dead letters as it stands for uploads to `destination` (a fingerprint of the collector
    /// URL and wire format): ``deadLettersInARow()``, set back to 0 first when the run was counted
    /// against another destination (a new one is judged afresh, also when it changed between two runs
    /// of the agent), and the seq of the event held back by the last halt, if any.
    public func deadLetterRun(destination: UInt64) throws -> (inARow: Int, heldSeq: UInt64?) {
        try writer.write { db in
            let fingerprint = Int64(bitPattern: destination)
            if try Self.state(db, "dead_letters_destination") != fingerprint {
                try Self.setState(db, "dead_letters_in_a_row", 0)
                try Self.setState(db, "halted_seq", 0)
                try Self.setState(db, "dead_letters_destination", fingerprint)
            }
            let held = try Self.state(db, "halted_seq")
            return (Int(try Self.state(db, "dead_letters_in_a_row")), held > 0 ? UInt64(held) : nil)
        }
    }

    /// Records that uploads halted holding back the refused event `seq`: sent alone again after the
    /// halt, by this run or a later one, it is dead-lettered if refused once more.
    public func holdAfterHalt(seq: UInt64) throws {
        try writer.write { db in try Self.setState(db, "halted_seq", Int64(seq)) }
    }

    /// Counts a retry (for status).
    public func countRetry() throws {
        try writer.write { db in try Self.bump(db, "retries", 1) }
    }

    // MARK: Inspection and replay

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

    /// How many dead letters the outbox holds.
    public func deadLetterCount() throws -> Int {
        try writer.read { db in try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM dead_letters") ?? 0 }
    }

    /// Dead letters, oldest first.
    public func deadLetters(limit: Int = 1000) throws -> [DeadLetter] {
        try writer.read { db in
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
    public struct UnknownDeadLetters: Error, CustomStringConvertible, Sendable {
        public var ids: [Int64]
        /// Whether a replay (else a discard) was refused.
        public var replaying = true
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
        let chosen = try writer.read { db in
            try Self.chosenDeadLetters(db, columns: "id", filter: "event_id IS NOT NULL", ids: ids, replaying: true)
                .map { $0["id"] as Int64 }
        }
        var moved = 0
        for start in stride(from: 0, to: chosen.count, by: Self.replayChunk) {
            let chunk = Array(chosen[start..<min(start + Self.replayChunk, chosen.count)])
            moved += try ReplayInterrupted.saying(moved: moved, of: chosen.count) { try writer.write { db in
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
                if moved > 0 { try Self.setState(db, "last_id", lastID) }
                try Self.bump(db, "pending_count", moved)
                try Self.bump(db, "pending_bytes", bytes)
                return moved
            } }
        }
        return moved
    }

    /// A replay that failed part way: `moved` of `total` dead letters are back in the outbox (whole
    /// transactions of them), the rest still dead letters.
    public struct ReplayInterrupted: Error, CustomStringConvertible, Sendable {
        public var moved: Int
        public var total: Int
        public var reason: String
        public var description: String {
            "replayed \(moved) of \(total) dead letter(s) before the failure (the rest are still dead letters): \(reason)"
        }

        /// `body`, its failure thrown as a replay interrupted after `moved` of `total`.
        static func saying<T>(moved: Int, of total: Int, _ body: () throws -> T) throws -> T {
            do { return try body() } catch { throw ReplayInterrupted(moved: moved, total: total, reason: "\(error)") }
        }
    }

    /// Dead letters moved back per transaction by ``replayDeadLetters(ids:)``.
    static let replayChunk = 200

    /// Deletes dead letters (all, or those with the given ids) for good, corrupt records too, and
    /// frees their room in the outbox quota. Returns how many were deleted. With `ids`, all or
    /// nothing: when one of them names no dead letter, throws ``UnknownDeadLetters`` and deletes none.
    @discardableResult
    public func discardDeadLetters(ids: [Int64]? = nil) throws -> Int {
        try writer.write { db in
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

    /// Copies the WAL into the database file (`PRAGMA wal_checkpoint`), and with `truncate` empties it
    /// so that closing the outbox has nothing left to write or sync. An I/O error surfaces here, where
    /// the agent can fail-stop on it, instead of inside an automatic checkpoint or a close that cannot
    /// report it.
    ///
    /// A truncating checkpoint waits for readers of the WAL (`tributary status`, `dead-letters`) to
    /// finish: at most `patience` (the connection's ``busyTimeout`` otherwise), so that a stop stays
    /// within its deadline. Returns false when readers kept it from completing; the WAL then stays, as
    /// durable as the database file, for the next checkpoint.
    @discardableResult
    public func checkpoint(truncate: Bool = true, patience: Duration? = nil) throws -> Bool {
        let sql = truncate ? "PRAGMA wal_checkpoint(TRUNCATE)" : "PRAGMA wal_checkpoint(PASSIVE)"
        return try writer.writeWithoutTransaction { db in
            try Self.withPatience(patience, db) { try Self.checkpointed(db, sql) }
        }
    }

    /// Runs `body` with `db`'s busy timeout cut to `patience` (nil: the connection's own), then sets
    /// the connection's own again.
    private static func withPatience<T>(_ patience: Duration?, _ db: Database, _ body: () throws -> T) throws -> T {
        guard let patience else { return try body() }
        try db.execute(sql: "PRAGMA busy_timeout = \(max(1, Int(patience / .milliseconds(1))))")
        let outcome = Result { try body() }
        try db.execute(sql: "PRAGMA busy_timeout = \(Int(Self.busyTimeout * 1000))")  // the connection's own again
        return try outcome.get()
    }

    /// How long a statement waits for a lock another connection holds, in seconds (GRDB's `busyMode`).
    static let busyTimeout: TimeInterval = 10

    /// Runs a `wal_checkpoint` pragma; false when its first column (busy) says it could not complete.
    private static func checkpointed(_ db: Database, _ sql: String) throws -> Bool {
        try GRDB.Row.fetchOne(db, sql: sql).map { ($0[0] as Int?) != 1 } ?? true
    }

    /// Runs SQLite's `PRAGMA integrity_check`; returns "ok" when the file is sound.
    public func integrityCheck() throws -> String {
        try writer.read { db in try String.fetchAll(db, sql: "PRAGMA integrity_check").joined(separator: "; ") }
    }

    // MARK: Helpers

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

    // The statements below run several times per drained chunk and per batch, and on every turn of the
    // agent's loop: they are cached per connection (`cachedStatement`), where `execute(sql:)` and
    // `fetchOne(db, sql:)` would compile them each time (a tenth of the agent's CPU in a profile of
    // `--once`, most of it SQLite's parser).

    private static func state(_ db: Database, _ key: String) throws -> Int64 {
        let select = try db.cachedStatement(sql: "SELECT value FROM agent_state WHERE key = ?")
        return try Int64.fetchOne(select, arguments: [key]) ?? 0
    }

    private static func setState(_ db: Database, _ key: String, _ value: Int64) throws {
        try db.cachedStatement(
            sql: "INSERT INTO agent_state (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value"
        ).execute(arguments: [key, value])
    }

    private static func bump(_ db: Database, _ key: String, _ by: Int) throws {
        guard by != 0 else { return }
        try db.cachedStatement(
            sql: "INSERT INTO agent_state (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = value + excluded.value"
        ).execute(arguments: [key, by])
    }
}
