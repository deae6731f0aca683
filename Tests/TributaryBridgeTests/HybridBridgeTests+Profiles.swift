import Foundation
import Testing
import Tributary

@testable import TributaryBridge

// Profile operations a page sends through the bridge (as the Sensors JavaScript SDK 1.27 does): verified
// like events (origin, project, identity), stored for the app's user, marked as H5 records.
extension HybridBridgeTests {
    /// A page's profile record as the JavaScript SDK sends it.
    static func pageProfile(
        _ type: String, _ properties: [String: JSON], distinctID: String = "h5-anon", server: String = server,
        extra: [String: JSON] = [:]
    ) -> [String: JSON] {
        var data: [String: JSON] = [
            "type": .string(type), "time": .number(1_700_000_000_500), "distinct_id": .string(distinctID),
            "anonymous_id": .string("h5-anon"),
            "lib": .object(["$lib": .string("js"), "$lib_method": .string("code"), "$lib_version": .string("1.27.10")]),
            "properties": .object(properties.merging(["$is_login_id": .bool(false), "$project": .string("p")]) { a, _ in a }),
            "_nocache": .string("1"), "server_url": .string(server),
        ]
        data.merge(extra) { $1 }
        return data
    }

    @Test("a page's profile_set_once is stored for the app's user, with the page's time and lib, marked H5, no presets")
    func profileFromPage() async throws {
        try await Self.withBridge { bridge, store in
            let properties: [String: JSON] = ["$first_visit_time": .string("2026-01-01 10:00:00.000"), "$first_referrer": .string("")]
            let receipt = try await bridge.receive(
                Self.message(Self.pageProfile("profile_set_once", properties)), origin: Self.origin
            ).get()
            let stored = try Self.storedBodies(store)
            #expect(stored.count == 1)
            let (record, body) = try #require(stored.first)
            let identity = try store.identity()
            #expect(record.producerKind == .hybrid && record.wallTimeMillis == 1_700_000_000_500)
            #expect(body["type"] as? String == "profile_set_once" && body["event"] == nil)
            #expect(body["event_id"] as? String == receipt.eventID)
            #expect(body["distinct_id"] as? String == identity.anonymousID)
            #expect(body["_hybrid_h5"] as? Bool == true)
            for key in ["server_url", "_nocache"] { #expect(body[key] == nil) }
            let storedProperties = try #require(body["properties"] as? [String: Any])
            #expect(Set(storedProperties.keys) == ["$first_visit_time", "$first_referrer"], "\(storedProperties.keys)")
            let lib = try #require(body["lib"] as? [String: Any])
            #expect(lib["$lib"] as? String == "js" && lib["$app_version"] as? String == "4.2.0")
            #expect(bridge.snapshot.accepted == 1)
        }
    }

    @Test("every profile operation a page may send is accepted; each broken rule is refused and counted, nothing stored")
    func profileRules() async throws {
        try await Self.withBridge { bridge, store in
            let accepted: [[String: JSON]] = [
                Self.pageProfile("profile_set", ["name": .string("Ada")]),
                Self.pageProfile("profile_increment", ["visits": .number(1)]),
                Self.pageProfile("profile_append", ["tags": .array([.string("a")])]),
                Self.pageProfile("profile_unset", ["name": .bool(true)]),
                Self.pageProfile("profile_delete", [:]),
            ]
            for data in accepted {
                _ = try await bridge.receive(Self.message(data), origin: Self.origin).get()
            }
            let refused: [([String: JSON], String, BridgeRejection.Reason)] = [
                (Self.pageProfile("profile_increment", ["visits": .string("many")]), Self.origin, .invalidEvent),
                (Self.pageProfile("profile_append", ["tags": .string("a")]), Self.origin, .invalidEvent),
                (Self.pageProfile("profile_set", ["time": .string("x")]), Self.origin, .invalidEvent),
                (Self.pageProfile("profile_set", ["name": .string("x")], extra: ["lib": .string("js")]), Self.origin, .invalidEvent),
                (Self.pageProfile("profile_set", ["name": .string("x")], distinctID: "someone-else"), Self.origin, .forgedIdentity),
                (Self.pageProfile("profile_set", ["name": .string("x")], extra: ["login_id": .string("boss")]), Self.origin, .forgedIdentity),
                (Self.pageProfile("profile_set", ["name": .string("x")], server: "https://sa.example.com/sa?project=other"), Self.origin, .foreignProject),
                (Self.pageProfile("profile_set", ["name": .string("x")]), "http://evil.example", .foreignOrigin),
                (Self.pageProfile("item_set", ["name": .string("x")]), Self.origin, .unsupportedType),
            ]
            for (data, origin, reason) in refused {
                let result = await bridge.receive(Self.message(data), origin: origin)
                #expect(Self.reason(result) == reason, "\(data["type"]?.string ?? "?") from \(origin)")
            }
            let types = try Self.storedBodies(store).map { $0.body["type"] as? String }
            #expect(types == ["profile_set", "profile_increment", "profile_append", "profile_unset", "profile_delete"])
            #expect(bridge.snapshot.accepted == 5)
            #expect(
                bridge.snapshot.rejected == [
                    .invalidEvent: 4, .forgedIdentity: 2, .foreignProject: 1, .foreignOrigin: 1, .unsupportedType: 1,
                ])
        }
    }
}
