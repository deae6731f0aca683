import Foundation
import GRDB
import Logging
import Testing
import Tributary
import TributarySQLite
import TributaryStore
import TributaryTestSupport

@testable import TributaryAgentCore

@Suite("Outbox and drain")
struct OutboxTests {
    static let logger = Logger(label: "test")

    static func row(_ seq: UInt64, eventID: String? = nil) -> Outbox.Row {
        Outbox.Row(
            id: 0, seq: seq, eventID: eventID ?? "e\(seq)", producer: "app", producerKind: .app, producerSeq: seq,
            wallMillis: 1, bootNanos: 2, bootID: .current, body: Array(#"{"event_id":"e\#(seq)"}"#.utf8), batchID: nil)
    }

    /// Dead-letters the next `count` waiting events (as refused with 400); at least one must be waiting.
    static func deadLetterNext(_ outbox: Outbox, _ count: Int = 1) throws {
        let rows = try outbox.nextBatch(maxCount: count, maxBytes: .max)
        try #require(!rows.isEmpty)
        for row in rows { try outbox.deadLetter(row, status: 400, reason: "HTTP 400") }
    }

    @Test("the fail-stop rule takes SQLite's I/O and corruption errors and LMDB's EIO, not a full disk nor any other error")
    func fatalIOMatches() {
        #expect(FatalIO.matches(DatabaseError(resultCode: .SQLITE_IOERR)))
        #expect(FatalIO.matches(DatabaseError(resultCode: .SQLITE_IOERR_FSYNC)), "an extended code: a failed fsync")
        #expect(FatalIO.matches(DatabaseError(resultCode: .SQLITE_CORRUPT)))
        #expect(!FatalIO.matches(DatabaseError(resultCode: .SQLITE_FULL)), "space runs out: back-pressure, not fail-stop")
        #expect(!FatalIO.matches(DatabaseError(resultCode: .SQLITE_BUSY)))
        #expect(FatalIO.matches(StoreError(.lmdb, "commit failed", lmdbCode: EIO)))
        #expect(!FatalIO.matches(StoreError(.storeFull, "the store is full")))
        #expect(!FatalIO.matches(StoreError(.lmdb, "no space", lmdbCode: ENOSPC)))
        #expect(!FatalIO.matches(CancellationError()))
    }

    @Test("inserting drained events is idempotent and advances last_drained_seq")
    func idempotentInsert() throws {
        try withTemporaryGroup { dir in
            let outbox = try Outbox(path: dir + "/outbox.sqlite")
            #expect(try outbox.insertDrained((1...5).map { .event(Self.row($0)) }) == 5)
            #expect(try outbox.lastDrainedSeq() == 5)
            // The same chunk again (a crash before the store delete): nothing copied twice.
            #expect(try outbox.insertDrained((1...5).map { .event(Self.row($0)) }) == 0)
            // A later chunk overlapping the old one.
            #expect(try outbox.insertDrained((4...8).map { .event(Self.row($0)) }) == 3)
            #expect(try outbox.pending().count == 8)
            #expect(try outbox.counters().duplicatesSkipped == 7)
            // Within one chunk too, a seq not above every one before it is skipped (no index makes seq
            // unique in the table: last_drained_seq and store order do).
            #expect(try outbox.insertDrained([9, 9, 8, 10].map { .event(Self.row($0)) }) == 2)
            #expect(try outbox.lastDrainedSeq() == 10 && outbox.counters().duplicatesSkipped == 9)
            #expect(try Self.outboxIndexes(outbox).isEmpty, "the outbox table has no index besides its row ids")
            #expect(try outbox.integrityCheck() == "ok")
            #expect(try outbox.synchronousMode() == 2, "the outbox must commit with synchronous=FULL")
        }
    }

    @Test("the drain position: the record drained last still at its seq, or deleted, changes nothing; seqs handed out again take it back")
    func drainPosition() throws {
        try withTemporaryGroup { dir in
            let outbox = try Outbox(path: dir + "/outbox.sqlite")
            func record(_ seq: UInt64, _ text: String) -> Outbox.DrainedChunk {
                var chunk = Outbox.DrainedChunk()
                chunk.entries = [.corrupt(seq: seq, raw: Array(text.utf8), reason: "test")]
                chunk.lastRecordIdentity = Outbox.recordIdentity(Array(text.utf8))
                return chunk
            }
            let identity = { (text: String) in Outbox.recordIdentity(Array(text.utf8)) }
            #expect(try outbox.reconcile(lastAssignedSeq: 0, oldestSeq: nil) { _ in nil } == nil, "nothing drained yet")
            try outbox.insertDrained(record(9, "the ninth"))
            // Deleted once drained, or still there after a crash before the delete (once or more): in place.
            #expect(try outbox.reconcile(lastAssignedSeq: 9, oldestSeq: nil) { _ in nil } == nil)
            #expect(try outbox.reconcile(lastAssignedSeq: 12, oldestSeq: 5) { _ in identity("the ninth") } == nil)
            #expect(try outbox.lastDrainedSeq() == 9)
            // Another record at seq 9, or fewer seqs handed out: an earlier copy of the store.
            let other = try #require(try outbox.reconcile(lastAssignedSeq: 12, oldestSeq: 5) { _ in identity("another") })
            #expect(other == (before: 9, after: 4))
            #expect(try outbox.lastDrainedSeq() == 4)
            try outbox.insertDrained(record(9, "the ninth"))
            let fewer = try #require(try outbox.reconcile(lastAssignedSeq: 6, oldestSeq: nil) { _ in nil })
            #expect(fewer == (before: 9, after: 6))

            // An agent from before identities were kept drained on to 20 (and stopped before its store
            // delete): the identity recorded is seq 9's, not 20's, and says nothing about the record there.
            try outbox.insertDrained(record(9, "the ninth"))
            try outbox.writer.write { db in
                try db.execute(sql: "UPDATE agent_state SET value = 20 WHERE key = 'last_drained_seq'")
            }
            #expect(try outbox.reconcile(lastAssignedSeq: 25, oldestSeq: 15) { $0 == 20 ? identity("the twentieth") : nil } == nil)
            #expect(try outbox.lastDrainedSeq() == 20)
        }
    }

    @Test("dead letters are replayed in the order they were refused, a chunk per transaction, their counters kept")
    func replayOrderAndChunks() throws {
        try withTemporaryGroup { dir in
            let outbox = try Outbox(path: dir + "/outbox.sqlite")
            _ = try outbox.adoptStore(1)
            let count = Outbox.replayChunk * 2 + 50
            try outbox.insertDrained((1...UInt64(count)).map { .event(Self.row(500 + $0)) })
            try Self.deadLetterNext(outbox, count)
            // The store created anew (an app reinstalled): its seqs start again, below the first store's.
            _ = try outbox.adoptStore(2)
            try outbox.insertDrained([.event(Self.row(3, eventID: "new-3"))])
            try Self.deadLetterNext(outbox)
            let bytes = try outbox.deadLetterBytes()
            #expect(try outbox.replayDeadLetters() == count + 1)
            let replayed = try outbox.nextBatch(maxCount: count + 10, maxBytes: .max)
            #expect(replayed.map(\.seq) == (501...UInt64(500 + count)).map { $0 } + [3], "refused first, replayed first")
            #expect(try outbox.deadLetterBytes() == 0 && outbox.pending().count == count + 1)
            #expect(try outbox.pending().bytes == bytes)
            #expect(try outbox.deadLetters().isEmpty)
        }
    }

    @Test("the run of dead letters is kept per destination, with the event a halt held back, and a delivery ends it")
    func deadLetterRun() throws {
        try withTemporaryGroup { dir in
            let path = dir + "/outbox.sqlite"
            let outbox = try Outbox(path: path)
            try outbox.insertDrained((1...10).map { .event(Self.row($0)) })
            #expect(try outbox.deadLetterRun(destination: 7) == (0, nil))
            try Self.deadLetterNext(outbox, 3)
            try outbox.holdAfterHalt(seq: 4)
            // Kept for the next run of the agent (a new connection), to the same destination.
            #expect(try Outbox(path: path).deadLetterRun(destination: 7) == (3, 4))
            // Another destination is judged afresh, and so is the first one again after it.
            #expect(try outbox.deadLetterRun(destination: 8) == (0, nil))
            try Self.deadLetterNext(outbox)
            #expect(try outbox.deadLetterRun(destination: 8) == (1, nil))
            #expect(try outbox.deadLetterRun(destination: 7) == (0, nil))
            try Self.deadLetterNext(outbox)
            try outbox.holdAfterHalt(seq: 6)
            let batch = try outbox.nextBatch(maxCount: 2, maxBytes: .max)
            try outbox.acknowledge(try #require(batch.first?.batchID))
            #expect(try outbox.deadLetterRun(destination: 7) == (0, nil), "a delivery ends the run and the hold")
            // Another store's seqs (an app reinstalled) name other events: a hold is forgotten with them.
            try outbox.holdAfterHalt(seq: 8)
            _ = try outbox.adoptStore(1)
            _ = try outbox.adoptStore(2)
            #expect(try outbox.deadLetterRun(destination: 7).heldSeq == nil)
        }
    }

    @Test("pending counters match the table through insert, ack, dead letter and replay")
    func pendingCounters() throws {
        try withTemporaryGroup { dir in
            let outbox = try Outbox(path: dir + "/outbox.sqlite")
            func expectConsistent(sourceLocation: SourceLocation = #_sourceLocation) throws {
                let all = try outbox.writer.read { db in
                    try GRDB.Row.fetchOne(db, sql: "SELECT COUNT(*), COALESCE(SUM(LENGTH(body)), 0) FROM outbox")!
                }
                let pending = try outbox.pending()
                #expect(pending.count == all[0] as Int && pending.bytes == all[1] as Int, sourceLocation: sourceLocation)
            }
            try outbox.insertDrained((1...20).map { .event(Self.row($0)) })
            try outbox.insertDrained((15...25).map { .event(Self.row($0)) })
            try expectConsistent()
            let batch = try outbox.nextBatch(maxCount: 5, maxBytes: .max)
            try outbox.acknowledge(batch[0].batchID!)
            try expectConsistent()
            let next = try outbox.nextBatch(maxCount: 5, maxBytes: .max)
            try outbox.deadLetter(next[2], status: 400, reason: "HTTP 400")
            try expectConsistent()
            try outbox.replayDeadLetters()
            try expectConsistent()
            #expect(try outbox.pending().count == 20)
        }
    }

    @Test("the status file's figures count a delivered batch whose acknowledgement is not recorded yet once: before the acknowledgement commits, and after it")
    func statusFiguresCountASettlingBatchOnce() throws {
        try withTemporaryGroup { dir in
            let outbox = try Outbox(path: dir + "/outbox.sqlite")
            try outbox.insertDrained((1...10).map { .event(Self.row($0)) })
            let batch = try outbox.nextBatch(maxCount: 4, maxBytes: .max)
            let settling = (batchID: try #require(batch.first?.batchID), count: batch.count)
            // The collector acknowledged it; the outbox does not know yet: delivered, not waiting.
            let before = try outbox.statusFigures(settling: settling)
            #expect(before.counters.delivered == 4 && before.counters.batches == 1 && before.pending.count == 6)
            // The acknowledgement commits while the status writer still holds the batch it read before:
            // the figures were read apart, and the batch counted twice (delivered 8 in 2 batches, 2 waiting).
            try outbox.acknowledge(settling.batchID)
            let after = try outbox.statusFigures(settling: settling)
            #expect(after.counters.delivered == 4 && after.counters.batches == 1 && after.pending.count == 6, "\(after)")
            #expect(try outbox.statusFigures(settling: nil).counters == after.counters)
        }
    }

    @Test("batches: oldest first, stable id until acknowledged, bounded by count and bytes")
    func batches() throws {
        try withTemporaryGroup { dir in
            let outbox = try Outbox(path: dir + "/outbox.sqlite")
            try outbox.insertDrained((1...10).map { .event(Self.row($0)) })
            let first = try outbox.nextBatch(maxCount: 4, maxBytes: 1 << 20)
            #expect(first.map(\.seq) == [1, 2, 3, 4])
            let again = try outbox.nextBatch(maxCount: 4, maxBytes: 1 << 20)
            #expect(again.map(\.seq) == [1, 2, 3, 4] && again[0].batchID == first[0].batchID)
            try outbox.acknowledge(first[0].batchID!)
            let bytesBound = try outbox.nextBatch(maxCount: 100, maxBytes: 40)
            #expect(bytesBound.map(\.seq) == [5, 6])
            #expect(try outbox.counters().delivered == 4)
        }
    }

    @Test("a batch read ahead follows the one in flight and becomes it only in that one's acknowledgement")
    func readAhead() throws {
        try withTemporaryGroup { dir in
            let outbox = try Outbox(path: dir + "/outbox.sqlite")
            try outbox.insertDrained((1...10).map { .event(Self.row($0)) })
            let first = try outbox.nextBatch(maxCount: 4, maxBytes: 1 << 20)
            let firstID = try #require(first.first?.batchID)
            var bodies: [String] = []
            let next = try #require(try outbox.peekBatch(after: firstID, maxCount: 4, maxBytes: 1 << 20) { event in
                bodies.append(String(decoding: event.body, as: UTF8.self))
            })
            #expect(next.count == 4 && bodies == (5...8).map { #"{"event_id":"e\#($0)"}"# })
            #expect(try outbox.peekBatch(after: "not-in-flight", maxCount: 4, maxBytes: 1 << 20) { _ in } == nil)
            // Read ahead, nothing changed: the batch in flight is still the first, with its rows.
            #expect(try outbox.nextBatch(maxCount: 4, maxBytes: 1 << 20).map(\.seq) == [1, 2, 3, 4])
            #expect(try outbox.acknowledge("not-in-flight", then: next) == false)
            #expect(try outbox.acknowledge(firstID, then: next))
            // The acknowledgement commits with synchronous=NORMAL; everything else stays FULL.
            #expect(try outbox.synchronousMode() == 2, "synchronous=FULL must be back after an acknowledgement")
            let second = try outbox.nextBatch(maxCount: 100, maxBytes: 1 << 20)
            #expect(second.map(\.seq) == [5, 6, 7, 8] && second.allSatisfy { $0.batchID == next.id })
            #expect(try outbox.counters().delivered == 4)
            // Bounded by bytes like any batch; nil when nothing follows.
            let byBytes = try #require(try outbox.peekBatch(after: next.id, maxCount: 100, maxBytes: 30) { _ in })
            #expect(byBytes.count == 1)
            try outbox.acknowledge(next.id)
            let last = try outbox.nextBatch(maxCount: 100, maxBytes: 1 << 20)
            let lastID = try #require(last.first?.batchID)
            #expect(try outbox.peekBatch(after: lastID, maxCount: 100, maxBytes: 1 << 20) { _ in } == nil)
        }
    }

    @Test("the agent's reads and writes keep the connection's statements compiled: nothing expires them")
    func statementsStayCompiled() throws {
        try withTemporaryGroup { dir in
            let outbox = try Outbox(path: dir + "/outbox.sqlite")
            var seq: UInt64 = 0
            var inFlight = try outbox.nextBatch(maxCount: 4, maxBytes: 1 << 20).first?.batchID
            // A loop turn's worth, three times: a drained chunk, the status figures, a batch read
            // ahead beside the one in flight, the acknowledgement that makes it the batch in flight.
            for _ in 1...3 {
                try outbox.insertDrained((seq + 1...seq + 8).map { .event(Self.row($0)) })
                seq += 8
                _ = try (outbox.pending(), outbox.counters(), outbox.lastDrainedSeq())
                guard let batchID = inFlight else {
                    inFlight = try outbox.nextBatch(maxCount: 4, maxBytes: 1 << 20).first?.batchID
                    continue
                }
                let next = try #require(try outbox.peekBatch(after: batchID, maxCount: 4, maxBytes: 1 << 20) { _ in })
                #expect(try outbox.acknowledge(batchID, then: next))
                inFlight = next.id
            }
            // GRDB's `read` switched `PRAGMA query_only` on and off around each read, which expired every
            // statement: each of these was compiled again at its next use (Outbox.read).
            let recompiles = try outbox.read { db in
                try (Outbox.selectBatchSQL + Outbox.insertSQL).map { RawStatement(try db.cachedStatement(sql: $0)).recompiles }
            }
            #expect(recompiles.allSatisfy { $0 == 0 }, "recompiled: \(recompiles)")
        }
    }

    @Test("a batch read ahead whose rows changed meanwhile is not made the batch in flight")
    func staleReadAhead() throws {
        try withTemporaryGroup { dir in
            let outbox = try Outbox(path: dir + "/outbox.sqlite")
            try outbox.insertDrained((1...10).map { .event(Self.row($0)) })
            let first = try outbox.nextBatch(maxCount: 4, maxBytes: 1 << 20)
            let firstID = try #require(first.first?.batchID)
            let next = try #require(try outbox.peekBatch(after: firstID, maxCount: 4, maxBytes: 1 << 20) { _ in })
            // One of its rows leaves the outbox before the acknowledgement (a dead letter).
            var row6 = Self.row(6)
            row6.id = first[0].id + 5  // ids are consecutive from the first batch's
            try outbox.deadLetter(row6, status: 400, reason: "test")
            #expect(try outbox.acknowledge(firstID, then: next) == false, "the first is acknowledged all the same")
            #expect(try outbox.counters().delivered == 4)
            let rebuilt = try outbox.nextBatch(maxCount: 4, maxBytes: 1 << 20)
            #expect(rebuilt.map(\.seq) == [5, 7, 8, 9] && rebuilt[0].batchID != next.id)
        }
    }

    @Test("the batch in flight is a range of ids: later rows, replays and dead letters never change it")
    func inFlightRange() throws {
        try withTemporaryGroup { dir in
            let outbox = try Outbox(path: dir + "/outbox.sqlite")
            try outbox.insertDrained((1...5).map { .event(Self.row($0)) })
            let first = try outbox.nextBatch(maxCount: 3, maxBytes: .max)
            let firstID = try #require(first.first?.batchID)
            #expect(first.map(\.seq) == [1, 2, 3])
            // Rows drained while the batch is in flight go after it, not into it.
            try outbox.insertDrained((6...8).map { .event(Self.row($0)) })
            #expect(try outbox.nextBatch(maxCount: 100, maxBytes: .max).map(\.seq) == [1, 2, 3])
            #expect(try outbox.rows(inBatch: firstID).map(\.seq) == [1, 2, 3])

            // Bisection: one row becomes a batch of its own; the old batch is over.
            let alone = try outbox.rebatch([first[0]])
            #expect(alone.map(\.seq) == [1] && alone[0].batchID != firstID)
            #expect(try outbox.rows(inBatch: firstID).isEmpty)
            // Dead-lettering that row ends its batch: the next batch is new, from the oldest row left.
            try outbox.deadLetter(alone[0], status: 422, reason: "HTTP 422")
            let next = try outbox.nextBatch(maxCount: 100, maxBytes: .max)
            #expect(next.map(\.seq) == Array(2...8) && next[0].batchID != alone[0].batchID)

            // A replayed dead letter goes to the end, outside the batch in flight.
            #expect(try outbox.replayDeadLetters() == 1)
            #expect(try outbox.rows(inBatch: try #require(next[0].batchID)).map(\.seq) == Array(2...8))
            try outbox.acknowledge(try #require(next[0].batchID))
            #expect(try outbox.nextBatch(maxCount: 100, maxBytes: .max).map(\.seq) == [1])
            #expect(try outbox.pending().count == 1 && outbox.integrityCheck() == "ok")
        }
    }

    @Test("a batch in flight whose range holds no rows any more is never sent empty")
    func emptyInFlightRange() throws {
        try withTemporaryGroup { dir in
            let outbox = try Outbox(path: dir + "/outbox.sqlite")
            try outbox.insertDrained((1...3).map { .event(Self.row($0)) })
            // As an outbox edited by hand could be: in_flight names ids that no row has.
            try outbox.writer.write { db in
                try db.execute(sql: "INSERT INTO in_flight (batch_id, first_id, last_id) VALUES ('gone', 100, 200)")
            }
            let batch = try outbox.nextBatch(maxCount: 10, maxBytes: .max)
            #expect(batch.map(\.seq) == [1, 2, 3] && batch[0].batchID != "gone")
            #expect(try outbox.rows(inBatch: "gone").isEmpty)
        }
    }

    @Test("an outbox written before v3 is upgraded in place: rows, ids and the batch in flight kept")
    func migrateToV3() throws {
        try withTemporaryGroup { dir in
            let path = dir + "/outbox.sqlite"
            try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
            // The schema and state an agent before migration v3 left: batch b-old in flight over seq 1…3.
            let old = try DatabaseQueue(path: path)
            try old.write { db in
                try db.execute(sql: """
                    CREATE TABLE grdb_migrations (identifier TEXT NOT NULL PRIMARY KEY);
                    INSERT INTO grdb_migrations VALUES ('v1'), ('v2: pending counters');
                    CREATE TABLE outbox (
                        id INTEGER PRIMARY KEY, seq INTEGER NOT NULL UNIQUE, event_id TEXT NOT NULL UNIQUE,
                        producer TEXT NOT NULL, producer_kind INTEGER NOT NULL, producer_seq INTEGER NOT NULL,
                        wall_ms INTEGER NOT NULL, boot_ns INTEGER NOT NULL, boot_id BLOB NOT NULL, body BLOB NOT NULL,
                        batch_id TEXT);
                    CREATE INDEX outbox_batch ON outbox(batch_id) WHERE batch_id IS NOT NULL;
                    CREATE TABLE dead_letters (
                        id INTEGER PRIMARY KEY, seq INTEGER NOT NULL, event_id TEXT, producer TEXT, producer_kind INTEGER,
                        producer_seq INTEGER, wall_ms INTEGER, boot_ns INTEGER, boot_id BLOB, status INTEGER NOT NULL,
                        reason TEXT NOT NULL, batch_id TEXT, dead_at_ms INTEGER NOT NULL, body BLOB NOT NULL);
                    CREATE TABLE agent_state (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
                    """)
                for seq in 1...6 {
                    try db.execute(
                        sql: """
                            INSERT INTO outbox (id, seq, event_id, producer, producer_kind, producer_seq, wall_ms, boot_ns,
                                boot_id, body, batch_id)
                            VALUES (?, ?, ?, 'app', 0, ?, 1, 2, zeroblob(16), ?, ?)
                            """,
                        arguments: [seq + 10, seq, "e\(seq)", seq, Data("{\"event_id\":\"e\(seq)\"}".utf8), seq <= 3 ? "b-old" : nil])
                }
                try db.execute(sql: """
                    INSERT INTO agent_state VALUES ('last_drained_seq', 6), ('drained', 6), ('pending_count', 6),
                        ('pending_bytes', (SELECT SUM(LENGTH(body)) FROM outbox));
                    INSERT INTO dead_letters (seq, status, reason, dead_at_ms, body) VALUES (0, 0, 'corrupt', 1, zeroblob(37));
                    """)
            }
            try old.close()

            let outbox = try Outbox(path: path)
            #expect(
                (try FileManager.default.attributesOfItem(atPath: path + "-wal")[.size] as? Int) == 0,
                "the migrations' rebuilds are out of the WAL, and its file cut back")
            let inFlight = try outbox.nextBatch(maxCount: 100, maxBytes: .max)
            #expect(inFlight.map(\.seq) == [1, 2, 3] && inFlight.map(\.id) == [11, 12, 13])
            #expect(inFlight.allSatisfy { $0.batchID == "b-old" }, "the batch in flight keeps its id")
            #expect(try outbox.pending().count == 6 && outbox.lastDrainedSeq() == 6)
            #expect(try outbox.deadLetterBytes() == 37, "v6 counts the dead letters already there")
            try outbox.acknowledge("b-old")
            #expect(try outbox.nextBatch(maxCount: 100, maxBytes: .max).map(\.seq) == [4, 5, 6])
            // No UNIQUE event_id any more: two store records with one event id are two rows.
            #expect(try outbox.insertDrained([.event(Self.row(7, eventID: "e1")), .event(Self.row(8, eventID: "e1"))]) == 2)
            #expect(try outbox.integrityCheck() == "ok")
            #expect(try Self.pageSize(outbox) == 4_096, "an existing outbox keeps its page size")
            #expect(try Self.outboxIndexes(outbox).isEmpty, "v3 dropped the event_id index, v4 the seq index")
        }
    }

    /// The names of the indexes on the outbox tables (SQLite's automatic ones for UNIQUE included).
    static func outboxIndexes(_ outbox: Outbox) throws -> [String] {
        try outbox.writer.read { db in
            try String.fetchAll(db, sql: "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name IN ('outbox_0', 'outbox_1')")
        }
    }

    @Test("a new outbox has 16 KiB pages, kept when it is opened again")
    func pageSize() throws {
        try withTemporaryGroup { dir in
            let path = dir + "/outbox.sqlite"
            do {
                let outbox = try Outbox(path: path)
                #expect(try Self.pageSize(outbox) == 16_384)
                #expect(try outbox.insertDrained((1...50).map { .event(Self.row($0)) }) == 50)
            }
            let outbox = try Outbox(path: path)
            #expect(try Self.pageSize(outbox) == 16_384)
            #expect(try outbox.pending().count == 50 && outbox.integrityCheck() == "ok")
        }
    }

    static func pageSize(_ outbox: Outbox) throws -> Int? {
        try outbox.writer.read { db in try Int.fetchOne(db, sql: "PRAGMA page_size") }
    }

    @Test("dead letters are kept, listed and replayable")
    func deadLetters() throws {
        try withTemporaryGroup { dir in
            let outbox = try Outbox(path: dir + "/outbox.sqlite")
            try outbox.insertDrained((1...3).map { .event(Self.row($0)) } + [.corrupt(seq: 4, raw: [1, 2], reason: "CRC mismatch")])
            let batch = try outbox.nextBatch(maxCount: 3, maxBytes: 1 << 20)
            try outbox.deadLetter(batch[1], status: 422, reason: "HTTP 422: bad property")
            let letters = try outbox.deadLetters()
            #expect(letters.map(\.seq) == [4, 2])
            let e2 = Self.row(2).body.count
            #expect(try outbox.deadLetterBytes() == 2 + e2, "the corrupt record's 2 raw bytes and e2's body")
            #expect(letters[0].reason.contains("CRC mismatch") && letters[0].status == 0)
            #expect(letters[1].status == 422 && letters[1].eventID == "e2")
            #expect(try outbox.pending().count == 2)
            // Replaying chosen ids is all or nothing: an unknown id, or a corrupt record's, moves none.
            let ids = try outbox.deadLetters().map(\.id)
            for wrong in [[ids[1], 999], [ids[0]]] {
                let error = try #require(throws: Outbox.UnknownDeadLetters.self) { try outbox.replayDeadLetters(ids: wrong) }
                #expect(error.ids == wrong.filter { $0 != ids[1] })
                #expect(try outbox.deadLetters().map(\.seq) == [4, 2] && outbox.pending().count == 2)
            }
            #expect(try outbox.replayDeadLetters(ids: [ids[1]]) == 1)
            #expect(try outbox.pending().count == 3)
            #expect(try outbox.deadLetters().map(\.seq) == [4])
            #expect(try outbox.replayDeadLetters() == 0)
            #expect(try outbox.deadLetterBytes() == 2)
            // Dead letters an agent from before v5 adds (it keeps no such count), and the count an agent of
            // v5 keeps in its own key: the outbox's triggers count the first, and ignore the second.
            try outbox.writer.write { db in
                try db.execute(sql: "INSERT INTO dead_letters (seq, status, reason, dead_at_ms, body) VALUES (9, 400, 'old', 1, zeroblob(40))")
                try db.execute(sql: "UPDATE agent_state SET value = 12345 WHERE key = 'dead_letter_bytes'")
            }
            #expect(try outbox.deadLetterBytes() == 42)
            try outbox.writer.write { db in try db.execute(sql: "DELETE FROM dead_letters WHERE seq = 9") }
            #expect(try outbox.deadLetterBytes() == 2)
            // Discarding is all or nothing too, and frees the dead letters' room.
            #expect(throws: Outbox.UnknownDeadLetters.self) { try outbox.discardDeadLetters(ids: [ids[0], 999]) }
            #expect(try outbox.deadLetters().map(\.seq) == [4] && outbox.deadLetterBytes() == 2)
            #expect(try outbox.discardDeadLetters(ids: [ids[0]]) == 1)
            #expect(try outbox.deadLetters().isEmpty && outbox.deadLetterBytes() == 0 && outbox.pending().count == 3)
        }
    }

    @Test("drain moves every event in order, tags _tributary, and empties the store")
    func drain() throws {
        try withTemporaryGroup { group in
            let tracker = try Tracker(configuration: .init(groupDirectory: group))
            for i in 0..<2500 { try tracker.track("E", properties: ["i": .int(Int64(i))]) }
            let outbox = try Outbox(path: group + "-outbox/outbox.sqlite")
            let drainer = Drainer(store: tracker.store, outbox: outbox, chunkSize: 1000, logger: Self.logger)
            #expect(try drainer.drainAvailable() == 2500)
            #expect(try tracker.store.status().pendingEvents == 0)
            let rows = try outbox.nextBatch(maxCount: 3000, maxBytes: .max)
            #expect(rows.map(\.seq) == Array(1...2500))
            let body = try #require(try JSONSerialization.jsonObject(with: Data(rows[41].body)) as? [String: Any])
            let tag = try #require(body["_tributary"] as? [String: Any])
            #expect(tag["seq"] as? Int == 42 && tag["producer"] as? String == "app")
            #expect(tag["producer_kind"] as? String == "app" && tag["producer_seq"] as? Int == 42)
            #expect((body["properties"] as? [String: Any])?["i"] as? Int == 41)
        }
    }

    @Test("a drain returns once it has caught up with the store, though a producer keeps appending")
    func drainCatchesUp() throws {
        try withTemporaryGroup { group in
            let tracker = try Tracker(configuration: .init(groupDirectory: group))
            for _ in 0..<250 { try tracker.track("Early") }
            let outbox = try Outbox(path: group + "-outbox/outbox.sqlite")
            let drainer = Drainer(store: tracker.store, outbox: outbox, chunkSize: 100, logger: Self.logger)
            // A producer that appends 5 events before every chunk, as a steady trickle does while chunks commit.
            var asked = 0
            let trickle = {
                asked += 1
                for _ in 0..<5 { _ = try? tracker.track("Late") }
                return true
            }
            // 255 → 100; 160 → 100; 65 → a partial chunk: caught up, though 5 more are waiting by now.
            #expect(try drainer.drainAvailable(while: trickle) == 265)
            #expect(asked == 3)
            #expect(try drainer.drainAvailable(while: trickle) == 5, "5 appended before its one chunk, none after")
            #expect(try tracker.store.status().pendingEvents == 0)
            #expect(try outbox.nextBatch(maxCount: 300, maxBytes: .max).map(\.seq) == Array(1...270))

            // Told to stop, it stops between chunks; the rest stays in the store.
            for _ in 0..<250 { try tracker.track("Later") }
            var chunks = 0
            #expect(try drainer.drainAvailable(while: { chunks += 1; return chunks <= 1 }) == 100)
            #expect(try tracker.store.status().pendingEvents == 150)
            #expect(try drainer.drainAvailable(maxEvents: 150) == 150)
        }
    }

    @Test("extension events get the app's presets but keep their time and the identity they were tracked under")
    func enrichExtension() throws {
        try withTemporaryGroup { group in
            var appConfig = Tracker.Configuration(groupDirectory: group, producerKind: .app)
            appConfig.appVersion = "5.0.0"
            let app = try Tracker(configuration: appConfig)
            var extConfig = Tracker.Configuration(groupDirectory: group, producerKind: .extension, producerID: "share")
            extConfig.appVersion = "4.9.0"
            extConfig.wallMillis = { 1_600_000_000_000 }
            let ext = try Tracker(configuration: extConfig)
            let before = try ext.identity()
            try ext.track("Shared", properties: ["target": "mail", "price": 9.99])
            try app.login("user-9")
            try ext.track("SharedAgain")

            let outbox = try Outbox(path: group + "-outbox/outbox.sqlite")
            _ = try Drainer(store: app.store, outbox: outbox, logger: Self.logger).drainAvailable()
            let rows = try outbox.nextBatch(maxCount: 10, maxBytes: .max)
            try #require(rows.count == 3)  // Shared, the login's $SignUp, SharedAgain
            let row = rows[0]
            let body = try #require(try JSONSerialization.jsonObject(with: Data(row.body)) as? [String: Any])
            #expect(body["time"] as? Int == 1_600_000_000_000)
            // Tracked before the login (drained after it): the anonymous id, and no login id.
            #expect(body["distinct_id"] as? String == before.distinctID && body["login_id"] == nil)
            #expect(body["anonymous_id"] as? String == before.anonymousID)
            let signUp = try #require(try JSONSerialization.jsonObject(with: Data(rows[1].body)) as? [String: Any])
            #expect(signUp["event"] as? String == "$SignUp" && signUp["original_id"] as? String == before.anonymousID)
            let after = try #require(try JSONSerialization.jsonObject(with: Data(rows[2].body)) as? [String: Any])
            #expect(after["distinct_id"] as? String == "user-9" && after["login_id"] as? String == "user-9")
            let props = try #require(body["properties"] as? [String: Any])
            #expect(props["$app_version"] as? String == "5.0.0")
            #expect(props["target"] as? String == "mail" && props["price"] as? Double == 9.99)
            #expect((body["lib"] as? [String: Any])?["$app_version"] as? String == "5.0.0")
            #expect(row.producerKind == .extension && row.producer == "share")
        }
    }

    @Test("published presets keep their JSON types in extension events: a 0 or 1 stays a number")
    func enrichKeepsNumberTypes() throws {
        try withTemporaryGroup { group in
            let app = try Tracker(configuration: .init(groupDirectory: group, producerKind: .app))
            try app.store.setConfiguration(
                ConfigurationKey.appPresets,
                json: #"{"$app_version":"5.0.0","$timezone_offset":0,"$retina":1,"$ratio":1.5,"$dark":true,"$big":18446744073709551615}"#)
            let ext = try Tracker(configuration: .init(groupDirectory: group, producerKind: .extension, producerID: "share"))
            try ext.track("Shared")
            let outbox = try Outbox(path: group + "-outbox/outbox.sqlite")
            _ = try Drainer(store: app.store, outbox: outbox, logger: Self.logger).drainAvailable()
            let row = try #require(try outbox.nextBatch(maxCount: 10, maxBytes: .max).first)
            let text = String(decoding: row.body, as: UTF8.self)
            for member in [#""$timezone_offset":0"#, #""$retina":1"#, #""$ratio":1.5"#, #""$dark":true"#, #""$big":18446744073709551615"#] {
                #expect(text.contains(member + ",") || text.contains(member + "}"), "\(member) not in \(text)")
            }
        }
    }

    @Test("an outbox error that ends a run says what to do about its kind", arguments: [
        (ResultCode.SQLITE_FULL, "disk is full"), (.SQLITE_BUSY, "locked"), (.SQLITE_READONLY, "permissions"),
        (.SQLITE_CORRUPT, "damaged"), (.SQLITE_ERROR, "start the agent again"),
    ])
    func stopErrorAdvice(code: ResultCode, advice: String) throws {
        let error = try #require(Agent.stopError(DatabaseError(resultCode: code), outbox: "/o.sqlite") as? AgentError)
        #expect(error.code == .outboxIO)
        #expect(error.message.contains("/o.sqlite") && error.message.contains(advice), "\(error.message)")
        #expect(Agent.stopError(CancellationError(), outbox: "/o.sqlite") is CancellationError, "other errors pass unchanged")
    }

    @Test("a corrupt store record goes to the dead letters; the rest is drained")
    func corruptRecord() throws {
        try withTemporaryGroup { group in
            let tracker = try Tracker(configuration: .init(groupDirectory: group))
            for _ in 0..<3 { try tracker.track("E") }
            var raw = try #require(try tracker.store.rawEvent(seq: 2))
            raw[60] ^= 0xFF
            try tracker.store.overwriteRawEvent(seq: 2, bytes: raw)
            let outbox = try Outbox(path: group + "-outbox/outbox.sqlite")
            _ = try Drainer(store: tracker.store, outbox: outbox, logger: Self.logger).drainAvailable()
            #expect(try outbox.pending().count == 2)
            #expect(try outbox.deadLetters().map(\.seq) == [2])
            #expect(try outbox.counters().corruptRecords == 1)
        }
    }

    @Test("a checkpoint with patience waits for a reader at most that long, says it did not complete, and completes later")
    func checkpointPatience() throws {
        try withTemporaryGroup { dir in
            let path = dir + "/outbox.sqlite"
            let outbox = try Outbox(path: path)
            try outbox.insertDrained((1...10).map { .event(Self.row($0)) })
            // `tributary status` reading the outbox while the agent stops: a read transaction on the WAL.
            let other = try Outbox(path: path)
            let reading = DispatchSemaphore(value: 0)
            let done = DispatchSemaphore(value: 0)
            DispatchQueue.global().async {
                _ = try? other.writer.read { db in
                    _ = try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM outbox")
                    reading.signal()
                    done.wait()
                }
            }
            reading.wait()
            try outbox.insertDrained((11...20).map { .event(Self.row($0)) })
            let start = ContinuousClock.now
            let completed = try outbox.checkpoint(patience: .milliseconds(100))
            #expect(!completed)
            #expect(ContinuousClock.now - start < .seconds(5), "the connection's busy timeout is 10 s")
            done.signal()
            #expect(try outbox.checkpoint(), "the reader gone, the checkpoint completes")
        }
    }
}
