import Foundation
import Logging
import Testing
import Tributary
import TributaryStore
import TributaryTestSupport

@testable import TributaryBridge

/// The bridge's verification and enrichment, against a real shared store. The tests are in
/// `HybridBridgeTests+*.swift`, a file per concern; the helpers several of those files use are here.
@Suite("Hybrid bridge")
struct HybridBridgeTests {
    static let server = "https://sa.example.com/sa?project=shop"
    static let origin = "http://127.0.0.1:8080"

    /// A page event as the JavaScript client sends it, with what the web SDK guessed from the user agent.
    static func pageEvent(
        type: String = "track", event: String = "H5View", distinctID: String = "h5-anon",
        time: Int64 = 1_700_000_000_123,
        server: String = server, extra: [String: JSON] = [:], properties: [String: JSON] = [:]
    ) -> [String: JSON] {
        var props: [String: JSON] = [
            "$os": .string("iOS"), "$model": .string("iPhone"), "$app_version": .string("h5-guess"),
            "$lib": .string("js"), "$lib_version": .string("1.27.10"), "$url": .string("http://127.0.0.1:8080/p"),
            "$project": .string("page-project"), "$token": .string("t"), "$screen_width": .number(390),
            "app_channel": .string("page"), "price": .number(9.5),
        ]
        props.merge(properties) { $1 }
        var data: [String: JSON] = [
            "type": .string(type), "event": .string(event), "time": .number(Double(time)),
            "distinct_id": .string(distinctID), "anonymous_id": .string("h5-anon"),
            "lib": .object(["$lib": .string("js"), "$lib_method": .string("code"), "$lib_version": .string("1.27.10")]),
            "properties": .object(props), "_nocache": .string("12345"), "server_url": .string(server),
        ]
        data.merge(extra) { $1 }
        return data
    }

    static func message(_ data: [String: JSON], callType: String = "app_h5_track") -> String {
        JSON.object(["callType": .string(callType), "data": .object(data)]).text
    }

    /// Runs `body` with a bridge over a fresh group: the main app published presets (version 4.2.0),
    /// the hybrid tracker has a super property and a dynamic super property.
    static func withBridge(_ body: (HybridBridge, SharedStore) async throws -> Void) async throws {
        try await withTemporaryGroup { group in
            var appConfiguration = Tracker.Configuration(groupDirectory: group)
            appConfiguration.appVersion = "4.2.0"
            _ = try Tracker(configuration: appConfiguration)
            let tracker = try Tracker(configuration: .init(groupDirectory: group, producerKind: .hybrid))
            try tracker.registerSuperProperties(["app_channel": "app"])
            tracker.registerDynamicSuperProperties { ["$session_id": "s-42"] }
            var configuration = BridgeConfiguration(
                serverURL: server, allowedOrigins: [origin, "http://localhost:8080"])
            configuration.maxMessageBytes = 4096
            var logger = Logger(label: "tributary.bridge")
            logger.logLevel = .critical  // rejections are the point of these tests; keep their output quiet
            let bridge = HybridBridge(tracker: tracker, configuration: configuration, logger: logger)
            try await body(bridge, tracker.store)
        }
    }

    static func storedBodies(_ store: SharedStore) throws -> [(record: EventRecord, body: [String: Any])] {
        try store.events(limit: 1000).map { entry in
            let record = try entry.record.get()
            return (record, try #require(try JSONSerialization.jsonObject(with: Data(record.body)) as? [String: Any]))
        }
    }

    static func reason(_ result: Result<TrackReceipt, BridgeRejection>?) -> BridgeRejection.Reason? {
        guard case .failure(let rejection)? = result else { return nil }
        return rejection.reason
    }
}
