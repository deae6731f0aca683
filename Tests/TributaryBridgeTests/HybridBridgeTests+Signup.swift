import Foundation
import Logging
import Testing
import Tributary
import TributaryStore
import TributaryTestSupport

@testable import TributaryBridge

// A page's track_signup: the app logged in with the event, or not at all.
extension HybridBridgeTests {
    @Test("a track_signup whose event is refused after the login leaves the login as it was", arguments: [nil, "user-0"])
    func signupRefusedAfterLogin(before: String?) async throws {
        try await withTemporaryGroup { group in
            var configuration = Tracker.Configuration(groupDirectory: group, producerKind: .hybrid)
            configuration.maxEventBytes = 2048  // the signup below encodes to more: refused once logged in
            let tracker = try Tracker(configuration: configuration)
            // The store's own login: no native $SignUp, which this limit would refuse too.
            if let before { _ = try tracker.store.login(before) }
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
}
