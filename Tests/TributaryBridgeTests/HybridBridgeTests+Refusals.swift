import Foundation
import Testing

@testable import TributaryBridge

// What the bridge refuses, by message and by legacy sensorsanalytics:// navigation, and why.
extension HybridBridgeTests {
    /// One message the bridge must refuse, and why.
    struct Refused: Sendable, CustomStringConvertible {
        var name: String
        var message: String
        var origin: String = HybridBridgeTests.origin
        var reason: BridgeRejection.Reason
        var description: String { name }
    }

    static let refused: [Refused] = [
        Refused(
            name: "foreign origin", message: message(pageEvent()), origin: "http://localhost:9090",
            reason: .foreignOrigin),
        Refused(name: "opaque origin", message: message(pageEvent()), origin: "null", reason: .foreignOrigin),
        Refused(
            name: "https, not http", message: message(pageEvent()), origin: "https://127.0.0.1:8080",
            reason: .foreignOrigin),
        Refused(name: "not JSON", message: "not json", reason: .malformedMessage),
        Refused(name: "JSON array", message: "[1,2]", reason: .malformedMessage),
        Refused(name: "no callType", message: #"{"data":{}}"#, reason: .malformedMessage),
        Refused(name: "no data", message: #"{"callType":"app_h5_track"}"#, reason: .malformedMessage),
        Refused(
            name: "data not an object", message: #"{"callType":"app_h5_track","data":"x"}"#, reason: .malformedMessage),
        Refused(
            name: "visual tooling call", message: message([:], callType: "visualized_track"),
            reason: .unsupportedCallType),
        Refused(
            name: "oversized",
            message: message(pageEvent(properties: ["pad": .string(String(repeating: "x", count: 5000))])),
            reason: .messageTooLarge),
        Refused(
            name: "other project", message: message(pageEvent(server: "https://sa.example.com/sa?project=other")),
            reason: .foreignProject),
        Refused(
            name: "other host", message: message(pageEvent(server: "https://evil.example.com/sa?project=shop")),
            reason: .foreignProject),
        Refused(
            name: "default project", message: message(pageEvent(server: "https://sa.example.com/sa")),
            reason: .foreignProject),
        Refused(
            name: "no server_url", message: message(pageEvent(extra: ["server_url": .null])), reason: .foreignProject),
        Refused(
            name: "forged distinct_id", message: message(pageEvent(distinctID: "someone-else")), reason: .forgedIdentity
        ),
        Refused(
            name: "claimed login", message: message(pageEvent(extra: ["login_id": .string("user-evil")])),
            reason: .forgedIdentity),
        Refused(name: "profile_merge", message: message(pageEvent(type: "profile_merge")), reason: .unsupportedType),
        Refused(name: "item_set", message: message(pageEvent(type: "item_set")), reason: .unsupportedType),
        Refused(name: "bad event name", message: message(pageEvent(event: "Bad Name!")), reason: .invalidEvent),
        Refused(name: "reserved $ event", message: message(pageEvent(event: "$Mine")), reason: .invalidEvent),
        Refused(
            name: "object property", message: message(pageEvent(properties: ["nested": .object([:])])),
            reason: .invalidEvent),
        Refused(
            name: "mixed list", message: message(pageEvent(properties: ["l": .array([.string("a"), .number(1)])])),
            reason: .invalidEvent),
        Refused(name: "no time", message: message(pageEvent(extra: ["time": .string("now")])), reason: .invalidEvent),
        // Past Int64: refused, not a trap converting it.
        Refused(name: "time 1e19", message: message(pageEvent(extra: ["time": .number(1e19)])), reason: .invalidEvent),
        Refused(name: "time -1e19", message: message(pageEvent(extra: ["time": .number(-1e19)])), reason: .invalidEvent),
        Refused(name: "time after 9999", message: message(pageEvent(extra: ["time": .number(1e17)])), reason: .invalidEvent),
        // 2^64 + 1: a double would store 18446744073709551616, as `--properties` refuses it (inexactNumber).
        Refused(
            name: "whole number beyond Int64 a double changes",
            message: message(pageEvent(properties: ["big": .inexactInteger(Decimal(string: "18446744073709551617")!)])),
            reason: .invalidEvent),
        // Checked before the signup logs the group in: the login stays as it was.
        Refused(
            name: "signup with a bad lib key",
            message: message(pageEvent(type: "track_signup", distinctID: "user-1", extra: [
                "lib": .object(["bad key": .string("x")]),
            ])),
            reason: .invalidEvent),
        Refused(
            name: "signup with blank id", message: message(pageEvent(type: "track_signup", distinctID: " ")),
            reason: .invalidEvent),
    ]

    @Test("refused messages are counted by reason and never stored", arguments: refused)
    func refusal(_ case_: Refused) async throws {
        try await Self.withBridge { bridge, store in
            let result = await bridge.receive(case_.message, origin: case_.origin)
            #expect(Self.reason(result) == case_.reason, "\(case_.name): \(result)")
            if case .failure(let rejection) = result { #expect(!rejection.message.isEmpty) }
            #expect(bridge.rejections == [case_.reason: 1])
            #expect(bridge.snapshot.accepted == 0)
            let pending = try store.status().pendingEvents
            let loginID = try store.identity().loginID
            #expect(pending == 0)
            #expect(loginID == nil)
        }
    }

    @Test("the legacy channel: the user-agent marker, and events as sensorsanalytics:// navigations")
    func legacyChannel() async throws {
        try await Self.withBridge { bridge, store in
            #expect(bridge.configuration.userAgentMarker == " /sa-sdk-ios/sensors-verify/sa.example.com?shop")
            let event = JSON.object(Self.pageEvent(event: "H5Legacy")).text
            let encoded = try #require(event.addingPercentEncoding(withAllowedCharacters: .alphanumerics))
            let url = "sensorsanalytics://trackEvent?event=" + encoded
            let accepted = try #require(await bridge.receiveNavigation(url, origin: Self.origin))
            let receipt = try accepted.get()
            #expect(!receipt.eventID.isEmpty)
            let foreign = await bridge.receiveNavigation(url, origin: "http://localhost:9090")
            #expect(Self.reason(foreign) == .foreignOrigin)
            let garbage = await bridge.receiveNavigation(
                "sensorsanalytics://trackEvent?event=%7Bnot", origin: Self.origin)
            #expect(Self.reason(garbage) == .malformedMessage)
            // No event at all: refused as such, not as a message that is "not a JSON object"; the origin first.
            for query in ["foo=1", "event=", ""] {
                let url = "sensorsanalytics://trackEvent?" + query
                let missing = await bridge.receiveNavigation(url, origin: Self.origin)
                #expect(Self.reason(missing) == .malformedMessage)
                guard case .failure(let rejection)? = missing else { continue }
                #expect(rejection.message.contains("no event query parameter"), "\(url): \(rejection.message)")
                let fromForeign = await bridge.receiveNavigation(url, origin: "http://localhost:9090")
                #expect(Self.reason(fromForeign) == .foreignOrigin)
            }
            #expect(await bridge.receiveNavigation("https://example.com/", origin: Self.origin) == nil)
            let stored = try Self.storedBodies(store).map(\.body)
            #expect(stored.map { $0["event"] as? String } == ["H5Legacy"])
            #expect(stored.first?["_hybrid_h5"] as? Bool == true)
            #expect((stored.first?["properties"] as? [String: Any])?["_hybrid_h5"] == nil)
        }
    }
}
