import Foundation
import GRDB
import Testing
import TributaryCollector
import TributaryTestSupport
import TributaryWire

@Suite("Ingest: formats, dedup, order, validation")
struct IngestTests {
    @Test(
        "Both wire formats are accepted on both endpoints",
        arguments: [
            (WireFormat.sensors, "/sa"), (.ndjson, "/ingest"), (.sensors, "/ingest"), (.ndjson, "/sa"),
        ]
    )
    func acceptsBothFormats(format: WireFormat, path: String) async throws {
        try await Collector.withRunning(CollectorConfiguration()) { collector in
            let events = Events.run(3, producer: "app-7")
            let reply = try await Client(collector).post(events, format: format, path: path, batchID: "batch-1")
            #expect(reply.status == 200, "\(reply.body)")
            #expect(reply.object["accepted"] as? Int == 3)
            #expect(reply.object["duplicates"] as? Int == 0)

            let received = try await collector.events()
            #expect(received.map(\.arrival) == [1, 2, 3])
            #expect(received.map(\.seq) == [1, 2, 3])
            #expect(received.map(\.producerSeq) == [1, 2, 3])
            #expect(received.allSatisfy { $0.producer == "app-7" && $0.batchID == "batch-1" })
            #expect(received.allSatisfy { $0.event == "BuyProduct" && $0.type == "track" })
            let first = try #require(received.first).jsonObject()
            #expect((first["properties"] as? [String: Any])?["price"] as? Double == 9.5)

            let served = try await Client(collector).get("/events").array
            #expect(served.compactMap { $0["event_id"] as? String } == received.map(\.eventID))
            let stats = try await collector.stats()
            #expect(stats.unique == 3 && stats.batches == 1 && stats.requests == 1)
            #expect(stats.producers == ["app-7": 3])
        }
    }

    @Test("Each event is stored and served as the exact JSON text it arrived as", arguments: WireFormat.allCases)
    func storesEventTextExactly(format: WireFormat) async throws {
        try await Collector.withRunning(CollectorConfiguration()) { collector in
            let texts = [
                #"{"type":"track","event":"Zed","time":1760000000000,"event_id":"e-1","zeta":null,"#
                    + #""properties":{"price":9.5,"tiny":1e-7,"round":3.0,"ok":true,"list":[1,"x]",[],{"a":"}"}],"#
                    + #""text":"a\"b\\c\nd\u0001 é 😀 \/"},"_tributary":{"seq":1,"producer":"app-1","producer_seq":1}}"#,
                #"{"event_id":"e-2","type":"profile_set","distinct_id":"u-1","properties":{"name":"[,]"}}"#,
            ]
            let reply = try await Client(collector).post(texts.map { Array($0.utf8) }, format: format)
            #expect(reply.status == 200, "\(reply.body)")
            #expect(try await collector.events().map(\.json) == texts)
        }
    }

    @Test("Duplicates across and within batches are stored once and counted")
    func deduplicates() async throws {
        try await Collector.withRunning(CollectorConfiguration()) { collector in
            let client = Client(collector)
            let events = Events.run(3)
            #expect(try await client.post(events, batchID: "b1").status == 200)
            let retry = try await client.post(events, batchID: "b1")
            #expect(retry.status == 200)
            #expect(retry.object["accepted"] as? Int == 0)
            #expect(retry.object["duplicates"] as? Int == 3)
            let fresh = Events.track(seq: 4, producerSeq: 4)
            let mixed = try await client.post([fresh, fresh, events[0]], batchID: "b2")
            #expect(mixed.object["accepted"] as? Int == 1)
            #expect(mixed.object["duplicates"] as? Int == 2)

            let stats = try await collector.stats()
            #expect(stats.received == 9)
            #expect(stats.unique == 4)
            #expect(stats.duplicates == 5)
            #expect(stats.batches == 3)
            #expect(stats.repeatedBatches == 1)
            #expect(stats.orderViolations.isEmpty && stats.seqViolations == 0)
            // Each text as first received: the duplicate within b2 and the retry's copies are not it.
            let texts = try await collector.events().map(\.json)
            #expect(texts == (events + [fresh]).map { String(decoding: $0, as: UTF8.self) })
        }
    }

