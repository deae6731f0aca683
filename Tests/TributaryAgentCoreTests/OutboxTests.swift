import Foundation
import GRDB
import Logging
import Testing
import Tributary
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
            #expect(try outbox.integrityCheck() == "ok")
            #expect(try outbox.synchronousMode() == 2, "the outbox must commit with synchronous=FULL")
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
            try outbox.acknowledge(batch[0].batchID!, count: batch.count)
            try expectConsistent()
            let next = try outbox.nextBatch(maxCount: 5, maxBytes: .max)
            try outbox.deadLetter(next[2], status: 400, reason: "HTTP 400")
            try expectConsistent()
            try outbox.replayDeadLetters()
            try expectConsistent()
            #expect(try outbox.pending().count == 20)
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
            try outbox.acknowledge(first[0].batchID!, count: 4)
            let bytesBound = try outbox.nextBatch(maxCount: 100, maxBytes: 40)
            #expect(bytesBound.map(\.seq) == [5, 6])
            #expect(try outbox.counters().delivered == 4)
        }
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
            #expect(letters[0].reason.contains("CRC mismatch") && letters[0].status == 0)
            #expect(letters[1].status == 422 && letters[1].eventID == "e2")
            #expect(try outbox.pending().count == 2)
            #expect(try outbox.replayDeadLetters() == 1)
            #expect(try outbox.pending().count == 3)
            #expect(try outbox.deadLetters().map(\.seq) == [4])
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

    @Test("extension events get the app's presets and the current identity but keep their time")
    func enrichExtension() throws {
        try withTemporaryGroup { group in
            var appConfig = Tracker.Configuration(groupDirectory: group, producerKind: .app)
            appConfig.appVersion = "5.0.0"
            let app = try Tracker(configuration: appConfig)
            var extConfig = Tracker.Configuration(groupDirectory: group, producerKind: .extension, producerID: "share")
            extConfig.appVersion = "4.9.0"
            extConfig.wallMillis = { 1_600_000_000_000 }
            let ext = try Tracker(configuration: extConfig)
            try ext.track("Shared", properties: ["target": "mail", "price": 9.99])
            try app.login("user-9")

            let outbox = try Outbox(path: group + "-outbox/outbox.sqlite")
            _ = try Drainer(store: app.store, outbox: outbox, logger: Self.logger).drainAvailable()
            let row = try #require(try outbox.nextBatch(maxCount: 10, maxBytes: .max).first)
            let body = try #require(try JSONSerialization.jsonObject(with: Data(row.body)) as? [String: Any])
            #expect(body["time"] as? Int == 1_600_000_000_000)
            #expect(body["distinct_id"] as? String == "user-9" && body["login_id"] as? String == "user-9")
            let props = try #require(body["properties"] as? [String: Any])
            #expect(props["$app_version"] as? String == "5.0.0")
            #expect(props["target"] as? String == "mail" && props["price"] as? Double == 9.99)
            #expect((body["lib"] as? [String: Any])?["$app_version"] as? String == "5.0.0")
            #expect(row.producerKind == .extension && row.producer == "share")
        }
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
}
