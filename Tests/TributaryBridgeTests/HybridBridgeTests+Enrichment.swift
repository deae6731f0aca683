import Foundation
import Synchronization
import Testing
import Tributary

@testable import TributaryBridge

// Accepted page events: enriched as documented, counted once committed, their origins counted within a bound.
extension HybridBridgeTests {
    @Test("received counts at most maxCountedOrigins origins by name; the rest go under other, trusted origins always by name")
    func receivedOriginsBounded() async throws {
        try await Self.withBridge { bridge, _ in
            let extra = HybridBridge.maxCountedOrigins + 44
            for n in 0..<extra {
                _ = await bridge.receive(Self.message(Self.pageEvent()), origin: "https://f\(n).ads.example")
            }
            _ = try await bridge.receive(Self.message(Self.pageEvent()), origin: Self.origin).get()
            let received = bridge.snapshot.received
            #expect(received.count <= HybridBridge.maxCountedOrigins + 2, "\(received.count) origins counted by name")
            #expect(received.values.reduce(0, +) == extra + 1)
            #expect(received[HybridBridge.otherOrigins] ?? 0 > 0 && received[Self.origin] == 1)
        }
    }

    @Test("\"login_id\": null from a logged-out page claims no login: the event is accepted, with no login_id")
    func nullLoginID() async throws {
        try await Self.withBridge { bridge, store in
            let result = await bridge.receive(Self.message(Self.pageEvent(extra: ["login_id": .null])), origin: Self.origin)
            #expect(throws: Never.self) { try result.get() }
            let stored = try Self.storedBodies(store)
            #expect(stored.count == 1)
            #expect(stored.first?.body["login_id"] == nil)
        }
    }

    @Test("an accepted page event is enriched exactly as documented")
    func enrichment() async throws {
        try await Self.withBridge { bridge, store in
            let result = await bridge.receive(Self.message(Self.pageEvent()), origin: Self.origin)
            let receipt = try result.get()
            let stored = try Self.storedBodies(store)
            #expect(stored.count == 1)
            let (record, event) = try #require(stored.first)
            let identity = try store.identity()
            let properties = try #require(event["properties"] as? [String: Any])
            let lib = try #require(event["lib"] as? [String: Any])
            #expect(record.producerKind == .hybrid)
            #expect(record.wallTimeMillis == 1_700_000_000_123, "the record keeps the page's trigger time")
            #expect(event["type"] as? String == "track")
            #expect(event["event"] as? String == "H5View")
            #expect(event["time"] as? Int == 1_700_000_000_123)
            #expect(event["distinct_id"] as? String == identity.anonymousID)
            #expect(event["anonymous_id"] as? String == identity.anonymousID)
            #expect(event["login_id"] == nil)
            #expect(event["event_id"] as? String == receipt.eventID)
            #expect(receipt.eventID != "h5-anon" && !receipt.eventID.isEmpty)
            for key in ["server_url", "_nocache"] { #expect(event[key] == nil, "\(key) must be removed") }
            for key in ["$project", "$token", "server_url", "_nocache"] {
                #expect(properties[key] == nil, "\(key) must be removed from properties")
            }
            #expect(event["_hybrid_h5"] as? Bool == true, "at the top level, as the Sensors SDKs put it")
            #expect(properties["_hybrid_h5"] == nil, "not among the properties")
            #expect(properties["$app_version"] as? String == "4.2.0")
            #expect(lib["$app_version"] as? String == "4.2.0")
            #expect(properties["$os"] as? String == "Linux", "app presets override the page's guesses")
            // The app's device presets replace the page's guesses (its $model is "iPhone").
            let presets = PresetProperties.current(appVersion: "4.2.0", deviceID: "")
            for key in ["$model", "$os_version", "$manufacturer"] {
                guard case .string(let expected)? = presets[key] else {
                    Issue.record("no \(key) preset")
                    continue
                }
                #expect(properties[key] as? String == expected, "\(key) is the app's")
            }
            #expect(properties["app_channel"] as? String == "app", "super properties override the page's")
            #expect(properties["$session_id"] as? String == "s-42", "dynamic super properties too")
            #expect(properties["$lib"] as? String == "js", "the page keeps its $lib")
            #expect(lib["$lib"] as? String == "js" && lib["$lib_method"] as? String == "code")
            #expect(properties["$url"] as? String == "http://127.0.0.1:8080/p")
            #expect(properties["price"] as? Double == 9.5)
            #expect(properties["$screen_width"] as? Int == 390)
            #expect(bridge.snapshot.accepted == 1)
        }
    }

    @Test("a message counts as handled once its event is committed, not when it is received")
    func handledAfterCommit() async throws {
        try await Self.withBridge { bridge, store in
            // The dynamic super properties are computed while the event is prepared: hold it there.
            let gate = Mutex((entered: false, released: false))
            bridge.tracker.registerDynamicSuperProperties {
                gate.withLock { $0.entered = true }
                while !gate.withLock({ $0.released }) { usleep(1000) }
                return [:]
            }
            let handling = Task { await bridge.receive(Self.message(Self.pageEvent()), origin: Self.origin) }
            while !gate.withLock({ $0.entered }) { try await Task.sleep(for: .milliseconds(5)) }
            let during = bridge.snapshot
            #expect(during.received == [Self.origin: 1])
            #expect(during.handled == 0, "received, but not yet committed")
            gate.withLock { $0.released = true }
            _ = try await handling.value.get()
            #expect(bridge.snapshot.handled == 1 && bridge.snapshot.accepted == 1)
            #expect(try store.status().pendingEvents == 1)
        }
    }

    @Test("a custom properties.$time is the event time; a too early one is ignored")
    func customTime() async throws {
        try await Self.withBridge { bridge, store in
            let late = Self.pageEvent(properties: ["$time": .number(1_600_000_000_000)])
            let early = Self.pageEvent(properties: ["$time": .number(1_000)])
            _ = try await bridge.receive(Self.message(late), origin: Self.origin).get()
            _ = try await bridge.receive(Self.message(early), origin: Self.origin).get()
            let stored = try Self.storedBodies(store).map(\.body)
            #expect(stored.map { $0["time"] as? Int } == [1_600_000_000_000, 1_700_000_000_123])
            #expect(stored.allSatisfy { ($0["properties"] as? [String: Any])?["$time"] == nil })
        }
    }
}
