import GRDB

// The two tables the outbox's rows are in, used in turn (docs/outbox.md, "Two tables in turn").

extension Outbox {
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
                newer: try Outbox.state(db, .newerTable) == 1 ? 1 : 0,
                deliveredThrough: try Outbox.state(db, .deliveredThrough))
        }

        /// The largest id ever handed out (`last_id`), or the largest either table holds, or
        /// `delivered_through`, whichever is largest: the next row's id is one more. No id is handed out
        /// twice: one at or below `delivered_through` would count as delivered, and one freed by a dead
        /// letter of the last row could fall inside a batch read ahead. `spans`: the tables' spans when
        /// the caller has just read them (``turnIfDue(_:turnRows:)``), else their largest ids are read.
        func lastID(_ db: Database, spans: [Span?]? = nil) throws -> Int64 {
            var last = max(deliveredThrough, try Outbox.state(db, .lastID))
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
                try Outbox.setState(db, .newerTable, Int64(newer))
            }
            return spans
        }

        /// Each statement per table (cached per connection under its text).
        static let maxIDSQL = sql { "SELECT MAX(id) FROM \($0)" }
        // Two subqueries: SQLite answers a lone MIN() or MAX() from the B-tree's edge, but scans the
        // whole table for both in one SELECT.
        static let spanSQL = sql { "SELECT (SELECT MIN(id) FROM \($0)), (SELECT MAX(id) FROM \($0))" }
        private static let emptySQL = sql { "DELETE FROM \($0)" }  // no WHERE: the truncate optimization
        static let deleteThroughSQL = sql { "DELETE FROM \($0) WHERE id <= ?" }

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
}
