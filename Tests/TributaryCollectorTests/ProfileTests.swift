import Foundation
import Testing
import TributaryCollector
import TributaryTestSupport
import TributaryWire

@Suite("Profiles: kept per user, with each operation's semantics")
struct ProfileTests {
    /// A profile record as the agent sends it.
    static func record(
        _ type: String, _ properties: [String: Any]?, user: String = "u-1", seq: Int, id: String = UUID().uuidString
    ) -> [UInt8] {
        var object: [String: Any] = [
            "type": type, "time": 1_760_000_000_000 + seq, "distinct_id": user, "anonymous_id": "a-1",
            "_track_id": seq, "event_id": id, "lib": ["$lib": "Linux", "$lib_method": "code"],
            "_tributary": ["seq": seq, "producer": "app", "producer_kind": "app", "producer_seq": seq],
        ]
        if let properties { object["properties"] = properties }
        return Events.json(object)
    }

    @Test("set, set_once, increment, append, unset and delete, in arrival order, once each", arguments: [WireFormat.sensors, .ndjson])
    func semantics(format: WireFormat) async throws {
        try await Collector.withRunning(CollectorConfiguration()) { collector in
            let client = Client(collector)
            let repeated = UUID().uuidString
            let first = [
                Self.record("profile_set", ["name": "Ada", "plan": "free"], seq: 1),
                Self.record("profile_set_once", ["name": "Bob", "first_seen": "2026-01-01"], seq: 2),
                Self.record("profile_increment", ["visits": 2, "score": 1.5], seq: 3, id: repeated),
                Self.record("profile_append", ["tags": ["a", "b"]], seq: 4),
                Self.record("profile_set", ["plan": "pro"], seq: 5),
                Self.record("profile_set", ["name": "Eve"], user: "u-2", seq: 6),
            ]
            #expect(try await client.post(first, format: format).status == 200)
            // A retried record (same event_id) is a duplicate: the increment is not applied twice.
            let second = [
                Self.record("profile_increment", ["visits": 2, "score": 1.5], seq: 3, id: repeated),
                Self.record("profile_increment", ["visits": 1], seq: 7),
                Self.record("profile_append", ["tags": ["c"]], seq: 8),
                Self.record("profile_unset", ["plan": true], seq: 9),
                Self.record("profile_delete", [:], user: "u-2", seq: 10),
            ]
            let reply = try await client.post(second, format: format)
            #expect(reply.status == 200 && reply.object["duplicates"] as? Int == 1, "\(reply.body)")

            let profile = try #require(try await collector.profile(of: "u-1"))
            #expect(profile["name"] as? String == "Ada", "set_once kept the value set before it")
            #expect(profile["first_seen"] as? String == "2026-01-01")
            #expect(profile["visits"] as? Int == 3)
            #expect(profile["score"] as? Double == 1.5)
            #expect(profile["tags"] as? [String] == ["a", "b", "c"])
            #expect(profile["plan"] == nil, "unset")
            #expect(try await collector.profile(of: "u-2") == nil, "deleted")

            let stats = try await collector.stats()
            #expect(stats.profiles == 1)
            #expect(
                stats.profileRecords == [
                    "profile_set": 3, "profile_set_once": 1, "profile_increment": 2, "profile_append": 2,
                    "profile_unset": 1, "profile_delete": 1,
                ])
            let shown = try await client.get("/profile?distinct_id=u-1")
            #expect(shown.status == 200 && shown.object["distinct_id"] as? String == "u-1", "\(shown.body)")
            #expect((shown.object["properties"] as? [String: Any])?["visits"] as? Int == 3)
            #expect(try await client.get("/profile?distinct_id=u-2").status == 404)
            #expect(try await client.get("/profile").status == 400)
        }
    }

    @Test("a profile record that breaks its operation's rule is a 400 naming it, and nothing of the batch is stored", arguments: [
        ("profile_increment", #"{"visits":"many"}"# as String?, "properties.visits"),
        ("profile_increment", #"{"visits":true}"#, "properties.visits"),
        ("profile_append", #"{"tags":"a"}"#, "properties.tags"),
        ("profile_append", #"{"tags":["a",1]}"#, "properties.tags"),
        ("profile_set", nil, "properties"),
        ("profile_merge", #"{"a":1}"#, "type"),
    ])
    func refused(type: String, propertiesJSON: String?, field: String) async throws {
        let properties: [String: Any]? = try propertiesJSON.flatMap { try JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any] }
        try await Collector.withRunning(CollectorConfiguration()) { collector in
            let batch = [Self.record("profile_set", ["name": "Ada"], seq: 1), Self.record(type, properties, seq: 2)]
            let reply = try await Client(collector).post(batch)
            #expect(reply.status == 400, "\(reply.body)")
            #expect(reply.object["code"] as? String == "invalid_event" && reply.object["index"] as? Int == 1)
            #expect(reply.object["field"] as? String == field, "\(reply.body)")
            #expect(try await collector.profile(of: "u-1") == nil)
            #expect(try await collector.stats().profiles == 0)
        }
    }

    @Test("a profile record without a distinct_id is refused")
    func noDistinctID() async throws {
        try await Collector.withRunning(CollectorConfiguration()) { collector in
            let record = Events.json(["type": "profile_set", "event_id": "p-1", "time": 1, "properties": ["a": 1]])
            let reply = try await Client(collector).post([record])
            #expect(reply.status == 400 && reply.object["field"] as? String == "distinct_id", "\(reply.body)")
        }
    }
}
