import CTributaryCrash
import Foundation
import Testing
import Tributary
@testable import TributaryAutoTrack
import TributaryStore
import TributaryTestSupport

#if canImport(Glibc)
import Glibc
#endif

func page(_ instance: String, _ className: String, properties: [String: PropertyValue] = [:], url: String? = nil)
    -> PageDescription
{
    PageDescription(
        instanceID: instance, className: className, title: className, root: homePage().root, url: url,
        properties: properties)
}

@Suite("Page leave, page properties and the navigation stack", .serialized)
struct PageLeaveTests {
    @Test(
        "push, back, background, foreground, terminate: each page view ends in an $AppPageLeave; time in the background does not count"
    )
    func leaves() throws {
        try withTemporaryGroup { group in
            let clock = ManualClock()
            let auto = try makeAuto(group, clock: clock, pageIDs: ["HomeViewController": "home", "Cart": "cart"])
            try auto.handle(.didFinishLaunching(inBackground: false))
            try auto.handle(.didBecomeActive)
            try auto.pageAppeared(page("h", "HomeViewController", properties: ["tab": "main"], url: "app://home"))
            clock.advance(seconds: 3)
            try auto.pageAppeared(page("c", "Cart", properties: ["cart_id": 7]))
            clock.advance(seconds: 2)
            try auto.pageAppeared(page("h", "HomeViewController", properties: ["tab": "main"], url: "app://home"))  // back
            clock.advance(seconds: 4)
            try auto.handle(.willResignActive)
            try auto.handle(.didEnterBackground)
            clock.advance(seconds: 100)
            try auto.handle(.willEnterForeground)
            try auto.handle(.didBecomeActive)
            clock.advance(seconds: 1.5)
            try auto.handle(.willTerminate)

            let events = try storedEvents(group)
            #expect(
                events.map(\.event) == [
                    "$AppStart", "$AppViewScreen", "$AppPageLeave", "$AppViewScreen", "$AppPageLeave", "$AppViewScreen",
                    "$AppPageLeave", "$AppEnd", "$AppStart", "$AppViewScreen", "$AppPageLeave", "$AppEnd",
                ])
            let leaves = events.filter(isEvent("$AppPageLeave"))
            #expect(leaves.map { $0["event_duration"] as? Double } == [3, 2, 4, 1.5])
            #expect(leaves.map { $0["$screen_name"] as? String } == ["home", "cart", "home", "home"])
            #expect(leaves.map { $0["$referrer"] as? String } == [nil, "home", nil, nil])
            #expect(leaves[0]["tab"] as? String == "main")
            #expect(leaves[1]["cart_id"] as? Int == 7)
            #expect(leaves[0]["$url"] as? String == "app://home")
            #expect(leaves[1]["$url"] as? String == "cart", "no url: the page id")
            let views = events.filter(isEvent("$AppViewScreen"))
            #expect(
                views.map { $0["$referrer"] as? String } == [nil, "home", nil, nil], "back to home: nothing below it")
            #expect(views.allSatisfy { $0["$url"] != nil })
            #expect(views[0]["tab"] as? String == "main")
            #expect(Set(leaves.map(\.eventID)).count == 4)
        }
    }

    @Test("$referrer is the page below in the stack: back to a middle page names the one below it, not the page left")
    func referrerAfterBack() throws {
        try withTemporaryGroup { group in
            let auto = try makeAuto(group, clock: ManualClock())
            try auto.handle(.didFinishLaunching(inBackground: false))
            try auto.handle(.didBecomeActive)
            for (instance, name) in [("a", "A"), ("b", "B"), ("c", "C"), ("b", "B"), ("d", "D")] {
                try auto.pageAppeared(page(instance, name))
            }
            let views = try storedEvents(group).filter(isEvent("$AppViewScreen"))
            #expect(views.map { $0["$screen_name"] as? String } == ["A", "B", "C", "B", "D"])
            #expect(views.map { $0["$referrer"] as? String } == [nil, "A", "B", "A", "B"])
        }
    }

    @Test("invalid page properties are refused before anything changes")
    func invalidPageProperties() throws {
        try withTemporaryGroup { group in
            let auto = try makeAuto(group, clock: ManualClock())
            try auto.handle(.didFinishLaunching(inBackground: false))
            try auto.handle(.didBecomeActive)
            try auto.pageAppeared(page("a", "A"))
            #expect(throws: TrackingError.self) { try auto.pageAppeared(page("b", "B", properties: ["bad key": 1])) }
            #expect(try storedEvents(group).map(\.event) == ["$AppStart", "$AppViewScreen"], "A is still on screen")
        }
    }

    @Test(
        "a crash with a page on screen: the next start backfills its $AppPageLeave, ended at the crash, under the live one's id"
    )
    func pendingLeaveAfterCrash() throws {
        try withTemporaryGroup { group in
            let clock = ManualClock()
            let crashed = try makeAuto(group, clock: clock, captureCrashes: true)
            try crashed.start()
            defer { tributary_crash_uninstall() }
            try crashed.handle(.didFinishLaunching(inBackground: false))
            try crashed.handle(.didBecomeActive)
            try crashed.pageAppeared(page("p", "ProductViewController", properties: ["sku": "A-1"]))
            tributary_crash_uninstall()
            let visit = try #require(crashed.visitFile.all()[getpid()])
            #expect(visit.properties["sku"] == "A-1")
            let record = crashRecordBytes(
                signal: SIGSEGV, foreground: true, activeSince: visit.startedBoot,
                crashedAt: visit.startedBoot + 7_500_000_000,
                wallMillis: 1_700_000_000_000, session: crashed.sessionID, screen: "ProductViewController",
                pid: getpid())
            try Data(record).write(to: URL(fileURLWithPath: crashed.crashLog.path))

            let next = try makeAuto(group, clock: clock)
            try next.start()
            let events = try storedEvents(group)
            #expect(events.map(\.event).suffix(3) == ["$AppCrashed", "$AppPageLeave", "$AppEnd"])
            let leave = try #require(events.first(where: isEvent("$AppPageLeave")))
            #expect(leave["event_duration"] as? Double == 7.5)
            #expect(leave["sku"] as? String == "A-1")
            #expect(leave["$screen_name"] as? String == "ProductViewController")
            #expect(leave["$session_id"] as? String == crashed.sessionID)
            #expect(leave.time == 1_700_000_000_000)
            #expect(
                leave.eventID
                    == CrashRecord.pageLeaveEventID(pid: getpid(), visitStart: visit.startedBoot, bootID: .current))
            #expect(next.visitFile.all().isEmpty, "the visit file is gone with the backfill")
        }
    }

    @Test("start() removes visit files of processes that are gone or of another boot, and keeps a running process's")
    func staleVisitFiles() throws {
        try withTemporaryGroup { group in
            let auto = try makeAuto(group, clock: ManualClock())
            func write(pid: Int32, boot: String) throws {
                let json = #"{"pid":\#(pid),"boot_id":"\#(boot)","started_boot_ns":"5","properties":{"a":1}}"#
                try Data(json.utf8).write(to: URL(fileURLWithPath: auto.visitFile.path(pid: pid)))
            }
            var dead: pid_t = 0
            var spawned = posix_spawnattr_t()
            posix_spawnattr_init(&spawned)
            defer { posix_spawnattr_destroy(&spawned) }
            var argv: [UnsafeMutablePointer<CChar>?] = [strdup("/bin/true"), nil]
            defer { free(argv[0]) }
            #expect(posix_spawn(&dead, "/bin/true", nil, &spawned, &argv, environ) == 0)
            var status: Int32 = 0
            waitpid(dead, &status, 0)  // reaped: no process has this pid now
            try write(pid: dead, boot: BootID.current.description)
            try write(pid: 1, boot: BootID.current.description)  // a running process of this boot
            try write(pid: 1_000_001, boot: "00000000-0000-0000-0000-000000000001")
            #expect(auto.visitFile.all().count == 3)
            try auto.start()
            #expect(auto.visitFile.all().keys.sorted() == [1])
            #expect(try storedEvents(group).isEmpty, "no crash record: no moment to end those visits at")
        }
    }
}
