import Foundation
import Testing
import Tributary
import TributaryStore
import TributaryTestSupport

@Suite("User profiles")
struct ProfileTests {
    @Test("each operation is stored as a Sensors profile record of the group's user, in order with events")
    func records() async throws {
        try await withTemporaryGroup { group in
            let tracker = try TrackerTests.tracker(group)
            _ = try tracker.login("user-7")
            let set = try await tracker.profileSet(["name": "Ada", "plan": "pro", "born": .date(Date(timeIntervalSince1970: 0))])
            let event = try await tracker.track("AfterSet")
            let once = try await tracker.profileSetOnce(["first_seen": "2026-01-01"])
            let increment = try await tracker.profileIncrement(["visits": 1, "score": 2.5])
            let append = try await tracker.profileAppend(["tags": ["a", "b"]])
            let unset = try await tracker.profileUnset(["plan"])
            let delete = try await tracker.profileDelete()
            let receipts = [set, event, once, increment, append, unset, delete]
            #expect(receipts.map(\.seq) == receipts.map(\.seq).sorted(), "one order with events")
            #expect(Set(receipts.map(\.eventID)).count == receipts.count, "each record has its own event_id")

            let bodies = try receipts.map { try TrackerTests.body(tracker.store, seq: $0.seq) }
            #expect(
                bodies.map { $0["type"] as? String } == [
                    "profile_set", "track", "profile_set_once", "profile_increment", "profile_append", "profile_unset",
                    "profile_delete",
                ])
            for (body, receipt) in zip(bodies, receipts) where body["type"] as? String != "track" {
                #expect(body["event"] == nil, "a profile record has no event name")
                #expect(body["distinct_id"] as? String == "user-7" && body["login_id"] as? String == "user-7")
                #expect(body["event_id"] as? String == receipt.eventID)
                #expect(body["time"] is NSNumber && body["_track_id"] is NSNumber)
                #expect((body["lib"] as? [String: Any])?["$lib_method"] as? String == "code")
                #expect(body["_hybrid_h5"] == nil)
            }
            let properties = bodies.map { $0["properties"] as? [String: Any] ?? [:] }
            #expect(properties[0]["name"] as? String == "Ada" && properties[0]["$os"] == nil, "no presets in a profile")
            #expect(properties[0]["born"] is String, "a date as Sensors' DATETIME text")
            #expect(properties[3]["visits"] as? Int == 1 && properties[3]["score"] as? Double == 2.5)
            #expect(properties[4]["tags"] as? [String] == ["a", "b"])
            #expect(properties[5]["plan"] as? Bool == true)
            #expect(properties[6].isEmpty)
        }
    }

    @Test("a profile operation that breaks a rule is a TrackingError naming the property; nothing is written", arguments: [
        (ProfileOperation.increment, ["visits": "many"] as [String: PropertyValue], TrackingError.Code.invalidProfileUpdate, "visits"),
        (.increment, ["flag": true], .invalidProfileUpdate, "flag"),
        (.append, ["tags": "a"], .invalidProfileUpdate, "tags"),
        (.append, ["tags": 3], .invalidProfileUpdate, "tags"),
        (.unset, ["plan": false], .invalidProfileUpdate, "plan"),
        (.delete, ["plan": true], .invalidProfileUpdate, "properties"),
        (.set, [:], .invalidProfileUpdate, "properties"),
        (.set, ["distinct_id": "x"], .reservedName, "distinct_id"),
        (.set, ["Bad Name": "x"], .invalidName, "Bad Name"),
        (.setOnce, ["ratio": .double(.nan)], .nonFiniteNumber, "ratio"),
        (.set, ["long": .string(String(repeating: "x", count: 8193))], .valueTooLong, "long"),
    ])
    func refused(
        operation: ProfileOperation, properties: [String: PropertyValue], code: TrackingError.Code, field: String
    ) async throws {
        try await withTemporaryGroup { group in
            let tracker = try TrackerTests.tracker(group)
            let error = await #expect(throws: TrackingError.self) {
                try await tracker.profile(operation, properties: properties)
            }
            #expect(error?.code == code && error?.field == field, "\(String(describing: error))")
            #expect(try tracker.store.events(limit: 10).isEmpty)
        }
    }

    @Test("ProfileOperation reads each record type and nothing else")
    func operations() {
        #expect(ProfileOperation.allCases.map(\.rawValue) == [
            "profile_set", "profile_set_once", "profile_increment", "profile_append", "profile_unset", "profile_delete",
        ])
        #expect(ProfileOperation.allCases.allSatisfy { ProfileOperation(rawValue: $0.rawValue) == $0 })
        #expect(ProfileOperation(rawValue: "track") == nil && ProfileOperation(rawValue: "item_set") == nil)
    }
}
