import Foundation
import Logging
import Synchronization
import Testing
import Tributary
import TributaryStore
import TributaryTestSupport

@testable import TributaryBridge

/// The bridge's verification and enrichment, against a real shared store.
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
            #expect(properties["_hybrid_h5"] as? Bool == true)
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

    @Test("a track_signup whose event is refused after the login leaves the login as it was", arguments: [nil, "user-0"])
    func signupRefusedAfterLogin(before: String?) async throws {
        try await withTemporaryGroup { group in
            var configuration = Tracker.Configuration(groupDirectory: group, producerKind: .hybrid)
            configuration.maxEventBytes = 2048  // the signup below encodes to more: refused once logged in
            let tracker = try Tracker(configuration: configuration)
            if let before { try tracker.login(before) }
            let bridge = HybridBridge(
                tracker: tracker, configuration: BridgeConfiguration(serverURL: Self.server, allowedOrigins: [Self.origin]),
                logger: Logger(label: "tributary.bridge"))
            let signup = Self.pageEvent(
                type: "track_signup", event: "$SignUp", distinctID: "user-7",
                properties: ["long": .string(String(repeating: "x", count: 4000))])
            let result = await bridge.receive(Self.message(signup), origin: Self.origin)
            #expect(Self.reason(result) == .invalidEvent, "\(result)")
            #expect(try tracker.identity().loginID == before)
            #expect(try tracker.store.status().pendingEvents == 0)
        }
    }

    @Test("a track_signup the full store refuses changes no login: the login and its event are one transaction")
    func signupStoreFull() async throws {
        try await withTemporaryGroup { group in
            var configuration = Tracker.Configuration(groupDirectory: group, producerKind: .hybrid)
            configuration.store.initialMapSize = 256 << 10
            configuration.store.quota = 512 << 10
            let tracker = try Tracker(configuration: configuration)
            try tracker.login("user-0")
            let filler = String(repeating: "x", count: 4000)
            do {
                while true { try await tracker.track("Fill", properties: ["filler": .string(filler)]) }
            } catch let error as StoreError {
                #expect(error.code == .storeFull)
            }
            let pendingBefore = try tracker.store.status().pendingEvents
            let transactionBefore = tracker.store.lastTransactionID
            let bridge = HybridBridge(
                tracker: tracker, configuration: BridgeConfiguration(serverURL: Self.server, allowedOrigins: [Self.origin]),
                logger: Logger(label: "tributary.bridge"))
            let signup = Self.pageEvent(
                type: "track_signup", event: "$SignUp", distinctID: "user-7",
                properties: ["filler": .string(filler)])
            let result = await bridge.receive(Self.message(signup), origin: Self.origin)
            #expect(Self.reason(result) == .storeFailed, "\(result)")
            #expect(try tracker.identity().loginID == "user-0")
            #expect(try tracker.store.status().pendingEvents == pendingBefore)
            // Not even for a moment: no transaction committed (a login and its roll-back would be two).
            #expect(tracker.store.lastTransactionID == transactionBefore)
        }
    }

    @Test("a lone surrogate a page's JSON.stringify wrote is read as U+FFFD; a pair, and an escaped backslash, are kept")
    func loneSurrogates() async throws {
        try await Self.withBridge { bridge, store in
            let template = Self.message(Self.pageEvent(properties: ["cut": .string("CUT"), "pair": .string("PAIR"), "slash": .string("SLASH")]))
            let message = template.replacingOccurrences(of: "CUT", with: #"x\ud83dy\ude00z"#)
                .replacingOccurrences(of: "PAIR", with: #"\ud83d\ude00"#)
                .replacingOccurrences(of: "SLASH", with: #"\\ud800"#)
            _ = try await bridge.receive(message, origin: Self.origin).get()
            let properties = try #require(try Self.storedBodies(store).first?.body["properties"] as? [String: Any])
            #expect(properties["cut"] as? String == "x\u{FFFD}y\u{FFFD}z")
            #expect(properties["pair"] as? String == "😀")
            #expect(properties["slash"] as? String == #"\ud800"#)
        }
        #expect(JSON.replacingLoneSurrogates(Array(#"{"a":"\u0041\\u"}"#.utf8)) == nil, "nothing to replace")
    }

    @Test("a page track_signup logs the app in, its original_id the app's anonymous id; later page events may carry that login")
    func signup() async throws {
        try await Self.withBridge { bridge, store in
            let anonymous = try store.identity().anonymousID
            let signup = Self.pageEvent(
                type: "track_signup", event: "$SignUp", distinctID: "user-7", extra: ["original_id": .string("h5-anon")])
            _ = try await bridge.receive(Self.message(signup), origin: Self.origin).get()
            #expect(try store.identity().loginID == "user-7")
            let after = Self.pageEvent(distinctID: "user-7", extra: ["login_id": .string("user-7")])
            _ = try await bridge.receive(Self.message(after), origin: Self.origin).get()
            let stored = try Self.storedBodies(store).map(\.body)
            #expect(stored.map { $0["type"] as? String } == ["track_signup", "track"])
            // As the iOS SDK sends it: the anonymous id the login replaces, the app's, not the page's.
            #expect(stored.map { $0["original_id"] as? String } == [anonymous, nil])
            #expect(
                stored.allSatisfy { $0["distinct_id"] as? String == "user-7" && $0["login_id"] as? String == "user-7" })
        }
    }

    @Test("whole numbers keep their digits as --properties keeps them: exactly within Int64, beyond it a double's own")
    func exactNumbers() async throws {
        try await Self.withBridge { bridge, store in
            let numbers = [
                "above": "9007199254740993", "max": "9223372036854775807", "min": "-9223372036854775808",
                "edge": "9007199254740992", "double": "100000000000000000000",
            ]
            var message = Self.message(Self.pageEvent(properties: numbers.mapValues { _ in .string("N") }))
            for (key, digits) in numbers {
                message = message.replacingOccurrences(of: #""\#(key)":"N""#, with: #""\#(key)":\#(digits)"#)
            }
            _ = try await bridge.receive(message, origin: Self.origin).get()
            let body = String(decoding: try #require(try store.events(limit: 1).first).record.get().body, as: UTF8.self)
            for key in ["above", "max", "min", "edge"] {
                #expect(body.contains(#""\#(key)":\#(numbers[key]!)"#), "\(key) keeps its digits: \(body)")
            }
            let stored = try #require(try Self.storedBodies(store).first?.body["properties"] as? [String: Any])
            #expect(stored["double"] as? Double == 1e20, "the shortest decimal of a double is that double")
        }
        #expect(JSON.parse(Array("9007199254740993".utf8)) == .integer(9_007_199_254_740_993))
        #expect(JSON.parse(Array("9007199254740992".utf8)) == .number(9_007_199_254_740_992))
        #expect(JSON.parse(Array("1e20".utf8)) == .number(1e20))
        #expect(
            JSON.parse(Array("18446744073709551617".utf8)) == .inexactInteger(Decimal(string: "18446744073709551617")!))
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
        Refused(name: "profile_set", message: message(pageEvent(type: "profile_set")), reason: .unsupportedType),
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
            #expect((stored.first?["properties"] as? [String: Any])?["_hybrid_h5"] as? Bool == true)
        }
    }

    static func reason(_ result: Result<TrackReceipt, BridgeRejection>?) -> BridgeRejection.Reason? {
        guard case .failure(let rejection)? = result else { return nil }
        return rejection.reason
    }

    @Test("server URLs compare by host and project (default 'default'); origins are normalised")
    func serverProjects() {
        #expect(
            ServerProject(url: "https://SA.example.com/sa?project=shop")
                == ServerProject(host: "sa.example.com", project: "shop"))
        #expect(ServerProject(url: "http://sa.example.com:8106/sa")?.project == "default")
        #expect(ServerProject(url: "http://sa.example.com/sa?project=")?.project == "default")
        #expect(ServerProject(url: "/relative/path") == nil)
        let configuration = BridgeConfiguration(serverURL: Self.server, allowedOrigins: ["HTTP://Example.com:80/"])
        #expect(configuration.allowedOrigins == ["http://example.com"])
    }

    @Test("opaque origins are never trusted, even when listed; origins are normalised when assigned too")
    func opaqueOriginsNeverTrusted() async throws {
        var configuration = BridgeConfiguration(serverURL: Self.server, allowedOrigins: ["null", "://", Self.origin])
        #expect(configuration.allowedOrigins == [Self.origin])
        configuration.allowedOrigins = ["HTTP://Example.com:80/", "NULL", ""]
        #expect(configuration.allowedOrigins == ["http://example.com"])
        configuration.allowedOrigins.insert("HTTPS://Example.com:443")
        #expect(configuration.allowedOrigins == ["http://example.com", "https://example.com"])

        try await withTemporaryGroup { group in
            let tracker = try Tracker(configuration: .init(groupDirectory: group, producerKind: .hybrid))
            var listed = BridgeConfiguration(serverURL: Self.server, allowedOrigins: [Self.origin])
            listed.allowedOrigins.insert("null")
            var logger = Logger(label: "tributary.bridge")
            logger.logLevel = .critical
            let bridge = HybridBridge(tracker: tracker, configuration: listed, logger: logger)
            for origin in ["null", "://", ""] {
                let result = await bridge.receive(Self.message(Self.pageEvent()), origin: origin)
                #expect(Self.reason(result) == .foreignOrigin, "origin '\(origin)': \(result)")
            }
            #expect(try tracker.store.status().pendingEvents == 0)
        }
    }

    @Test("a configuration value no page can ever match is named among its problems, not dropped unsaid")
    func configurationProblems() {
        let neverMatched = [
            "127.0.0.1:8080", "https://a.example/app", "null", "https://a.example ", "https://user@a.example",
            "https://*.a.example", "https://a.example:http",
        ]
        var configuration = BridgeConfiguration(serverURL: "sa.example.com/sa", allowedOrigins: Set(neverMatched + [Self.origin]))
        configuration.allowedServerURLs = ["https://b.example/sa", "/sa?project=x"]
        #expect(configuration.allowedOrigins == [Self.origin], "none of the others is ever a frame's origin")
        let problems = configuration.problems
        #expect(problems.count == neverMatched.count + 2, "\(problems)")
        for named in neverMatched.map({ "'\($0)'" }) + ["'/sa?project=x'"] {
            #expect(problems.contains { $0.contains(named) }, "\(named) not named: \(problems)")
        }
        // A whitelisted server still takes events: not "every page event" is refused.
        #expect(problems.contains { $0.contains("'sa.example.com/sa' is not an absolute URL") && $0.contains("naming the app's server") })
        let fine = BridgeConfiguration(
            serverURL: Self.server, allowedOrigins: [Self.origin, "HTTP://Example.com:80/", "http://[::1]:8080", "https://[::1]"])
        #expect(fine.problems.isEmpty, "\(fine.problems)")
        #expect(fine.allowedOrigins.count == 4)
    }

    @Test("JSON keeps booleans and numbers apart")
    func jsonKinds() {
        #expect(
            JSON.parse(Array(#"{"a":true,"b":1,"c":0,"d":"x","e":null}"#.utf8))
                == .object([
                    "a": .bool(true), "b": .number(1), "c": .number(0), "d": .string("x"), "e": .null,
                ]))
        #expect(JSON.parse(Array("{".utf8)) == nil)
        #expect(JSON.object(["k": .string("a\"\n\u{1}")]).text == #"{"k":"a\"\n\u0001"}"#)
    }
}

/// The web-view host against the real headless Chromium, without the page servers.
@Suite("Web view host")
struct WebViewHostTests {
    @Test("a missing browser binary is a typed error")
    func missingBrowser() {
        let configuration = BridgeConfiguration(serverURL: HybridBridgeTests.server, allowedOrigins: [])
        #expect(throws: BrowserError.self) {
            _ = try WebViewHost(configuration: configuration, executable: "/nonexistent/chromium")
        }
    }

    @Test("a host dropped without close() stops its browser and removes its profile")
    func droppedHost() async throws {
        let configuration = BridgeConfiguration(serverURL: HybridBridgeTests.server, allowedOrigins: [])
        var host: WebViewHost? = try WebViewHost(configuration: configuration)
        let pid = try #require(host?.browserPID)
        let profile = try #require(host?.profileDirectory)
        try await host?.open("about:blank")
        host = nil
        // Reaped by the stop: no such process (a zombie would still answer kill 0).
        #expect(kill(pid, 0) != 0 && errno == ESRCH, "the browser of a dropped host still runs")
        #expect(!FileManager.default.fileExists(atPath: profile))
    }

    @Test("the injected script reaches the page; a frame with an opaque origin is refused as foreign")
    func opaqueOrigin() async throws {
        try await withTemporaryGroup { group in
            let configuration = BridgeConfiguration(
                serverURL: HybridBridgeTests.server, allowedOrigins: ["http://127.0.0.1:1"])
            let host = try WebViewHost(configuration: configuration)
            defer { host.close() }
            var logger = Logger(label: "tributary.bridge")
            logger.logLevel = .critical
            let tracker = try Tracker(configuration: .init(groupDirectory: group, producerKind: .hybrid))
            let bridge = HybridBridge(tracker: tracker, configuration: configuration, logger: logger)
            var singleton: String?
            // Posts the server URL the injected script announces, once the bridge is there.
            let script =
                "(function post() { var h = window.webkit && window.webkit.messageHandlers;"
                + " if (h && h.sensorsdataNativeTracker) {"
                + " h.sensorsdataNativeTracker.postMessage(window.SensorsData_iOS_JS_Bridge.sensorsdata_app_server_url);"
                + " } else { setTimeout(post, 10); } })();"
            try await withThrowingTaskGroup(of: Void.self) { tasks in
                tasks.addTask { await host.run(bridge: bridge) }
                try await host.open("data:text/html,<script>\(script)</script>")
                let start = ContinuousClock.now
                while bridge.snapshot.received.isEmpty && ContinuousClock.now - start < .seconds(60) {
                    try await Task.sleep(for: .milliseconds(20))
                }
                singleton = host.singletonDirectory
                host.close()
                try await tasks.waitForAll()
            }
            // Its helpers may still write there as the browser ends: a removal that met their files left
            // whole profiles in the temporary directory.
            #expect(!FileManager.default.fileExists(atPath: host.profileDirectory), "the browser's profile was left behind")
            // Chromium's singleton directory is outside the profile and outlives a SIGTERMed browser.
            let left = try #require(singleton, "the browser made no singleton socket")
            #expect(!FileManager.default.fileExists(atPath: left), "the browser's singleton directory was left behind")
            #expect(bridge.snapshot.received == ["null": 1], "data: documents have an opaque origin")
            #expect(bridge.rejections == [.foreignOrigin: 1])
            #expect(try tracker.store.status().pendingEvents == 0)
        }
    }

    /// A frame tree and the origin a `sensorsanalytics://` navigation of one of its frames is credited with.
    struct Navigation: Sendable, CustomStringConvertible {
        var name: String
        var frame: String
        var origins: [String: String]
        var parents: [String: String]
        var credited: String
        var description: String { name }
    }

    static let trusted = "http://127.0.0.1:8080"
    static let foreign = "http://localhost:9090"
    static let navigations: [Navigation] = [
        Navigation(
            name: "a trusted frame navigating itself", frame: "top", origins: ["top": trusted], parents: [:],
            credited: trusted),
        Navigation(
            name: "a fresh iframe speaks for the trusted page that made it", frame: "fresh", origins: ["top": trusted],
            parents: ["fresh": "top"], credited: trusted),
        Navigation(
            name: "an opaque (sandboxed, srcdoc) iframe navigating itself is credited with its own origin",
            frame: "sandboxed", origins: ["top": trusted, "sandboxed": "null"], parents: ["sandboxed": "top"],
            credited: "null"),
        Navigation(
            name: "a fresh iframe of an opaque frame", frame: "fresh",
            origins: ["top": trusted, "sandboxed": "null"], parents: ["fresh": "sandboxed", "sandboxed": "top"],
            credited: "null"),
        Navigation(
            name: "a foreign frame navigating its trusted child", frame: "child",
            origins: ["top": foreign, "child": trusted], parents: ["child": "top"], credited: foreign),
    ]

    @Test("a legacy navigation is credited with the frame's own origin, opaque ones included", arguments: navigations)
    func navigationOrigin(_ case_: Navigation) {
        #expect(
            WebViewHost.navigationOrigin(
                frame: case_.frame, origins: case_.origins, parents: case_.parents, trusted: [Self.trusted])
                == case_.credited)
    }

    @Test("in the browser, a sandboxed iframe's legacy navigation is refused; a same-origin srcdoc iframe's is not")
    func sandboxedLegacyNavigation() async throws {
        // The page makes two srcdoc iframes that load sensorsanalytics://trackEvent themselves: one
        // sandboxed (an opaque origin), one not (its parent's origin). Each waits for the injected
        // script first: Chromium puts a sandboxed iframe in a process of its own and does not always
        // hold its first document until the host has set it up.
        let page = """
            <!doctype html><html><body><script>
            (function start() {
              var bridge = window.SensorsData_iOS_JS_Bridge;
              if (!bridge) { setTimeout(start, 10); return; }
              function frame(name, sandboxed) {
                var event = JSON.stringify({ type: 'track', event: name, time: Date.now(), distinct_id: 'page-anon',
                  anonymous_id: 'page-anon', lib: { $lib: 'js' }, properties: {}, server_url: bridge.sensorsdata_app_server_url });
                var iframe = document.createElement('iframe');
                if (sandboxed) { iframe.setAttribute('sandbox', 'allow-scripts'); }
                var url = 'sensorsanalytics://trackEvent?event=' + encodeURIComponent(event);
                iframe.srcdoc = '<script>(function go() { if (!window.SensorsData_iOS_JS_Bridge) { setTimeout(go, 10); return; }'
                  + ' location.href = ' + JSON.stringify(url) + '; })();</' + 'script>';
                document.body.appendChild(iframe);
              }
              frame('FromSameOrigin', false);
              frame('FromSandboxed', true);
            })();
            </script></body></html>
            """
        try await BrowserHarness.run(pages: ["/": page]) { harness in
            try await harness.wait(for: "both navigations") {
                harness.bridge.snapshot.accepted + harness.bridge.rejections.values.reduce(0, +) == 2
            }
            #expect(harness.bridge.snapshot.accepted == 1)
            #expect(harness.bridge.rejections == [.foreignOrigin: 1])
            #expect(harness.bridge.snapshot.received == [harness.origin: 1, "null": 1])
            let stored = try harness.tracker.store.events(limit: 10).map {
                String(decoding: try $0.record.get().body, as: UTF8.self)
            }
            #expect(stored.count == 1 && stored.allSatisfy { $0.contains(#""event":"FromSameOrigin""#) })
        }
    }
}

