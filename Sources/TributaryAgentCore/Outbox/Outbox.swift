import Foundation
import GRDB
import TributarySQLite
import TributaryStore

/// The agent's private SQLite outbox: events drained from the shared store, waiting for upload.
///
/// WAL mode with `synchronous=FULL` (sqlite.org: in WAL mode, FULL syncs the WAL on every commit, so
/// a committed transaction survives power loss). Rows are uploaded in `id` order, which is the
/// store's global sequence order. See `docs/outbox.md` for the schema.
///
/// The other files of this folder extend it, a concern each: the migrations (`OutboxSchema.swift`), the
/// two tables in turn (`OutboxTables.swift`), the drain (`Outbox+Drain.swift`), batches and their
/// acknowledgement (`Outbox+Batches.swift`), dead letters (`Outbox+DeadLetters.swift`), the `agent_state`
/// table (`OutboxState.swift`); the SQLite C calls go through `TributarySQLite`'s `RawStatement`.
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

    /// Where the outbox lives.
    public let path: String
    /// The agent's one connection (``init(path:turnRows:fatalIO:whileMigrating:)``); a pool of
    /// read-only connections for ``init(readingAt:)``.
    let writer: any DatabaseWriter
    /// The fail-stop latch: once an I/O error trips it, no write or checkpoint touches the file
    /// (``write(_:)``, ``writeOutsideTransaction(_:)``).
    let fatalIO: FatalIO.Latch
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

    /// ``init(path:whileMigrating:)`` with the agent's fail-stop latch, shared with its store deletes.
    convenience init(
        path: String, fatalIO: FatalIO.Latch, whileMigrating: ((() throws -> Void) throws -> Void)? = nil
    ) throws {
        try self.init(path: path, turnRows: Self.defaultTurnRows, fatalIO: fatalIO, whileMigrating: whileMigrating)
    }

    /// ``init(path:whileMigrating:)`` with the tables turning every `turnRows` ids (tests).
    init(
        path: String, turnRows: Int64, fatalIO: FatalIO.Latch = FatalIO.Latch(),
        whileMigrating: ((() throws -> Void) throws -> Void)? = nil
    ) throws {
        precondition(turnRows > 0, "turnRows must be positive")
        self.path = path
        self.turnRows = turnRows
        self.fatalIO = fatalIO
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
            // before it is switched to WAL below: an existing outbox keeps its page size.
            try db.execute(sql: "PRAGMA page_size = 16384")
            // Debian's SQLite is built with SQLITE_SECURE_DELETE, which zeroes every freed page and so
            // writes it into the WAL: emptying a delivered table (``Tables``) would then cost as many
            // page writes as deleting its rows one by one. FAST zeroes deleted content only on pages
            // written anyway: the pages of an emptied table keep their bytes until the drain reuses
            // them (the outbox is the agent's own file, 0600 in a 0700 directory).
            try db.execute(sql: "PRAGMA secure_delete = FAST")
            // Set once, on a new file (after its page size; the mode stays with the file): with WAL,
            // what `tributary status` and `dead-letters` read in other processes neither waits for the
            // agent's commits nor holds them up.
            if try String.fetchOne(db, sql: "PRAGMA journal_mode") != "wal" {
                try db.execute(sql: "PRAGMA journal_mode = WAL")
            }
        }
        try Self.refuseForeignDatabase(at: path)
        // One connection on one serial queue (GRDB's `DatabaseQueue`): every read and write of this
        // process runs there, one at a time, whichever thread asks. A pool's reader connections let
        // the read-ahead read beside a drain's commit; measured side by side (the pipeline benchmark,
        // 1,000,000 events, three pairs), the one queue delivered 0.98 of the pool's rate (pairs
        // 1.03, 0.98, 0.93: within the run-to-run noise) with 1 MiB less memory, and nothing in
        // the agent needs two connections.
        writer = try DatabaseQueue(path: path, configuration: config)
        // No automatic checkpoints: SQLite ignores an I/O error in one (an fsync of the database file
        // that failed would be retried by the next). The agent checkpoints explicitly (checkpoint()),
        // where the error is seen and stops it.
        try writer.writeWithoutTransaction { db in try db.execute(sql: "PRAGMA wal_autocheckpoint = 0") }
        let migrator = Self.migrator
        if try !read({ db in try migrator.hasCompletedMigrations(db) }) {
            // A migration rebuilds tables: its WAL is as large as they are. Emptied and cut at once.
            // The migrations commit without a sync each (synchronous NORMAL: in WAL mode a power cut
            // may undo the last of them, which the next start runs again, and leaves the file sound);
            // the checkpoint after them syncs what they wrote, or else the first FULL commit does (the
            // WAL's frames are synced in order). Opening a new outbox took 18 syncs of the disk in
            // 15 ms, most of them these commits, and a producer committing while the agent started
            // waited behind them (docs/performance-history.md, "Twenty-seventh round"): now about 10.
            let migrate = { [self] in
                do {
                    try writer.writeWithoutTransaction { db in try db.execute(sql: "PRAGMA synchronous = NORMAL") }
                    try migrator.migrate(writer)
                    try writer.writeWithoutTransaction { db in try db.execute(sql: "PRAGMA synchronous = FULL") }
                } catch where FatalIO.matches(error) {
                    throw fatalIO.trip(error, keeping: self)
                }
                try checkpoint()
            }
            if let whileMigrating { try whileMigrating(migrate) } else { try migrate() }
        }
    }

    /// Opens the outbox at `path` for reading only (`tributary dead-letters` listing them): every connection
    /// read-only, so nothing is written, not a migration, not a pragma, not the switch to WAL; a user who
    /// may only read it can (``ReadOnlyDatabase``). An outbox of
    /// an earlier release (one that needs a migration) is refused, saying how to migrate it.
    public init(readingAt path: String) throws {
        self.path = path
        turnRows = Self.defaultTurnRows
        fatalIO = FatalIO.Latch()  // never tripped: nothing here writes
        try Self.refuseForeignDatabase(at: path)
        var config = Configuration()
        config.busyMode = .timeout(Self.busyTimeout)
        let migrator = Self.migrator
        let (pool, migrated) = try ReadOnlyDatabase.open(path, configuration: config, as: DatabasePool.init) { db in
            try migrator.hasCompletedMigrations(db)
        }
        writer = pool
        guard migrated else {
            throw AgentError(
                .configuration,
                "The outbox \(path) was written by an earlier release and needs a migration, which a read does not make: "
                    + "run tributary-agent on it once (or tributary dead-letters --replay), then list again.")
        }
    }

    /// Throws if `path` is another program's SQLite database (a collector's, an app's): given as an
    /// outbox, it was switched to WAL and migrated into an outbox beside its own tables, or failed half
    /// way. Read through a read-only connection: nothing is written. A file it cannot read so is left to
    /// the outbox's own open, which says why; one another process keeps locked is refused (it could not
    /// be checked).
    private static func refuseForeignDatabase(at path: String) throws(AgentError) {
        let tables: [String]
        switch ForeignDatabaseCheck.look(at: path) {
        case .nothing, .unreadable: return
        case .locked: throw AgentError(.configuration, ForeignDatabaseCheck.lockedMessage(path, what: "a Tributary outbox"))
        case .tables(let found): tables = found
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
        return try writeOutsideTransaction { db in
            try Self.withPatience(patience, db) { try Self.checkpointed(db, sql) }
        }
    }

    /// A write transaction, as GRDB's `write`, under the fail-stop rule: refused once the latch has
    /// tripped, and tripping it, inside the writer queue, when it fails with an I/O error, so that no
    /// write queued behind it runs.
    func write<T>(_ body: (Database) throws -> T) throws -> T {
        try writeOutsideTransaction { db in
            var result: T?
            try db.inTransaction {
                result = try body(db)
                return .commit
            }
            return result!
        }
    }

    /// A read: `body` in one deferred transaction (what it reads is one snapshot of the outbox, whatever
    /// `tributary dead-letters` commits meanwhile in its own process).
    ///
    /// Not GRDB's `read` on the agent's `DatabaseQueue`: that one sets `PRAGMA query_only` on before and
    /// off after, and every change of a flag pragma expires all the connection's prepared statements
    /// (SQLite's `OP_Expire`), so each cached statement was compiled again, through GRDB's authorizer,
    /// at its next use. A loop turn reads a few times (the read-ahead, the status figures): in a
    /// 100,000-event `--once` run that was 6,000 recompiles, 9 % of the agent's instructions
    /// (callgrind). The read-only pool of ``init(readingAt:)`` keeps GRDB's `read`: its connections
    /// are opened read-only, which sets no pragma.
    func read<T>(_ body: (Database) throws -> T) throws -> T {
        guard writer is DatabaseQueue else { return try writer.read(body) }
        return try writer.unsafeRead { db in
            var result: T?
            try db.inTransaction(.deferred) {
                result = try body(db)
                return .commit
            }
            return result!
        }
    }

    /// `body` on the writer connection with no transaction of its own (a checkpoint, a transaction
    /// with its own busy timeout), under the fail-stop rule as ``write(_:)``.
    func writeOutsideTransaction<T>(_ body: (Database) throws -> T) throws -> T {
        try writer.writeWithoutTransaction { db in
            try fatalIO.check()
            do {
                return try body(db)
            } catch where FatalIO.matches(error) {
                // Kept open to the end of the process: closing would checkpoint the WAL that failed.
                throw fatalIO.trip(error, keeping: self)
            }
        }
    }

    /// Runs `body` with `db`'s busy timeout cut to `patience` (nil: the connection's own), then sets
    /// the connection's own again.
    static func withPatience<T>(_ patience: Duration?, _ db: Database, _ body: () throws -> T) throws -> T {
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
        try read { db in try String.fetchAll(db, sql: "PRAGMA integrity_check").joined(separator: "; ") }
    }
}
