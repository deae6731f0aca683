import Foundation
import Synchronization
import Testing
import Tributary
import TributaryStore
import TributaryTestSupport

@Suite("Identity events")
struct IdentityTests {
    static func bodies(_ store: SharedStore) throws -> [[String: Any]] {
        try store.events(limit: .max).map { entry in
            try #require(try JSONSerialization.jsonObject(with: Data(try entry.record.get().body)) as? [String: Any])
        }
    }

    @Test(
        "login tracks $SignUp with original_id, in the order of the other events; the same login again tracks nothing")
    func signUp() throws {
        try withTemporaryGroup { group in
            let app = try TrackerTests.tracker(group)
            let anonymous = try app.identity().anonymousID
            try app.track("Browse")
            try app.login("user-1", properties: ["channel": "mail"])
            try app.login("user-1")  // already logged in as user-1: no second sign-up
            try app.track("Buy")
            try app.logout()
            let receipt = try #require(try app.signUp("user-2"))
            #expect(receipt.distinctID == "user-2")
            #expect(try app.signUp("user-2") == nil)
            let bodies = try Self.bodies(app.store)
            #expect(bodies.map { $0["event"] as? String } == ["Browse", "$SignUp", "Buy", "$Logout", "$SignUp"])
            let signUp = bodies[1]
            #expect(signUp["type"] as? String == "track_signup")
            #expect(signUp["distinct_id"] as? String == "user-1")
            #expect(signUp["original_id"] as? String == anonymous)
            #expect(signUp["login_id"] as? String == "user-1")
            #expect((signUp["properties"] as? [String: Any])?["channel"] as? String == "mail")
            #expect(bodies[0]["original_id"] == nil && bodies[2]["original_id"] == nil)
            #expect(bodies[0]["distinct_id"] as? String == anonymous)
            #expect(bodies[2]["distinct_id"] as? String == "user-1")
            #expect(bodies[4]["distinct_id"] as? String == "user-2")
            #expect(bodies[4]["original_id"] as? String == anonymous)
        }
    }

    @Test("logout tracks $Logout under the login that ended; identify tracks $Identify with original_id; no change tracks nothing")
    func logoutAndIdentify() throws {
        try withTemporaryGroup { group in
            let app = try TrackerTests.tracker(group)
            let ext = try TrackerTests.tracker(group, kind: .extension)
            let anonymous = try app.identity().anonymousID
            try app.logout()  // not logged in: nothing
            try app.login("user-1")
            let logout = try #require(try ext.signOut())  // any process of the group may log it out
            #expect(logout.distinctID == "user-1")
            #expect(try app.signOut() == nil)
            try app.track("Anonymous")
            let identify = try #require(try app.reidentify(anonymousID: "device-42"))
            #expect(identify.distinctID == "device-42")
            #expect(try app.reidentify(anonymousID: "device-42") == nil)
            try app.track("Identified")
            let bodies = try Self.bodies(app.store)
            #expect(bodies.map { $0["event"] as? String } == ["$SignUp", "$Logout", "Anonymous", "$Identify", "Identified"])
            let (leave, change) = (bodies[1], bodies[3])
            #expect(leave["type"] as? String == "track")
            #expect(leave["distinct_id"] as? String == "user-1" && leave["login_id"] as? String == "user-1")
            #expect(leave["original_id"] == nil)
            #expect(bodies[2]["distinct_id"] as? String == anonymous && bodies[2]["login_id"] == nil)
            #expect(change["distinct_id"] as? String == "device-42" && change["anonymous_id"] as? String == "device-42")
            #expect(change["original_id"] as? String == anonymous)
            #expect(bodies[4]["distinct_id"] as? String == "device-42")
            #expect(try app.identity() == Identity(anonymousID: "device-42", loginID: nil, deviceID: try app.identity().deviceID))
        }
    }

    @Test("with tracksIdentityChanges off, logout and identify change the identity and track nothing; login still tracks $SignUp")
    func identityChangesUntracked() throws {
        try withTemporaryGroup { group in
            var config = Tracker.Configuration(groupDirectory: group)
            config.tracksIdentityChanges = false
            let app = try Tracker(configuration: config)
            try app.login("user-1")
            #expect(try app.signOut() == nil)
            #expect(try app.identity().loginID == nil)
            #expect(try app.reidentify(anonymousID: "device-42") == nil)
            #expect(try app.identity().anonymousID == "device-42")
            #expect(try Self.bodies(app.store).map { $0["event"] as? String } == ["$SignUp"])
        }
    }

    @Test("a login whose $SignUp is refused leaves the group logged out")
    func refusedSignUp() throws {
        try withTemporaryGroup { group in
            let app = try TrackerTests.tracker(group)
            #expect(throws: TrackingError.self) { try app.login("user-1", properties: ["bad key": 1]) }
            #expect(try app.identity().loginID == nil)
            #expect(try app.store.events(limit: .max).isEmpty)
        }
    }

    @Test("$is_first_day: true on the installation's first local day, false on the next, for every producer")
    func firstDay() throws {
        try withTemporaryGroup { group in
            let wall = Mutex<Int64>(1_764_326_400_000)  // 2025-11-28 10:40 UTC
            var config = Tracker.Configuration(groupDirectory: group)
            config.wallMillis = { wall.withLock { $0 } }
            let app = try Tracker(configuration: config)
            try app.track("First")
            wall.withLock { $0 += 86_400_000 }
            try app.track("Next")
            // A later extension of the same group: the install's day, not its own first day.
            var extensionConfig = Tracker.Configuration(groupDirectory: group, producerKind: .extension)
            extensionConfig.wallMillis = { wall.withLock { $0 } }
            let ext = try Tracker(configuration: extensionConfig)
            try ext.track("Shared")
            let days = try Self.bodies(app.store).map {
                ($0["properties"] as? [String: Any])?["$is_first_day"] as? Bool
            }
            #expect(days == [true, false, false])
            #expect(try app.store.configurationValue(ConfigurationKey.firstDay)?.hasPrefix("\"2025-11-") == true)
        }
    }
}