    @Test("Out-of-order unique events are counted per producer and globally; duplicates are not")
    func countsOrderViolations() async throws {
        try await Collector.withRunning(CollectorConfiguration()) { collector in
            let client = Client(collector)
            let early = Events.track(seq: 1, producer: "ext-1", producerSeq: 1)
            _ = try await client.post([
                early, Events.track(seq: 3, producer: "ext-1", producerSeq: 2),
                Events.track(seq: 5, producer: "app-1", producerSeq: 9),
            ])
            // ext-1's producer_seq 2 again (a different event), global seq 2 below the high-water mark 5.
            _ = try await client.post([Events.track(seq: 2, producer: "ext-1", producerSeq: 2)])
            // A duplicate never counts as a violation.
            _ = try await client.post([early])
            // app-1 moves on correctly.
            _ = try await client.post([Events.track(seq: 6, producer: "app-1", producerSeq: 10)])

            let stats = try await collector.stats()
            #expect(stats.orderViolations == ["ext-1": 1])
            #expect(stats.seqViolations == 1)
            #expect(stats.producers == ["ext-1": 3, "app-1": 2])
            #expect(stats.duplicates == 1)
        }
    }

    @Test("Producers whose ids differ only in Unicode normalization keep their own order")
    func producersByBytes() async throws {
        try await Collector.withRunning(CollectorConfiguration()) { collector in
            let composed = "caf\u{E9}"
            let decomposed = "cafe\u{301}"
            let reply = try await Client(collector).post([
                Events.track(seq: 1, producer: composed, producerSeq: 1),
                Events.track(seq: 2, producer: decomposed, producerSeq: 1),
                Events.track(seq: 3, producer: composed, producerSeq: 2),
            ])
            #expect(reply.status == 200)
            let stats = try await collector.stats()
            #expect(stats.orderViolations.isEmpty, "each producer's producer_seq rose: \(stats.orderViolations)")
            #expect(stats.producers.values.reduce(0, +) == 3, "\(stats.producers)")
        }
    }

    @Test("Concurrent batches are each stored whole, and the counters add up")
    func concurrentBatches() async throws {
        try await Collector.withRunning(CollectorConfiguration()) { collector in
            let replies = try await withThrowingTaskGroup(of: Int.self) { group in
                for producer in 0..<8 {
                    group.addTask {
                        try await Client(collector).post(Events.run(50, producer: "p\(producer)")).status
                    }
                }
                return try await group.reduce(into: [Int]()) { $0.append($1) }
            }
            #expect(replies == Array(repeating: 200, count: 8))
            let stats = try await collector.stats()
            #expect(stats.unique == 400 && stats.batches == 8 && stats.received == 400)
            #expect(stats.orderViolations.isEmpty)
            #expect(Set(stats.producers.values) == [50])
            let arrivals = try await collector.events().map(\.arrival)
            #expect(arrivals == Array(1...400))
        }
    }

    @Test("A crc that does not match data_list is a 400 that says so")
    func rejectsCRCMismatch() async throws {
        try await Collector.withRunning(CollectorConfiguration()) { collector in
            let encoded = try WireFormat.sensors.encode(Events.run(2))
            var form = parseForm(String(decoding: encoded.body, as: UTF8.self))
            form["crc"] = "12345"
            let body = "crc=12345&gzip=1&data_list=" + formURLEncode(form["data_list"] ?? "")
            let reply = try await Client(collector).post(Array(body.utf8), headers: encoded.headers, path: "/sa")
            #expect(reply.status == 400)
            #expect(reply.object["code"] as? String == "crc_mismatch")
            #expect((reply.object["error"] as? String)?.contains("crc=12345") == true)
            #expect(try await collector.stats().unique == 0)
        }
    }

    @Test("Malformed bodies are 400 with the reason")
    func rejectsMalformedBody() async throws {
        try await Collector.withRunning(CollectorConfiguration()) { collector in
            let reply = try await Client(collector).post(
                Array("not gzip".utf8),
                headers: [("Content-Type", "application/x-ndjson"), ("Content-Encoding", "gzip")]
            )
            #expect(reply.status == 400)
            #expect(reply.object["code"] as? String == "malformed_body")
            #expect((reply.object["error"] as? String)?.contains("gzip") == true)
        }
    }

