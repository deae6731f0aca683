import CTributaryCrash
import Foundation
import Synchronization
import Testing
import Tributary
import TributaryAutoTrack
import TributaryStore
import TributaryTestSupport

/// A monotonic clock the test moves by hand.
final class ManualClock: Sendable {
    private let nanos = Atomic<UInt64>(1_000_000_000)
    func now() -> UInt64 { nanos.load(ordering: .relaxed) }
    func advance(seconds: Double) { nanos.add(UInt64(seconds * 1e9), ordering: .relaxed) }
}

/// One stored event, decoded.
struct Stored {
    var event: String
    var eventID: String
    var time: Int64
    var libMethod: String?
    var properties: [String: Any]
    var record: EventRecord

    subscript(_ key: String) -> Any? { properties[key] }
}

func storedEvents(_ group: String) throws -> [Stored] {
    try storedEvents(in: SharedStore(groupDirectory: group))
}

/// Every event `store` holds, decoded (a store opened with options of its own: one process opens a store
/// with one quota).
func storedEvents(in store: SharedStore) throws -> [Stored] {
    try store.events(limit: .max).map { entry in
        let record = try entry.record.get()
        let body = try #require(try JSONSerialization.jsonObject(with: Data(record.body)) as? [String: Any])
        return Stored(
            event: body["event"] as? String ?? "", eventID: body["event_id"] as? String ?? "",
            time: (body["time"] as? NSNumber)?.int64Value ?? 0,
            libMethod: (body["lib"] as? [String: Any])?["$lib_method"] as? String,
            properties: body["properties"] as? [String: Any] ?? [:], record: record)
    }
}

func isEvent(_ name: String) -> (Stored) -> Bool { { $0.event == name } }

func makeAuto(
    _ group: String, clock: ManualClock, pageIDs: [String: String] = [:], maxEventBytes: Int? = nil,
    producerID: String? = nil, captureCrashes: Bool = false
) throws -> AutoTracker {
    var trackerConfig = Tracker.Configuration(groupDirectory: group, producerID: producerID)
    if let maxEventBytes { trackerConfig.maxEventBytes = maxEventBytes }
    let tracker = try Tracker(configuration: trackerConfig)
    var config = AutoTracker.Configuration(pageIDs: pageIDs)
    config.captureCrashes = captureCrashes
    config.flushOnBackground = false
    config.monotonicNanos = { clock.now() }
    return try AutoTracker(tracker: tracker, configuration: config)
}

let screen = Rect(x: 0, y: 0, width: 390, height: 800)

func homePage(_ instance: String = "home-1") -> PageDescription {
    let cells = (0..<6).map { row in
        ViewNode(
            id: "cell\(row)", type: "UITableViewCell", frame: Rect(x: 0, y: Double(row) * 200, width: 390, height: 200),
            cell: CellPosition(section: 0, row: row), exposure: ["item_id": .string("sku-\(row)")],
            children: [
                ViewNode(
                    id: "cell\(row)-label", type: "UILabel", frame: Rect(x: 0, y: 0, width: 100, height: 20),
                    content: "Item \(row)")
            ])
    }
    let root = ViewNode(
        id: "root", type: "UIView", frame: screen,
        children: [
            ViewNode(id: "buy", type: "UIButton", frame: Rect(x: 0, y: 0, width: 100, height: 40), content: "Buy"),
            ViewNode(
                id: "table", type: "UITableView", frame: Rect(x: 0, y: 100, width: 390, height: 700), children: cells),
        ])
    return PageDescription(instanceID: instance, className: "HomeViewController", title: "Home", root: root)
}