extension WebViewHostTests {
    @Test("in the browser, a page cycling cross-site iframes: the host's frame records and commands stay bounded, and nothing is logged as a warning")
    func iframeChurn() async throws {
        // Each round adds an iframe from another site (localhost against 127.0.0.1: a process, and a
        // target, of its own under site isolation) holding an iframe of its own, lets it load, and
        // removes it. Then the page posts one event, and the host has handled every event before it.
        let rounds = 8  // a renderer process each: more would load the machine for other suites
        let page = """
            <!doctype html><html><body><script>
            var round = 0;
            function next() {
              if (round === \(rounds)) {
                window.webkit.messageHandlers.sensorsdataNativeTracker.postMessage(JSON.stringify({
                  callType: 'app_h5_track', data: { type: 'track', event: 'ChurnDone', time: Date.now(),
                  distinct_id: 'page-anon', anonymous_id: 'page-anon', lib: { $lib: 'js' }, properties: {},
                  server_url: window.SensorsData_iOS_JS_Bridge.sensorsdata_app_server_url } }));
                return;
              }
              round += 1;
              var iframe = document.createElement('iframe');
              iframe.onload = function () { setTimeout(function () { iframe.remove(); setTimeout(next, 20); }, 50); };
              iframe.src = 'http://localhost:' + location.port + '/child?' + round;
              document.body.appendChild(iframe);
            }
            (function start() { if (!window.webkit) { setTimeout(start, 10); return; } next(); })();
            </script></body></html>
            """
        let child = "<!doctype html><html><body><iframe srcdoc='<p>inner</p>'></iframe></body></html>"
        let logs = CapturedLogs()
        try await BrowserHarness.run(
            pages: ["/": page, "/child": child], hostLogger: Logger(label: "test") { _ in logs }
        ) { harness in
            try await harness.wait(for: "the page's event after the churn") { harness.bridge.snapshot.accepted == 1 }
            // The iframes' ends come from their own targets and the browser, and may trail the page's message.
            try await harness.wait(for: "the frames' ends") {
                let origins = harness.host.origins.get()
                return origins.frames.count <= 2 && origins.parents.isEmpty && harness.host.unansweredCommands == 0
            }
            let origins = harness.host.origins.get()
            // Left: the frame and context of the page and of the browser's first tab (about:blank);
            // every iframe's went with it.
            #expect(origins.frames.count == 2, "\(origins.frames)")
            #expect(origins.parents.isEmpty, "\(origins.parents)")
            #expect(origins.contexts.count == 2, "\(origins.contexts)")
            #expect(harness.host.unansweredCommands == 0)
        }
        let lines = logs.store.lines.withLock { $0 }
        // Each cross-site iframe's target was set up before its first document: the script run for a
        // document already there found none, which is expected, and logged for debugging only.
        #expect(lines.filter { $0.hasPrefix("debug DevTools command failed") }.count >= rounds, "\(lines)")
        #expect(!lines.contains { $0.hasPrefix("warning") || $0.hasPrefix("error") }, "\(lines)")
    }
}