    @Test("A malformed body's 400 says what is wrong and where", arguments: [
        ("{\"event_id\":\"a\",\"type\":\"track\"}\n{\"event_id\":\"b\",", "ndjson", "Line 2", "expected a key at byte 16"),
        ("{\"a\":\"\\ud800\"}", "ndjson", "Line 1", "high surrogate escape not followed by a low one at byte 12"),
        ("GZIP", "ndjson", "Line 1", "send Content-Encoding: gzip"),
        // Lines are counted as they stand, blank ones too (a CRLF file's "\r", spaces and a tab).
        ("{\"event_id\":\"a\",\"type\":\"track\"}\r\n\r\n \t\r\n{\"event_id\":\"b\",", "ndjson", "Line 4", "expected a key"),
        ("{\"not\":\"an array\"}", "sensors", "data_list", "the text is not an array at byte 0"),
        ("GZIP", "sensors", "data_list", "send gzip=1"),
        // A non-object is refused where it stands, before the rest (here not even JSON) is scanned.
        ("[{\"event_id\":\"a\",\"type\":\"track\"},0,{", "sensors", "Element 1 of data_list", "not a JSON object"),
    ])
    func malformedBodyDetail(text: String, format: String, subject: String, detail: String) async throws {
        try await Collector.withRunning(CollectorConfiguration()) { collector in
            let gzipped = try Gzip.compress(Array(#"{"event_id":"a","type":"track"}"#.utf8), level: 1)
            let bytes = text == "GZIP" ? gzipped : Array(text.utf8)
            let reply: Reply
            if format == "ndjson" {
                reply = try await Client(collector).post(bytes, headers: [("Content-Type", "application/x-ndjson")])
            } else {
                let base64 = Data(bytes).base64EncodedString()
                reply = try await Client(collector).post(
                    Array(("data_list=" + formURLEncode(base64)).utf8),
                    headers: [("Content-Type", "application/x-www-form-urlencoded")], path: "/sa")
            }
            let message = reply.object["error"] as? String ?? ""
            #expect(reply.status == 400 && reply.object["code"] as? String == "malformed_body")
            #expect(message.contains(subject) && message.contains(detail), "\(message)")
            #expect(try await collector.stats().unique == 0)
        }
    }

    @Test("A request with more events than maxEventsPerRequest is 413, in either format", arguments: WireFormat.allCases)
    func limitsEventsPerRequest(format: WireFormat) async throws {
        try await Collector.withRunning(CollectorConfiguration(maxEventsPerRequest: 3)) { collector in
            let client = Client(collector)
            let over = try await client.post(Events.run(4), format: format)
            #expect(over.status == 413 && over.object["code"] as? String == "too_large", "\(over.body)")
            #expect((over.object["error"] as? String)?.contains("at most 3 per request") == true, "\(over.body)")
            #expect(try await collector.stats().unique == 0)
            #expect(try await client.post(Events.run(3), format: format).status == 200)
        }
        // The default: 100,001 tiny elements are refused for their number before any is validated (each
        // element's scan holds a few hundred bytes, so millions of them cost gigabytes).
        try await Collector.withRunning(CollectorConfiguration()) { collector in
            let tiny = [[UInt8]](repeating: Array("{}".utf8), count: CollectorConfiguration.defaultMaxEventsPerRequest + 1)
            let reply = try await Client(collector).post(tiny, format: format)
            #expect(reply.status == 413, "\(reply.body)")
            #expect((reply.object["error"] as? String)?.contains("more than 100000 events") == true, "\(reply.body)")
        }
        #expect(throws: CollectorError.self) { try CollectorConfiguration(maxEventsPerRequest: 0).validate() }
    }

    @Test("An unknown content type is 415")
    func rejectsUnknownContentType() async throws {
        try await Collector.withRunning(CollectorConfiguration()) { collector in
            let reply = try await Client(collector).post(
                Array("{}".utf8),
                headers: [("Content-Type", "text/plain")]
            )
            #expect(reply.status == 415)
            #expect((reply.object["error"] as? String)?.contains("text/plain") == true)
            let stats = try await collector.stats()
            #expect(stats.requests == 1 && stats.rejectedBatches == 1 && stats.batches == 0)
        }
    }

    @Test(
        "Invalid events are a 400 naming the index and field; nothing of the batch is stored",
        arguments: [
            ("event_id", #"{"type":"track","event":"E","time":1,"properties":{}}"#),
            ("event_id", #"{"event_id":"","type":"track","event":"E","time":1,"properties":{}}"#),
            ("type", #"{"event_id":"x","event":"E","time":1,"properties":{}}"#),
            ("event", #"{"event_id":"x","type":"track","time":1,"properties":{}}"#),
            ("time", #"{"event_id":"x","type":"track","event":"E","time":"soon","properties":{}}"#),
            ("time", #"{"event_id":"x","type":"track","event":"E","time":true,"properties":{}}"#),
            ("properties", #"{"event_id":"x","type":"track","event":"E","time":1,"properties":[1]}"#),
            ("_tributary", #"{"event_id":"x","type":"track","event":"E","time":1,"properties":{},"_tributary":7}"#),
            (
                "_tributary.seq",
                #"{"event_id":"x","type":"track","event":"E","time":1,"properties":{},"_tributary":{"seq":-1}}"#
            ),
            (
                "_tributary.producer_seq",
                #"{"event_id":"x","type":"track","event":"E","time":1,"properties":{},"#
                    + #""_tributary":{"producer_seq":1.5}}"#
            ),
            (
                "_tributary.producer",
                #"{"event_id":"x","type":"track","event":"E","time":1,"properties":{},"_tributary":{"producer":1}}"#
            ),
            // SQLite's text ends at U+0000: "x\u0000a" and "x\u0000b" would be one id.
            ("event_id", #"{"event_id":"x\u0000a","type":"track","event":"E","time":1,"properties":{}}"#),
            ("event", #"{"event_id":"x","type":"track","event":"E\u0000","time":1,"properties":{}}"#),
            (
                "_tributary.producer",
                #"{"event_id":"x","type":"track","event":"E","time":1,"properties":{},"_tributary":{"producer":"p\u0000"}}"#
            ),
            // JSON decoders drop a raw byte-order mark at a string's start: "\u{FEFF}y" and "y" would be one id.
            ("event_id", "{\"event_id\":\"\u{FEFF}y9\",\"type\":\"track\",\"event\":\"E\",\"time\":1,\"properties\":{}}"),
            ("event_id", #"{"event_id":"y\uFEFF9","type":"track","event":"E","time":1,"properties":{}}"#),
        ]
    )
    func rejectsInvalidEvent(field: String, event: String) async throws {
        try await Collector.withRunning(CollectorConfiguration()) { collector in
            let reply = try await Client(collector).post([Events.track(seq: 1, producerSeq: 1), Array(event.utf8)])
            #expect(reply.status == 400)
            #expect(reply.object["code"] as? String == "invalid_event")
            #expect(reply.object["index"] as? Int == 1)
            #expect(reply.object["field"] as? String == field)
            #expect((reply.object["error"] as? String)?.contains("event 1") == true)
            #expect(try await collector.stats().unique == 0)
        }
    }

    @Test("A sequence number up to Int64.max is taken exactly, one above is refused")
    func largestSequenceNumbers() async throws {
        try await Collector.withRunning(CollectorConfiguration()) { collector in
            func event(_ seq: String) -> [UInt8] {
                Array(#"{"event_id":"e-\#(seq)","type":"track","event":"E","time":1,"properties":{},"_tributary":{"seq":\#(seq)}}"#.utf8)
            }
            #expect(try await Client(collector).post([event("9223372036854775807")]).status == 200)
            #expect(try await collector.events().first?.seq == UInt64(Int64.max))
            let over = try await Client(collector).post([event("9223372036854775808")])
            #expect(over.status == 400 && over.object["field"] as? String == "_tributary.seq")
        }
    }

    @Test("NDJSON with CRLF line ends and blank lines is accepted: a blank line, even \"\\r\", holds no event")
    func blankNDJSONLines() async throws {
        try await Collector.withRunning(CollectorConfiguration()) { collector in
            let lines = [Events.track(id: "crlf-1", seq: 1, producerSeq: 1), Events.track(id: "crlf-2", seq: 2, producerSeq: 2)]
            let body = lines[0] + Array("\r\n\r\n  \r\n".utf8) + lines[1] + Array("\r\n\r\n".utf8)
            let reply = try await Client(collector).post(body, headers: [("Content-Type", "application/x-ndjson")])
            #expect(reply.status == 200, "\(reply.body)")
            #expect(try await collector.events().map(\.eventID) == ["crlf-1", "crlf-2"])
        }
    }

    @Test("An NDJSON line's byte-order mark is not stored: GET /events stays JSON")
    func byteOrderMarkNotStored() async throws {
        try await Collector.withRunning(CollectorConfiguration()) { collector in
            let line = [0xEF, 0xBB, 0xBF] + Events.track(id: "bom", seq: 1, producerSeq: 1) + Array("\n".utf8)
            let reply = try await Client(collector).post(line, headers: [("Content-Type", "application/x-ndjson")])
            #expect(reply.status == 200)
            let served = try await Client(collector).get("/events")
            #expect(served.array.first?["event_id"] as? String == "bom", "\(served.body.prefix(80))")
            #expect(try await collector.events().first?.json.utf8.first == UInt8(ascii: "{"))
        }
    }

    @Test(
        "Content-Encoding: gzip, x-gzip and identity are undone, any other coding is 415",
        arguments: [
            ("gzip", 200), ("x-gzip", 200), ("GZIP", 200), ("identity", 200), ("identity, gzip", 200), ("", 200),
            ("br", 415), ("deflate", 415), ("gzip, br", 415),
        ]
    )
    func contentEncodings(coding: String, status: Int) async throws {
        try await Collector.withRunning(CollectorConfiguration()) { collector in
            let text = Events.track(seq: 1, producerSeq: 1) + Array("\n".utf8)
            let body = coding.lowercased().contains("gzip") ? try Gzip.compress(text) : text
            var headers = [(name: "Content-Type", value: "application/x-ndjson")]
            if !coding.isEmpty { headers.append((name: "Content-Encoding", value: coding)) }
            let reply = try await Client(collector).post(body, headers: headers)
            #expect(reply.status == status, "\(reply.body)")
            if status == 415 {
                #expect(reply.object["code"] as? String == "unsupported_media_type")
                #expect((reply.object["error"] as? String)?.contains("Content-Encoding") == true)
                #expect(try await collector.stats().unique == 0)
            } else {
                // Stored in the coding it came in, and read back through it.
                let stored = try await collector.events().map(\.json)
                #expect(stored == [String(decoding: text.dropLast(), as: UTF8.self)])
            }
        }
    }

    @Test("Events of other types need only event_id and type (a profile record also a distinct_id: ProfileTests)")
    func acceptsOtherTypes() async throws {
        try await Collector.withRunning(CollectorConfiguration()) { collector in
            let item = Events.json(["event_id": "i-1", "type": "item_set", "properties": ["name": "x"]])
            let reply = try await Client(collector).post([item])
            #expect(reply.status == 200)
            let event = try #require(try await collector.events().first)
            #expect(event.type == "item_set" && event.event == nil && event.seq == nil)
        }
    }

    @Test("GET /events pages by arrival index")
    func pagesEvents() async throws {
        try await Collector.withRunning(CollectorConfiguration()) { collector in
            let client = Client(collector)
            _ = try await client.post(Events.run(5))
            let page = try await client.get("/events?after=2&limit=2").array
            #expect(page.compactMap { ($0["_tributary"] as? [String: Any])?["seq"] as? Int } == [3, 4])
            #expect(try await client.get("/events?after=5").array.isEmpty)
            #expect(try await client.get("/events?after=-1").status == 400)
            #expect(try await client.get("/events?limit=zero").status == 400)
            #expect(try await client.get("/events?limit=100001").status == 400)
        }
    }

    @Test("GET /events without a limit returns a page of 10,000, not everything")
    func defaultPage() async throws {
        try await Collector.withRunning(CollectorConfiguration()) { collector in
            let client = Client(collector)
            let first = try await client.post(Events.run(6_000))
            let second = try await client.post(Events.run(4_005, firstSeq: 6_001))
            #expect(first.status == 200 && second.status == 200)
            let page = try await client.get("/events").array
            #expect(page.count == 10_000)
            let rest = try await client.get("/events?after=10000").array
            #expect(rest.count == 5)
        }
        #expect(Collector.eventsPageDefault == 10_000)
    }

    @Test("A database file keeps events, dedup state and counters across restarts")
    func persistsAcrossRestarts() async throws {
        try await withTemporaryGroup { (directory: String) in
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
            let configuration = CollectorConfiguration(databasePath: directory + "/collector.sqlite")
            let events = Events.run(3)
            let first = try await Collector.withRunning(configuration) { collector in
                try await Client(collector).post(events).status
            }
            #expect(first == 200)
            try await Collector.withRunning(configuration) { collector in
                let reply = try await Client(collector).post(events + [Events.track(seq: 4, producerSeq: 4)])
                #expect(reply.object["accepted"] as? Int == 1)
                #expect(reply.object["duplicates"] as? Int == 3)
                let stats = try await collector.stats()
                #expect(stats.batches == 2 && stats.unique == 4 && stats.seqViolations == 0)
                #expect(try await collector.events().map(\.seq) == [1, 2, 3, 4])
            }
        }
    }

    @Test(
        "A batch is stored once, as it came (compressed), and each event as its range of it",
        arguments: WireFormat.allCases)
    func storesBatchPayloads(format: WireFormat) async throws {
        try await withTemporaryGroup { (directory: String) in
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
            let path = directory + "/collector.sqlite"
            let events = Events.run(40)
            let encoded = try format.encode(events)
            try await Collector.withRunning(CollectorConfiguration(databasePath: path)) { collector in
                let client = Client(collector)
                let first = try await client.post(events, format: format, batchID: "b1")
                // Sent again: every event a duplicate, nothing of it kept.
                let again = try await client.post(events, format: format, batchID: "b1")
                #expect(first.status == 200 && again.status == 200)
                let received = try await collector.events()
                #expect(received.map(\.json) == events.map { String(decoding: $0, as: UTF8.self) })
                let served = try await client.get("/events")
                #expect(served.body == "[" + received.map(\.json).joined(separator: ",") + "]")
            }
            let database = try DatabaseQueue(path: path)
            let (batches, ranged): ([(bytes: Int?, encoding: String?)], Int) = try await database.read { db in
                let batches = try Row.fetchAll(
                    db, sql: "SELECT LENGTH(payload), payload_encoding FROM batches ORDER BY id")
                    .map { (bytes: $0[0] as Int?, encoding: $0[1] as String?) }
                let ranged = try Int.fetchOne(
                    db, sql: "SELECT COUNT(*) FROM events WHERE body IS NULL AND body_start IS NOT NULL")
                return (batches, ranged ?? 0)
            }
            #expect(batches.count == 2)
            #expect(ranged == 40)
            let textBytes = events.reduce(0) { $0 + $1.count }
            // Both formats send gzip: the sensors form inside data_list, NDJSON as the body's coding.
            #expect(batches.first?.encoding == "gzip")
            let kept = batches.first?.bytes ?? .max
            #expect(kept < textBytes / 2, "kept \(kept) bytes of \(textBytes) (body \(encoded.body.count))")
            #expect(batches.last?.bytes == nil)
        }
    }

    @Test("A Sensors form without gzip=1 is stored as its JSON text, and read back")
    func storesUncompressedForm() async throws {
        try await Collector.withRunning(CollectorConfiguration()) { collector in
            let events = Events.run(3)
            let json = "[" + events.map { String(decoding: $0, as: UTF8.self) }.joined(separator: ",") + "]"
            let dataList = Data(json.utf8).base64EncodedString()
                .replacingOccurrences(of: "+", with: "%2B").replacingOccurrences(of: "/", with: "%2F")
                .replacingOccurrences(of: "=", with: "%3D")
            let reply = try await Client(collector).post(
                Array("gzip=0&data_list=\(dataList)".utf8),
                headers: [(name: "Content-Type", value: "application/x-www-form-urlencoded")], path: "/sa")
            #expect(reply.status == 200, "\(reply.body)")
            let stored = try await collector.events().map(\.json)
            #expect(stored == events.map { String(decoding: $0, as: UTF8.self) })
        }
    }

    @Test("A database from before batches kept their payload keeps its events' text, and dedups against them")
    func readsSchemaV1Database() async throws {
        try await withTemporaryGroup { (directory: String) in
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
            let path = directory + "/collector.sqlite"
            let old = Events.track(id: "old-1", seq: 1, producerSeq: 1)
            // Schema v1 as the collector created it, with one event stored under it.
            try await DatabaseQueue(path: path).write { db in
                try db.execute(sql: """
                    CREATE TABLE grdb_migrations (identifier TEXT NOT NULL PRIMARY KEY);
                    INSERT INTO grdb_migrations VALUES ('v1');
                    CREATE TABLE batches (id INTEGER PRIMARY KEY, idempotency_key TEXT, format TEXT NOT NULL,
                        events INTEGER NOT NULL, accepted INTEGER NOT NULL DEFAULT 0, duplicates INTEGER NOT NULL DEFAULT 0,
                        lost_ack INTEGER NOT NULL DEFAULT 0, received_at REAL NOT NULL);
                    CREATE INDEX batches_by_key ON batches(idempotency_key);
                    CREATE TABLE events (arrival INTEGER PRIMARY KEY, event_id TEXT NOT NULL UNIQUE, type TEXT NOT NULL,
                        event TEXT, seq INTEGER, producer TEXT, producer_seq INTEGER,
                        batch INTEGER NOT NULL REFERENCES batches(id), batch_id TEXT, body TEXT NOT NULL);
                    CREATE TABLE producers (producer TEXT PRIMARY KEY, unique_events INTEGER NOT NULL,
                        order_violations INTEGER NOT NULL, producer_seq_high_water INTEGER);
                    CREATE TABLE counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
                    CREATE TABLE high_water (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
                    INSERT INTO batches VALUES (1, 'b0', 'sensors', 1, 1, 0, 0, 0);
                    INSERT INTO producers VALUES ('app-1', 1, 0, 1);
                    INSERT INTO counters VALUES ('requests', 1), ('batches', 1), ('received', 1), ('unique', 1);
                    INSERT INTO high_water VALUES ('seq', 1);
                    """)
                try db.execute(
                    sql: "INSERT INTO events VALUES (1, 'old-1', 'track', 'BuyProduct', 1, 'app-1', 1, 1, 'b0', ?)",
                    arguments: [String(decoding: old, as: UTF8.self)])
            }
            let new = Events.track(seq: 2, producerSeq: 2)
            try await Collector.withRunning(CollectorConfiguration(databasePath: path)) { collector in
                let reply = try await Client(collector).post([old, new])
                #expect(reply.object["accepted"] as? Int == 1)
                #expect(reply.object["duplicates"] as? Int == 1)
                #expect(try await collector.events().map(\.json) == [old, new].map { String(decoding: $0, as: UTF8.self) })
                let stats = try await collector.stats()
                #expect(stats.unique == 2 && stats.seqViolations == 0 && stats.orderViolations.isEmpty)
            }
        }
    }

    @Test("The counting endpoint counts foreign SDK batches by name, stores nothing, and refuses non-JSON")
    func countsForeignBatches() async throws {
        try await Collector.withRunning(CollectorConfiguration()) { collector in
            let client = Client(collector)
            let segment = Array(#"{"batch":[{"event":"a"},{"event":"b"},{"event":"c"}],"sentAt":"x"}"#.utf8)
            let gzipped = try Gzip.compress(segment)
            let first = try await client.post(
                gzipped, headers: [("Content-Type", "application/json"), ("Content-Encoding", "gzip")],
                path: "/count/segment/v1/batch")
            #expect(first.status == 200, "\(first.body)")
            let posthog = Array(#"{"api_key":"k","batch":[{"event":"a"},{"event":"b"}]}"#.utf8)
            let second = try await client.post(
                posthog, headers: [("Content-Type", "application/json")], path: "/count/posthog/batch/")
            #expect(second.status == 200, "\(second.body)")
            let bad = try await client.post(
                Array("not json".utf8), headers: [("Content-Type", "application/json")], path: "/count/posthog/batch/")
            #expect(bad.status == 400, "\(bad.body)")
            // Answered as ingest answers them, not as malformed JSON (400).
            let brotli = try await client.post(
                segment, headers: [("Content-Type", "application/json"), ("Content-Encoding", "br")],
                path: "/count/posthog/batch/")
            #expect(brotli.status == 415 && brotli.object["code"] as? String == "unsupported_media_type", "\(brotli.body)")
            // Over the limit once inflated: 413, as ingest answers it.
            let bomb = try Gzip.compress([UInt8](repeating: UInt8(ascii: " "), count: CollectorConfiguration.defaultMaxBodyBytes + 1))
            let tooLarge = try await client.post(
                bomb, headers: [("Content-Type", "application/json"), ("Content-Encoding", "gzip")],
                path: "/count/posthog/batch/")
            #expect(tooLarge.status == 413 && tooLarge.object["code"] as? String == "too_large", "\(tooLarge.body)")

            let counts = try await client.get("/count").object
            #expect((counts["segment"] as? [String: Any])?["events"] as? Int == 3)
            #expect((counts["segment"] as? [String: Any])?["requests"] as? Int == 1)
            #expect((counts["posthog"] as? [String: Any])?["events"] as? Int == 2)
            #expect(try await collector.stats().unique == 0)
        }
    }
}
