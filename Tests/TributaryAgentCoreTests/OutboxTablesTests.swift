import Foundation
import GRDB
import Testing
import TributaryCollector
import TributaryStore
import TributaryTestSupport

@testable import TributaryAgentCore

/// The outbox's two tables used in turn (docs/outbox.md, "Two tables in turn"): an acknowledgement
/// moves `delivered_through` instead of deleting rows, and a table whose rows are all delivered is
/// emptied whole.
@Suite("Outbox tables in turn")
struct OutboxTablesTests {
    /// A drained event whose body is JSON of `size` bytes or a little more.
    static func row(_ seq: UInt64, size: Int = 0) -> Outbox.Row {
        var row = OutboxTests.row(seq)
        row.body = Array(#"{"event_id":"e\#(seq)","pad":"\#(String(repeating: "x", count: size))"}"#.utf8)
        return row
    }

    /// WAL frames in the outbox's WAL file (a 32-byte header, then a 24-byte header and a page each).
    static func walFrames(_ outbox: Outbox) -> Int { max(0, outbox.walFileBytes - 32) / (24 + 16_384) }

    /// The rows each table holds, waiting or delivered.
    static func tableCounts(_ outbox: Outbox) throws -> [Int] {
        try outbox.writer.read { db in
            try ["outbox_0", "outbox_1"].map { try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM \($0)") ?? 0 }
        }
    }

    static func pageCounts(_ outbox: Outbox) throws -> (pages: Int, free: Int) {
        try outbox.writer.read { db in
            let pages = try Int.fetchOne(db, sql: "PRAGMA page_count") ?? 0
            return (pages, try Int.fetchOne(db, sql: "PRAGMA freelist_count") ?? 0)
        }
    }

    @Test("an acknowledgement writes a few pages into the WAL, not the pages of its rows; an emptied table's pages are reused")
    func acknowledgementWritesFewPages() throws {
        try withTemporaryGroup { dir in
            let outbox = try Outbox(path: dir + "/outbox.sqlite")
            for start in stride(from: UInt64(1), through: 4_000, by: 1_000) {
                try outbox.insertDrained((start..<start + 1_000).map { .event(Self.row($0, size: 800)) })
            }
            let drainedPages = try Self.pageCounts(outbox).pages
            #expect(drainedPages > 200, "4,000 events of 0.8 KiB fill about 200 pages of 16 KiB")

            // Half of them: `delivered_through` moves, no row is deleted.
            let first = try outbox.nextBatch(maxCount: 2_000, maxBytes: .max)
            #expect(try outbox.checkpoint() && outbox.walFileBytes == 0)
            try outbox.acknowledge(try #require(first.first?.batchID))
            #expect(Self.walFrames(outbox) <= 6, "deleting the batch's rows wrote about 110 pages")
            #expect(try Self.tableCounts(outbox) == [4_000, 0], "delivered rows wait for their table to empty")
            #expect(try outbox.pending().count == 2_000)

            // The other half: every row of the table is delivered, and it is emptied whole.
            let second = try outbox.nextBatch(maxCount: 2_000, maxBytes: .max)
            #expect(second.map(\.seq) == Array(2_001...4_000))
            #expect(try outbox.checkpoint() && outbox.walFileBytes == 0)
            try outbox.acknowledge(try #require(second.first?.batchID))
            #expect(Self.walFrames(outbox) <= 8, "emptying the table frees its pages without writing them")
            #expect(try Self.tableCounts(outbox) == [0, 0] && outbox.pending().count == 0)
            let emptied = try Self.pageCounts(outbox)
            #expect(emptied.free >= drainedPages - 10, "the table's pages are free")

            // The next drain takes the free pages: the file does not grow.
            for start in stride(from: UInt64(4_001), through: 8_000, by: 1_000) {
                try outbox.insertDrained((start..<start + 1_000).map { .event(Self.row($0, size: 800)) })
            }
            #expect(try Self.pageCounts(outbox).pages <= emptied.pages + 4)
            #expect(try outbox.nextBatch(maxCount: 10, maxBytes: .max).map(\.seq) == Array(4_001...4_010))
            #expect(try outbox.integrityCheck() == "ok")
        }
    }

    @Test("every statement on one table finds its rows through the B-tree, none scans the table")
    func queryPlans() throws {
        try withTemporaryGroup { dir in
            let outbox = try Outbox(path: dir + "/outbox.sqlite")
            let plans = try outbox.writer.read { db in
                try Outbox.statementsOnOneTable.map { sql in
                    let arguments = StatementArguments(Array(repeating: 0, count: sql.filter { $0 == "?" }.count))
                    let rows = try GRDB.Row.fetchAll(db, sql: "EXPLAIN QUERY PLAN " + sql, arguments: arguments)
                    return (sql, rows.map { $0["detail"] as String }.joined(separator: "; "))
                }
            }
            #expect(plans.count == 20)
            for (sql, plan) in plans {
                #expect(!plan.contains("SCAN outbox_"), "\(sql): \(plan)")
            }
            #expect(
                plans.contains { $0.1.contains("SEARCH outbox_1") }, "the plans name the tables as SQLite says them")
        }
    }

    @Test("a batch read ahead becomes the batch in flight after a dead letter elsewhere, its rows counted")
    func readAheadAfterDeadLetterElsewhere() throws {
        try withTemporaryGroup { dir in
            let outbox = try Outbox(path: dir + "/outbox.sqlite")
            try outbox.insertDrained((1...10).map { .event(Self.row($0)) })
            let firstID = try #require(try outbox.nextBatch(maxCount: 4, maxBytes: .max).first?.batchID)
            let next = try #require(try outbox.peekBatch(after: firstID, maxCount: 4, maxBytes: .max) { _ in })
            // A corrupt store record drained meanwhile: a dead letter, after every row waiting.
            try outbox.insertDrained([.corrupt(seq: 11, raw: [1, 2, 3], reason: "test")])
            #expect(try outbox.counters().deadLetters == 1)
            #expect(try outbox.acknowledge(firstID, then: next))
            let inFlight = try outbox.nextBatch(maxCount: 100, maxBytes: .max)
            #expect(inFlight.map(\.seq) == [5, 6, 7, 8] && inFlight.allSatisfy { $0.batchID == next.id })
        }
    }

    @Test("ids are never handed out twice, also after the last row waiting went to the dead letters")
    func idsNotReused() throws {
        try withTemporaryGroup { dir in
            let outbox = try Outbox(path: dir + "/outbox.sqlite")
            try outbox.insertDrained((1...3).map { .event(Self.row($0)) })
            let rows = try outbox.nextBatch(maxCount: 3, maxBytes: .max)
            try outbox.deadLetter(rows[2], status: 400, reason: "HTTP 400")
            try outbox.insertDrained([.event(Self.row(4))])
            #expect(try outbox.nextBatch(maxCount: 10, maxBytes: .max).map(\.id) == [1, 2, 4])
            #expect(try outbox.replayDeadLetters() == 1)
            let ids = try outbox.writer.read { db in try Int64.fetchAll(db, sql: "SELECT id FROM outbox ORDER BY id") }
            #expect(ids == [1, 2, 4, 5])
        }
    }

    @Test("the writer connection zeroes only what it writes anyway (secure_delete FAST)")
    func secureDeleteFast() throws {
        try withTemporaryGroup { dir in
            let outbox = try Outbox(path: dir + "/outbox.sqlite")
            let mode = try outbox.writer.writeWithoutTransaction { db in
                try Int.fetchOne(db, sql: "PRAGMA secure_delete")
            }
            #expect(mode == 2)
        }
    }

    @Test("an acknowledged batch with rows still waiting before it deletes its own rows and no others")
    func acknowledgementAfterWaitingRows() throws {
        try withTemporaryGroup { dir in
            let outbox = try Outbox(path: dir + "/outbox.sqlite")
            try outbox.insertDrained((1...6).map { .event(Self.row($0)) })
            let batch = try outbox.nextBatch(maxCount: 6, maxBytes: .max)
            // Its last rows made a batch of their own (as only an outbox edited by hand has it: bisection
            // keeps the first half), then acknowledged: rows 1 and 2 still wait.
            let last = try outbox.rebatch(Array(batch.suffix(4)))
            try outbox.acknowledge(try #require(last.first?.batchID))
            #expect(try outbox.pending().count == 2 && outbox.counters().delivered == 4)
            #expect(try outbox.nextBatch(maxCount: 10, maxBytes: .max).map(\.seq) == [1, 2])
            #expect(try Self.tableCounts(outbox) == [2, 0], "its rows deleted one by one")
        }
    }

    @Test("ids stay above every delivered one when both tables are empty")
    func idsAfterEmptyTables() throws {
        try withTemporaryGroup { dir in
            let outbox = try Outbox(path: dir + "/outbox.sqlite")
            try outbox.insertDrained((1...3).map { .event(Self.row($0)) })
            let batch = try outbox.nextBatch(maxCount: 3, maxBytes: .max)
            try outbox.acknowledge(try #require(batch.first?.batchID))
            #expect(try Self.tableCounts(outbox) == [0, 0])
            try outbox.insertDrained((4...5).map { .event(Self.row($0)) })
            let next = try outbox.nextBatch(maxCount: 3, maxBytes: .max)
            #expect(
                next.map(\.seq) == [4, 5] && next.map(\.id) == [4, 5], "an id at or below 3 would count as delivered")
        }
    }

    @Test(
        "drains, batches, acknowledgements, dead letters, replays and reopenings through many turns match a model",
        arguments: [(1, 3), (2, 5), (3, 8), (4, 1)] as [(UInt64, Int64)])
    func model(seed: UInt64, turnRows: Int64) throws {
        var rng = SplitMix64(seed: seed)
        func random(_ bound: Int) -> Int { Int(rng.next() % UInt64(bound)) }
        try withTemporaryGroup { dir in
            let path = dir + "/outbox.sqlite"
            var outbox = try Outbox(path: path, turnRows: turnRows)
            var waiting: [(seq: UInt64, bytes: Int)] = []  // in upload order
            var refused: [(seq: UInt64, bytes: Int)] = []  // in the order they were refused
            var nextSeq: UInt64 = 1
            var delivered = 0
            var turns = 0
            var newer = 0

            for step in 0..<400 {
                switch random(12) {
                case 0...2:
                    let rows = (0..<(1 + random(12))).map { _ in
                        defer { nextSeq += 1 }
                        return Self.row(nextSeq, size: random(60))
                    }
                    try outbox.insertDrained(rows.map { .event($0) })
                    waiting += rows.map { ($0.seq, $0.body.count) }
                case 3...5:
                    // Bounded by bytes now and then: a batch that stops at the end of the older table
                    // because of its bytes must not go on into the newer one.
                    let maxBytes = random(3) == 0 ? 1 + random(200) : Int.max
                    let batch = try outbox.nextBatch(maxCount: 1 + random(8), maxBytes: maxBytes)
                    #expect(batch.map(\.seq) == waiting.prefix(batch.count).map(\.seq), "step \(step)")
                    #expect(batch.isEmpty == waiting.isEmpty, "step \(step)")
                    #expect(batch.count <= 1 || batch.map(\.body.count).reduce(0, +) <= maxBytes, "step \(step)")
                    if let id = batch.first?.batchID, random(4) != 0 {
                        try outbox.acknowledge(id)
                        waiting.removeFirst(batch.count)
                        delivered += batch.count
                    }
                case 6:
                    let batch = try outbox.nextBatch(maxCount: 1 + random(4), maxBytes: .max)
                    guard !batch.isEmpty else { break }
                    let index = random(batch.count)
                    try outbox.deadLetter(batch[index], status: 400, reason: "HTTP 400")
                    refused.append(waiting.remove(at: index))
                case 7:
                    #expect(try outbox.replayDeadLetters() == refused.count)
                    waiting += refused
                    refused = []
                case 8:
                    let batch = try outbox.nextBatch(maxCount: 2 + random(6), maxBytes: .max)
                    guard batch.count > 1 else { break }
                    // A batch that is not the oldest rows waiting (only an outbox edited by hand has one).
                    let suffix = try outbox.rebatch(Array(batch.dropFirst(1 + random(batch.count - 1))))
                    try outbox.acknowledge(try #require(suffix.first?.batchID))
                    waiting.removeSubrange(batch.count - suffix.count..<batch.count)
                    delivered += suffix.count
                case 9, 10:
                    // As the agent sends: the batch after the one in flight read ahead, perhaps a drain
                    // meanwhile (which may empty a table and turn them), then both in one acknowledgement.
                    let batch = try outbox.nextBatch(maxCount: 1 + random(6), maxBytes: .max)
                    guard let id = batch.first?.batchID else { break }
                    var peeked: [UInt64] = []
                    let next = try outbox.peekBatch(after: id, maxCount: 1 + random(6), maxBytes: 1 + random(300)) {
                        let eventID = try #require(JSONFields.string("event_id", in: Array($0.body)))
                        peeked.append(try #require(UInt64(eventID.dropFirst())))
                    }
                    #expect(peeked == waiting.dropFirst(batch.count).prefix(peeked.count).map(\.seq), "step \(step)")
                    if random(2) == 0 {
                        let rows = (0..<(1 + random(6))).map { _ in
                            defer { nextSeq += 1 }
                            return Self.row(nextSeq, size: random(60))
                        }
                        try outbox.insertDrained(rows.map { .event($0) })
                        waiting += rows.map { ($0.seq, $0.body.count) }
                    }
                    let madeInFlight = try outbox.acknowledge(id, then: next)
                    waiting.removeFirst(batch.count)
                    delivered += batch.count
                    #expect(madeInFlight == (next != nil), "step \(step)")
                    if let next, madeInFlight {
                        if random(2) == 0 {
                            let inFlight = try outbox.nextBatch(maxCount: 100, maxBytes: .max)
                            #expect(
                                inFlight.count == next.count && inFlight.allSatisfy { $0.batchID == next.id },
                                "step \(step)")
                            #expect(inFlight.map(\.seq) == peeked, "step \(step)")
                        } else {
                            // Acknowledged as read ahead, on the count and bytes it recorded (the checks
                            // below compare them with the model's).
                            #expect(next.bytes == waiting.prefix(next.count).map(\.bytes).reduce(0, +), "step \(step)")
                            try outbox.acknowledge(next.id)
                            waiting.removeFirst(next.count)
                            delivered += next.count
                        }
                    }
                default:
                    outbox = try Outbox(path: path, turnRows: turnRows)
                }

                let state = try outbox.writer.read { db in
                    let tables = try Outbox.Tables.read(db)
                    let view = try GRDB.Row.fetchAll(db, sql: "SELECT id, seq, LENGTH(body) FROM outbox ORDER BY id")
                    let bounds = try ["outbox_0", "outbox_1"].map {
                        try GRDB.Row.fetchOne(db, sql: "SELECT MIN(id), MAX(id), COUNT(*) FROM \($0)")!
                    }
                    return (tables, view, bounds)
                }
                let (tables, view, bounds) = state
                #expect(
                    view.map { UInt64($0[1] as Int64) } == waiting.map(\.seq),
                    "step \(step): the view shows what waits")
                #expect(view.map { $0[2] as Int } == waiting.map(\.bytes), "step \(step)")
                let ids = view.map { $0[0] as Int64 }
                #expect(zip(ids, ids.dropFirst()).allSatisfy(<), "step \(step): ids in upload order")
                #expect(ids.allSatisfy { $0 > tables.deliveredThrough }, "step \(step)")
                let pending = try outbox.pending()
                #expect(
                    pending.count == waiting.count && pending.bytes == waiting.map(\.bytes).reduce(0, +),
                    "step \(step)")
                #expect(try outbox.counters().delivered == delivered, "step \(step)")
                // Every id of the newer table is above every id of the older one.
                if let olderMax = bounds[tables.older][1] as Int64?, let newerMin = bounds[tables.newer][0] as Int64? {
                    #expect(olderMax < newerMin, "step \(step)")
                }
                // A table holding no row that waits has been emptied, and one holding some keeps few
                // delivered rows.
                for table in 0...1 where bounds[table][2] as Int > 0 {
                    let first = bounds[table][0] as Int64
                    #expect((bounds[table][1] as Int64) > tables.deliveredThrough, "step \(step): table \(table)")
                    #expect(
                        tables.deliveredThrough - first + 1 <= Outbox.Tables.heldRows(turnRows: turnRows),
                        "step \(step): table \(table)")
                }
                if tables.newer != newer {
                    turns += 1
                    newer = tables.newer
                }
            }
            #expect(turns >= 2, "the tables turned \(turns) times")
            #expect(try outbox.integrityCheck() == "ok")

            // Everything delivered: both tables empty.
            while let id = try outbox.nextBatch(maxCount: 50, maxBytes: .max).first?.batchID {
                try outbox.acknowledge(id)
            }
            #expect(try Self.tableCounts(outbox) == [0, 0] && outbox.pending().count == 0)
        }
    }

    @Test("a table holding more delivered rows than it may, while some of its rows wait, deletes them")
    func heldRowsBounded() throws {
        try withTemporaryGroup { dir in
            // Tables turn every 2 ids, and each holds at most 8 delivered rows while some of its rows wait.
            let outbox = try Outbox(path: dir + "/outbox.sqlite", turnRows: 2)
            try outbox.insertDrained((1...30).map { .event(Self.row($0)) })
            try outbox.insertDrained((31...32).map { .event(Self.row($0)) })  // the tables turn first
            #expect(try Self.tableCounts(outbox) == [30, 2])
            let ten = try outbox.nextBatch(maxCount: 10, maxBytes: .max)
            try outbox.acknowledge(try #require(ten.first?.batchID))
            #expect(try Self.tableCounts(outbox) == [20, 2], "10 delivered rows are more than 8: deleted")
            let five = try outbox.nextBatch(maxCount: 5, maxBytes: .max)
            try outbox.acknowledge(try #require(five.first?.batchID))
            #expect(try Self.tableCounts(outbox) == [20, 2], "5 are not: kept until the table empties")
            #expect(try outbox.nextBatch(maxCount: 100, maxBytes: .max).map(\.seq) == Array(16...32))
            #expect(try outbox.pending().count == 17 && outbox.integrityCheck() == "ok")
        }
    }

    /// Builds an outbox as an agent of v6 left it: one table with rows 3 to 5 waiting (1 and 2 delivered),
    /// in a batch in flight that records no count. Returns that batch's id.
    static func makeV6Outbox(at path: String) throws -> String {
        let outbox = try Outbox(path: path)
        try outbox.insertDrained((1...5).map { .event(Self.row($0, size: 10)) })
        let batch = try outbox.nextBatch(maxCount: 2, maxBytes: .max)
        try outbox.acknowledge(try #require(batch.first?.batchID))
        let inFlightID = try #require(try outbox.nextBatch(maxCount: 3, maxBytes: .max).first?.batchID)
        try outbox.writer.writeWithoutTransaction { db in
            try db.execute(sql: """
                DELETE FROM outbox_0 WHERE id <= 2;
                DROP VIEW outbox;
                DROP TABLE outbox_1;
                ALTER TABLE outbox_0 RENAME TO outbox;
                ALTER TABLE in_flight DROP COLUMN event_count;
                ALTER TABLE in_flight DROP COLUMN body_bytes;
                DELETE FROM agent_state WHERE key IN ('newer_table', 'delivered_through');
                DELETE FROM grdb_migrations WHERE identifier = 'v7: two tables in turn';
                """)
        }
        return inFlightID
    }

    @Test("an outbox of v6 is migrated: its rows keep their ids in outbox_0, and its batch in flight is counted")
    func migrateFromV6() throws {
        try withTemporaryGroup { dir in
            // Acknowledged straight away (as a deferred acknowledgement would be): counted then.
            let path = dir + "/outbox.sqlite"
            let inFlightID = try Self.makeV6Outbox(at: path)
            var outbox = try Outbox(path: path)
            #expect(try Self.tableCounts(outbox) == [3, 0])
            #expect(try outbox.writer.read { db in try Outbox.Tables.read(db).deliveredThrough } == 2)
            #expect(
                try outbox.rows(inBatch: inFlightID).map(\.id) == [3, 4, 5],
                "the batch in flight keeps its id and rows")
            try outbox.acknowledge(inFlightID)
            #expect(try outbox.pending() == (0, 0, 0) && outbox.counters().delivered == 5)
            #expect(try Self.tableCounts(outbox) == [0, 0] && outbox.integrityCheck() == "ok")

            // Cut down by a smaller batch: its first rows become a batch of their own, counted.
            let other = dir + "/other.sqlite"
            _ = try Self.makeV6Outbox(at: other)
            outbox = try Outbox(path: other)
            let cut = try outbox.nextBatch(maxCount: 2, maxBytes: .max)
            #expect(cut.map(\.seq) == [3, 4])
            try outbox.acknowledge(try #require(cut.first?.batchID))
            #expect(try outbox.pending().count == 1 && outbox.counters().delivered == 4)
            #expect(try outbox.nextBatch(maxCount: 10, maxBytes: .max).map(\.seq) == [5])

            // Read again whole: its count and bytes recorded then, and the acknowledgement takes them.
            let third = dir + "/third.sqlite"
            let thirdID = try Self.makeV6Outbox(at: third)
            outbox = try Outbox(path: third)
            let whole = try outbox.nextBatch(maxCount: 10, maxBytes: .max)
            #expect(whole.map(\.seq) == [3, 4, 5] && whole.allSatisfy { $0.batchID == thirdID })
            let recorded = try outbox.writer.read { db in
                try GRDB.Row.fetchOne(db, sql: "SELECT event_count, body_bytes FROM in_flight")
            }
            #expect(recorded?[0] as Int? == 3 && recorded?[1] as Int? == whole.map(\.body.count).reduce(0, +))
            try outbox.acknowledge(thirdID)
            #expect(try outbox.pending() == (0, 0, 0) && outbox.counters().delivered == 5)
        }
    }
}