@Suite("Automatic tracking into a real store", .serialized)
struct AutoTrackerTests {
    @Test("cold start, page view, exposure, click, background: the events, in order, with $session_id")
    func coldStart() throws {
        try withTemporaryGroup { group in
            let clock = ManualClock()
            let auto = try makeAuto(group, clock: clock, pageIDs: ["HomeViewController": "home"])
            try auto.start()
            try auto.handle(.didFinishLaunching(inBackground: false))
            auto.pageCreated("home-1")
            clock.advance(seconds: 0.25)
            try auto.pageAppeared(homePage(), viewport: screen)
            try auto.handle(.didBecomeActive)
            try auto.click(elementID: "cell1-label")
            clock.advance(seconds: 42)
            try auto.handle(.willResignActive)
            try auto.handle(.didEnterBackground)

            let events = try storedEvents(group)
            #expect(
                events.map(\.event) == ["$AppViewScreen"] + Array(repeating: "$AppExposure", count: 4)
                    + ["$AppStart", "$AppClick", "$AppPageLeave", "$AppEnd"])
            let session = auto.sessionID
            #expect(!session.isEmpty)
            for e in events {
                #expect(e["$session_id"] as? String == session, "\(e.event) lacks the session")
                #expect(e.libMethod == "autoTrack")
            }
            let view = events[0]
            #expect(view["$screen_name"] as? String == "home")
            #expect(view["$title"] as? String == "Home")
            #expect(view["$referrer"] == nil)
            #expect(view["$page_load_duration"] as? Double == 0.25)
            #expect(events[1...4].map { $0["item_id"] as? String } == ["sku-0", "sku-1", "sku-2", "sku-3"])
            #expect(
                events[2]["$element_path"] as? String
                    == "HomeViewController[0]/UIView[0]/UITableView[0]/UITableViewCell[0:1]")
            let start = events[5]
            #expect(start["$is_first_time"] as? Bool == true)
            #expect(start["$resume_from_background"] as? Bool == false)
            let click = events[6]
            #expect(click["$element_type"] as? String == "UILabel")
            #expect(click["$element_content"] as? String == "Item 1")
            #expect(click["$element_position"] as? String == "0:1")
            #expect(click["$screen_name"] as? String == "home")
            #expect(
                click["$element_path"] as? String
                    == "HomeViewController[0]/UIView[0]/UITableView[0]/UITableViewCell[0:1]/UILabel[0]")
            let leave = events[7]
            #expect(leave["event_duration"] as? Double == 42, "the page was on screen from its view to the background")
            #expect(leave["$screen_name"] as? String == "home")
            let end = events[8]
            #expect(end["$event_duration"] as? Double == 42)
            #expect(end["$app_end_reason"] as? String == "background")

            // A second process of the same installation: not the first time any more.
            let again = try makeAuto(group, clock: clock)
            try again.handle(.didFinishLaunching(inBackground: false))
            let receipts = try again.handle(.didBecomeActive)
            #expect(receipts.count == 1)
            #expect(try storedEvents(group).last?["$is_first_time"] as? Bool == false)
        }
    }

    @Test("passive launch: no page view until the user opens the app, then the page view is sent; refresh re-exposes")
    func passiveLaunch() throws {
        try withTemporaryGroup { group in
            let clock = ManualClock()
            let auto = try makeAuto(group, clock: clock)
            try auto.handle(.didFinishLaunching(inBackground: true))
            #expect(try auto.pageAppeared(homePage(), viewport: screen).isEmpty)
            #expect(try auto.layoutChanged(viewport: screen).isEmpty)
            clock.advance(seconds: 5)
            try auto.handle(.willEnterForeground)
            try auto.handle(.didBecomeActive)
            try auto.layoutChanged(viewport: screen)
            #expect(try auto.layoutChanged(viewport: screen).isEmpty, "still visible: no new exposure")
            auto.refresh()  // pull to refresh: what is visible is exposed again
            #expect(try auto.layoutChanged(viewport: screen).count == 4)
            let events = try storedEvents(group).map(\.event)
            #expect(
                events == ["$AppStartPassively", "$AppStart", "$AppViewScreen"]
                    + Array(repeating: "$AppExposure", count: 8))
        }
    }

    @Test("page flow: $referrer is the page below in the stack (none back at the bottom); hot start re-sends the current page; a page switch re-exposes")
    func referrerChain() throws {
        try withTemporaryGroup { group in
            let clock = ManualClock()
            let auto = try makeAuto(
                group, clock: clock, pageIDs: ["HomeViewController": "home", "CartViewController": "cart"])
            try auto.handle(.didFinishLaunching(inBackground: false))
            try auto.handle(.didBecomeActive)
            try auto.pageAppeared(homePage())
            try auto.pageAppeared(PageDescription(instanceID: "c", className: "CartViewController", title: "Cart"))
            try auto.pageAppeared(PageDescription(instanceID: "d", className: "DetailViewController"))
            try auto.pageAppeared(homePage(), viewport: screen)
            try auto.handle(.didEnterBackground)
            try auto.handle(.willEnterForeground)
            try auto.handle(.didBecomeActive)
            #expect(try auto.layoutChanged(viewport: screen).count == 4, "the re-sent page exposes its items again")
            let views = try storedEvents(group).filter { $0.event == "$AppViewScreen" }
            #expect(
                views.map { $0["$screen_name"] as? String } == ["home", "cart", "DetailViewController", "home", "home"])
            #expect(
                views.map { $0["$referrer"] as? String } == [nil, "home", "cart", nil, nil],
                "home-1 appearing again is a back navigation to the bottom of the stack")
            #expect(views.allSatisfy { $0["$page_load_duration"] == nil }, "no pageCreated: no load time")
        }
    }

    @Test("$session_id is on code-tracked events too, and changes after the session timeout in the background")
    func sessions() async throws {
        try await withTemporaryGroup { group in
            let clock = ManualClock()
            let auto = try makeAuto(group, clock: clock)
            try auto.handle(.didFinishLaunching(inBackground: false))
            try auto.handle(.didBecomeActive)
            let first = auto.sessionID
            try await auto.tracker.track("BuyProduct", properties: ["price": 9.99])
            try auto.handle(.didEnterBackground)
            clock.advance(seconds: 29)
            try auto.handle(.didBecomeActive)
            #expect(auto.sessionID == first)
            try auto.handle(.didEnterBackground)
            clock.advance(seconds: 31)
            try auto.handle(.didBecomeActive)
            #expect(auto.sessionID != first)
            try await auto.tracker.track("BuyProduct", properties: ["price": 1.5])
            let buys = try storedEvents(group).filter { $0.event == "BuyProduct" }
            #expect(buys.map { $0["$session_id"] as? String } == [first, auto.sessionID])
            #expect(buys.map(\.libMethod) == ["code", "code"])
        }
    }

    @Test("one click on a control with several targets is one $AppClick; unknown elements are a typed error")
    func clicks() throws {
        try withTemporaryGroup { group in
            let auto = try makeAuto(group, clock: ManualClock())
            #expect(throws: AutoTrackError.self) { try auto.click(elementID: "buy") }
            try auto.handle(.didFinishLaunching(inBackground: false))
            try auto.handle(.didBecomeActive)
            try auto.pageAppeared(homePage())
            #expect(try auto.click(elementID: "buy", touch: 7) != nil)
            #expect(try auto.click(elementID: "buy", touch: 7) == nil)
            #expect(try auto.click(elementID: "buy", touch: 7) == nil)
            #expect(try auto.click(elementID: "buy", touch: 8) != nil)
            do {
                try auto.click(elementID: "missing")
                Issue.record("an unknown element was accepted")
            } catch let error as AutoTrackError {
                #expect(error.code == .unknownElement)
                #expect(error.message.contains("missing"))
            }
            #expect(try storedEvents(group).filter { $0.event == "$AppClick" }.count == 2)
        }
    }

    @Test("entering the background asks the group's agent to flush now (a datagram on agent.sock)")
    func flushOnBackground() async throws {
        try await withTemporaryGroup { group in
            let tracker = try Tracker(configuration: .init(groupDirectory: group))
            var config = AutoTracker.Configuration()
            config.captureCrashes = false
            let auto = try AutoTracker(tracker: tracker, configuration: config)
            let agent = try NotifySocket(path: group + "/" + AgentChannel.socketFile)
            try auto.handle(.didFinishLaunching(inBackground: false))
            try auto.handle(.didBecomeActive)
            try auto.handle(.willResignActive)
            try auto.handle(.didBecomeActive)
            // Datagrams on one socket arrive in order: a flush the flicker asked for would come before this.
            #expect(AgentChannel.send("marker", to: agent.path) == .sent)
            try auto.handle(.didEnterBackground)
            let began = Date()
            while agent.received.count < 2, Date().timeIntervalSince(began) < 10 { try await Task.sleep(for: .milliseconds(10)) }
            #expect(agent.received.map(\.text) == ["marker", "flush"], "no flush while the app stays in front, one on leaving")
        }
    }

    @Test("timings: page load and request durations come from the monotonic clock")
    func timings() throws {
        try withTemporaryGroup { group in
            let clock = ManualClock()
            let auto = try makeAuto(group, clock: clock)
            try auto.handle(.didFinishLaunching(inBackground: false))
            try auto.handle(.didBecomeActive)
            auto.pageCreated("home-1")
            clock.advance(seconds: 0.125)
            try auto.pageAppeared(homePage())
            let request = auto.startTiming("request", name: "GET /feed")
            let image = auto.startTiming("image", name: "banner.jpg")
            clock.advance(seconds: 1.5)
            try auto.endTiming(request, properties: ["status_code": 200])
            clock.advance(seconds: 0.25)
            try auto.endTiming(image)
            let events = try storedEvents(group)
            // (Closures are kept out of #expect here: two closures in one test, one of them inside a
            // macro expansion, were mixed up by the compiler and filter ran the other one.)
            let view = events.first(where: isEvent("$AppViewScreen"))
            #expect(view?["$page_load_duration"] as? Double == 0.125)
            let perf = events.filter(isEvent("$AppPerformance"))
            let kinds = perf.map { $0["$performance_type"] as? String }
            let durations = perf.map { $0["$event_duration"] as? Double }
            #expect(kinds == ["request", "image"])
            #expect(durations == [1.5, 1.75])
            #expect(perf[0]["status_code"] as? Int == 200)
            #expect(perf[0]["$screen_name"] as? String == "HomeViewController")
        }
    }

    // MARK: Failures and edge cases (from a review, 2026-11-24)

    /// An auto tracker whose tracker shares its manual clock, and whose events can be made too large.
    static func makeSmallAuto(_ group: String, clock: ManualClock, flush: Bool = false) throws -> AutoTracker {
        var trackerConfig = Tracker.Configuration(groupDirectory: group)
        trackerConfig.maxEventBytes = 4096
        trackerConfig.monotonicNanos = { clock.now() }
        var config = AutoTracker.Configuration()
        config.captureCrashes = false
        config.flushOnBackground = flush
        config.monotonicNanos = { clock.now() }
        return try AutoTracker(tracker: try Tracker(configuration: trackerConfig), configuration: config)
    }

    static let blob: [String: PropertyValue] = ["blob": .string(String(repeating: "x", count: 4000))]

    // The lifecycle has moved on when an event of the step is refused: stopping at the first failure
    // left the timers counting in the background and no flush asked for, and that $AppEnd could never
    // come again.
    @Test("an $AppEnd refused (over the size limit) still pauses the timers and asks for the flush")
    func refusedAppEnd() async throws {
        try await withTemporaryGroup { group in
            let clock = ManualClock()
            let auto = try Self.makeSmallAuto(group, clock: clock, flush: true)
            let agent = try NotifySocket(path: group + "/" + AgentChannel.socketFile)
            try auto.handle(.didFinishLaunching(inBackground: false))
            try auto.handle(.didBecomeActive)
            try auto.tracker.trackTimerStart("Read")
            clock.advance(seconds: 2)
            try auto.tracker.registerSuperProperties(Self.blob)
            let error = #expect(throws: TrackingError.self) { try auto.handle(.didEnterBackground) }
            #expect(error?.code == .eventTooLarge)
            #expect(auto.phase == .background)
            #expect(await agent.wait(for: "flush", timeout: 5) != nil, "the flush was not asked for")
            clock.advance(seconds: 100)  // in the background: not counted
            auto.tracker.unregisterSuperProperty("blob")
            try await auto.tracker.trackTimerEnd("Read")
            let read = try #require(try storedEvents(group).first(where: isEvent("Read")))
            #expect(read["$event_duration"] as? Double == 2.0, "the timer ran on in the background")
        }
    }

    @Test("a first $AppStart refused does not mark the installation launched: the next launch's start is the first")
    func refusedFirstStart() throws {
        try withTemporaryGroup { group in
            let auto = try Self.makeSmallAuto(group, clock: ManualClock())
            try auto.tracker.registerSuperProperties(Self.blob)
            try auto.handle(.didFinishLaunching(inBackground: false))
            #expect(throws: TrackingError.self) { try auto.handle(.didBecomeActive) }
            #expect(try auto.tracker.store.configuration()[AutoTracker.launchedKey] == nil)
            let next = try Self.makeSmallAuto(group, clock: ManualClock())
            try next.handle(.didFinishLaunching(inBackground: false))
            try next.handle(.didBecomeActive)
            let start = try #require(try storedEvents(group).first(where: isEvent("$AppStart")))
            #expect(start["$is_first_time"] as? Bool == true)
        }
    }

    @Test("an exposure refused does not hide the other elements of the update, and is reported again at the next")
    func refusedExposure() throws {
        try withTemporaryGroup { group in
            let auto = try makeAuto(group, clock: ManualClock())
            try auto.handle(.didFinishLaunching(inBackground: false))
            try auto.handle(.didBecomeActive)
            var page = homePage()
            // The first cell's exposure data uses a reserved name: its event is refused.
            page.root!.children[1].children[0].exposure = ["id": .string("sku-0")]
            try auto.pageAppeared(page)
            let error = #expect(throws: TrackingError.self) { try auto.layoutChanged(viewport: screen) }
            #expect(error?.code == .reservedName)
            #expect(try storedEvents(group).filter(isEvent("$AppExposure")).count == 3, "cells 1 to 3 are exposed")
            // Still on screen, still refused: the error comes again instead of silence; the others are not repeated.
            #expect(throws: TrackingError.self) { try auto.layoutChanged(viewport: screen) }
            #expect(try storedEvents(group).filter(isEvent("$AppExposure")).count == 3)
        }
    }

    @Test("a click refused is a click when the same touch is reported again")
    func refusedClick() throws {
        try withTemporaryGroup { group in
            let auto = try Self.makeSmallAuto(group, clock: ManualClock())
            try auto.handle(.didFinishLaunching(inBackground: false))
            try auto.handle(.didBecomeActive)
            try auto.pageAppeared(homePage())
            try auto.tracker.registerSuperProperties(Self.blob)
            #expect(throws: TrackingError.self) { try auto.click(elementID: "buy", touch: 7) }
            auto.tracker.unregisterSuperProperty("blob")
            #expect(try auto.click(elementID: "buy", touch: 7) != nil, "the retried touch was taken for a repeat")
            #expect(try auto.click(elementID: "buy", touch: 7) == nil)
        }
    }

    @Test("page views owed: one shown before launch is sent at the start; one shown on the way to the front is sent once")
    func pageViewsOwed() throws {
        try withTemporaryGroup { group in
            let clock = ManualClock()
            let auto = try makeAuto(group, clock: clock)
            auto.pageCreated("home-1")
            clock.advance(seconds: 0.25)
            try auto.pageAppeared(homePage())  // before didFinishLaunching: not visible yet
            try auto.handle(.didFinishLaunching(inBackground: false))
            try auto.handle(.didBecomeActive)
            var views = try storedEvents(group).filter(isEvent("$AppViewScreen"))
            #expect(views.count == 1, "the page shown before the start was never sent")
            #expect(views.first?["$page_load_duration"] as? Double == 0.25, "a view sent late keeps its load time")

            // Hot start during which a page appears while inactive: that view is tracked, and not again.
            try auto.handle(.didEnterBackground)
            try auto.handle(.willEnterForeground)
            try auto.pageAppeared(PageDescription(instanceID: "c", className: "CartViewController"))
            try auto.handle(.didBecomeActive)
            views = try storedEvents(group).filter(isEvent("$AppViewScreen"))
            #expect(views.map { $0["$screen_name"] as? String } == ["HomeViewController", "CartViewController"])
        }
    }

    @Test("the app's dynamic super properties and $session_id both reach every event, whichever was registered first")
    func dynamicPropertiesShared() async throws {
        try await withTemporaryGroup { group in
            let auto = try makeAuto(group, clock: ManualClock())
            auto.tracker.registerDynamicSuperProperties { ["ab": .string("x")] }
            try auto.handle(.didFinishLaunching(inBackground: false))
            try auto.handle(.didBecomeActive)
            try await auto.tracker.track("Buy")
            let buy = try #require(try storedEvents(group).first(where: isEvent("Buy")))
            #expect(buy["ab"] as? String == "x")
            #expect(buy["$session_id"] as? String == auto.sessionID && !auto.sessionID.isEmpty)
        }
    }

    @Test("what the toolkit reports is cut to the 8,192-byte value limit; hidden subviews are not content")
    func clippedContent() throws {
        try withTemporaryGroup { group in
            let auto = try makeAuto(group, clock: ManualClock())
            try auto.handle(.didFinishLaunching(inBackground: false))
            try auto.handle(.didBecomeActive)
            let family = String(repeating: "👨‍👩‍👧‍👦", count: 1000)  // 25,000 bytes in 1,000 characters
            let root = ViewNode(
                id: "root", type: "UIView", frame: screen,
                children: [
                    ViewNode(id: "big", type: "UILabel", frame: Rect(x: 0, y: 0, width: 100, height: 40), content: family),
                    ViewNode(
                        id: "cell", type: "UITableViewCell", frame: Rect(x: 0, y: 100, width: 390, height: 100),
                        children: [
                            ViewNode(id: "name", type: "UILabel", frame: Rect(x: 0, y: 0, width: 100, height: 20), content: "Item"),
                            ViewNode(
                                id: "sold", type: "UILabel", frame: Rect(x: 0, y: 20, width: 100, height: 20), isHidden: true,
                                content: "Sold out"),
                        ]),
                ])
            try auto.pageAppeared(PageDescription(instanceID: "p", className: "P", title: family, root: root))
            try auto.click(elementID: "big")
            try auto.click(elementID: "cell")
            let token = auto.startTiming("image", name: "data:image/png;base64," + String(repeating: "A", count: 20_000))
            try auto.endTiming(token)
            let events = try storedEvents(group)
            let clicks = events.filter(isEvent("$AppClick"))
            let content = try #require(clicks.first?["$element_content"] as? String)
            #expect(content.utf8.count <= 8192 && content.utf8.count > 8000 && family.hasPrefix(content))
            #expect(clicks.last?["$element_content"] as? String == "Item")
            #expect((events.first(where: isEvent("$AppViewScreen"))?["$title"] as? String)?.utf8.count ?? 0 > 8000)
            #expect((events.first(where: isEvent("$AppPerformance"))?["$performance_name"] as? String)?.utf8.count == 8192)
        }
    }

    @Test("a session timeout beyond 365 days is a configuration error, not a crash; an $AppEnd under 0.5 ms has no duration")
    func edges() throws {
        try withTemporaryGroup { group in
            let tracker = try Tracker(configuration: .init(groupDirectory: group))
            var config = AutoTracker.Configuration()
            config.sessionTimeout = .seconds(Int64.max)
            let error = #expect(throws: AutoTrackError.self) { try AutoTracker(tracker: tracker, configuration: config) }
            #expect(error?.code == .invalidConfiguration)
        }
        #expect(LifecycleMachine.duration(from: 1_000, to: 400_000) == nil)
        #expect(LifecycleMachine.duration(from: 1_000, to: 1_000_000) == 0.001)
    }
}
