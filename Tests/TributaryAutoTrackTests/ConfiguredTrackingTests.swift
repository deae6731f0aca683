import Foundation
import Testing
import Tributary
import TributaryAutoTrack
import TributaryStore
import TributaryTestSupport

func configuredAuto(
    _ group: String, clock: ManualClock, _ change: (inout AutoTracker.Configuration) -> Void
) throws -> AutoTracker {
    var config = AutoTracker.Configuration()
    config.captureCrashes = false
    config.flushOnBackground = false
    config.monotonicNanos = { clock.now() }
    change(&config)
    return try AutoTracker(tracker: try Tracker(configuration: .init(groupDirectory: group)), configuration: config)
}

/// A page whose root holds a button with properties of its own, a segmented control, a tab bar and a label.
func controlsPage(_ className: String = "Settings", properties: [String: PropertyValue] = ["section": "prefs"])
    -> PageDescription
{
    let root = ViewNode(
        id: "root", type: "UIView", frame: screen,
        children: [
            ViewNode(
                id: "save", type: "UIButton", frame: Rect(x: 0, y: 0, width: 100, height: 40), content: "Save",
                properties: ["button_role": "primary", "$element_type": "not this"]),
            ViewNode(id: "mode", type: "UISegmentedControl", frame: Rect(x: 0, y: 50, width: 300, height: 30)),
            ViewNode(id: "tabs", type: "UITabBar", frame: Rect(x: 0, y: 750, width: 390, height: 50)),
            ViewNode(id: "banner", type: "UILabel", frame: Rect(x: 0, y: 100, width: 390, height: 50), content: "Sale"),
            ViewNode(id: "debug", type: "DebugOverlay", frame: Rect(x: 0, y: 200, width: 10, height: 10)),
        ])
    return PageDescription(instanceID: className, className: className, root: root, properties: properties)
}

@Suite("Clicks and exposures as configured", .serialized)
struct ConfiguredTrackingTests {
    @Test("clicks: element and page properties; segments and tab bar items with title and index; gestures")
    func clickKinds() throws {
        try withTemporaryGroup { group in
            let auto = try configuredAuto(group, clock: ManualClock()) { _ in }
            try auto.handle(.didFinishLaunching(inBackground: false))
            try auto.handle(.didBecomeActive)
            try auto.pageAppeared(controlsPage())
            try auto.click(elementID: "save")
            try auto.click(elementID: "mode", detail: .segment(index: 2, title: "Weekly"))
            try auto.click(elementID: "tabs", detail: .tabBarItem(index: 1, title: "Profile"))
            try auto.click(elementID: "banner", detail: .gesture(.longPress))
            #expect(try auto.click(elementID: "banner", detail: .gesture(.other)) == nil, "a pan is not a click")
            let clicks = try storedEvents(group).filter(isEvent("$AppClick"))
            #expect(clicks.count == 4)
            #expect(clicks[0]["button_role"] as? String == "primary")
            #expect(clicks[0]["$element_type"] as? String == "UIButton", "automatic properties win")
            #expect(clicks.allSatisfy { $0["section"] as? String == "prefs" }, "the page's properties")
            #expect(clicks[1]["$element_type"] as? String == "UISegmentedControl")
            #expect(clicks[1]["$element_content"] as? String == "Weekly")
            #expect(clicks[1]["$element_position"] as? String == "2")
            #expect(clicks[2]["$element_type"] as? String == "UITabBar")
            #expect(clicks[2]["$element_content"] as? String == "Profile")
            #expect(clicks[2]["$element_position"] as? String == "1")
            #expect(clicks[3]["$element_type"] as? String == "UILabel")
            #expect(clicks[3]["$element_content"] as? String == "Sale")
        }
    }

    @Test("ignore lists by element class, element id and page; switches turn event kinds off")
    func ignoredAndSwitchedOff() throws {
        try withTemporaryGroup { group in
            let auto = try configuredAuto(group, clock: ManualClock()) {
                $0.ignoredElementTypes = ["DebugOverlay"]
                $0.ignoredElementIDs = ["banner"]
                $0.ignoredPages = ["Login"]
            }
            try auto.handle(.didFinishLaunching(inBackground: false))
            try auto.handle(.didBecomeActive)
            try auto.pageAppeared(controlsPage())
            #expect(try auto.click(elementID: "debug") == nil)
            #expect(try auto.click(elementID: "banner") == nil)
            #expect(try auto.click(elementID: "save") != nil)
            try auto.pageAppeared(controlsPage("Login"))
            #expect(try auto.click(elementID: "save") == nil, "nothing on an ignored page")
            try auto.pageAppeared(controlsPage("Profile"))
            let events = try storedEvents(group)
            #expect(
                events.map(\.event) == [
                    "$AppStart", "$AppViewScreen", "$AppClick", "$AppPageLeave", "$AppViewScreen",
                ])
            #expect(events.last?["$referrer"] as? String == "Settings", "an ignored page is nobody's referrer")
        }
        try withTemporaryGroup { group in
            let clock = ManualClock()
            let auto = try configuredAuto(group, clock: clock) { $0.events = [.appStart, .appEnd] }
            try auto.handle(.didFinishLaunching(inBackground: false))
            try auto.handle(.didBecomeActive)
            try auto.pageAppeared(homePage(), viewport: screen)
            #expect(try auto.click(elementID: "buy") == nil)
            #expect(try auto.endTiming(auto.startTiming("request", name: "GET /")) == nil)
            try auto.handle(.didEnterBackground)
            #expect(try storedEvents(group).map(\.event) == ["$AppStart", "$AppEnd"])
        }
    }

    @Test("exposure: visible-area ratio, minimum stay on a manual clock, once or repeated")
    func exposureRules() throws {
        try withTemporaryGroup { group in
            let clock = ManualClock()
            let auto = try configuredAuto(group, clock: clock) { _ in }
            let half = try ExposureRule(minVisibleRatio: 0.5)
            let stay = try ExposureRule(minStay: .seconds(1))
            let once = try ExposureRule(repeats: false)
            func tree(offset: Double) -> ViewNode {
                ViewNode(
                    id: "scroll", type: "UIScrollView", frame: screen, contentOffset: (0, offset),
                    children: [
                        ViewNode(
                            id: "half", type: "Card", frame: Rect(x: 0, y: 750, width: 100, height: 200),
                            exposure: ["card": "half"], exposureRule: half),
                        ViewNode(
                            id: "stay", type: "Card", frame: Rect(x: 100, y: 200, width: 100, height: 100),
                            exposure: ["card": "stay"], exposureRule: stay),
                        ViewNode(
                            id: "once", type: "Card", frame: Rect(x: 200, y: 200, width: 100, height: 100),
                            exposure: ["card": "once"], exposureRule: once),
                    ])
            }
            func exposed(_ receipts: [TrackReceipt]) throws -> [String] {
                let events = try storedEvents(group)
                return receipts.map { r in events.first { $0.eventID == r.eventID }?["card"] as? String ?? "?" }
            }
            try auto.handle(.didFinishLaunching(inBackground: false))
            try auto.handle(.didBecomeActive)
            let page = PageDescription(instanceID: "p", className: "Feed", root: tree(offset: 0))
            #expect(try exposed(Array(auto.pageAppeared(page, viewport: screen).dropFirst())) == ["once"])
            let due = try #require(auto.nextExposureDue)
            #expect(due == clock.now() + 1_000_000_000)
            clock.advance(seconds: 0.5)
            #expect(try auto.checkExposures().isEmpty, "half a second: not yet")
            #expect(
                try exposed(auto.layoutChanged(viewport: screen, root: tree(offset: 100))) == ["half"],
                "150 of 200 points")
            clock.advance(seconds: 0.5)
            #expect(try exposed(auto.checkExposures()) == ["stay"])
            #expect(auto.nextExposureDue == nil)
            // Everything scrolled out and back: repeated ones again (the stay after its second), once not.
            #expect(try auto.layoutChanged(viewport: screen, root: tree(offset: 1000)).isEmpty)
            #expect(try exposed(auto.layoutChanged(viewport: screen, root: tree(offset: 100))) == ["half"])
            clock.advance(seconds: 0.9)
            #expect(try auto.checkExposures().isEmpty)
            #expect(
                try auto.layoutChanged(viewport: screen, root: tree(offset: 1000)).isEmpty, "left before its second")
            #expect(try exposed(auto.layoutChanged(viewport: screen, root: tree(offset: 100))) == ["half"])
            clock.advance(seconds: 1)
            #expect(try exposed(auto.checkExposures()) == ["stay"])
            auto.refresh()
            #expect(
                Set(try exposed(auto.layoutChanged(viewport: screen))) == ["half", "once"], "a refresh starts over")
            #expect(throws: AutoTrackError.self) { try ExposureRule(minVisibleRatio: 1.5) }
        }
    }

    @Test(
        "exposure data assembled from ancestors (seed 002's isEnd): a floor's data on each item, the nearer value winning"
    )
    func assembledData() throws {
        var tracker = ExposureTracker()
        let floor = ViewNode(
            id: "floor", type: "FloorView", frame: Rect(x: 0, y: 0, width: 390, height: 400),
            exposure: ["floor": "f1", "slot": "floor"],
            children: [
                ViewNode(
                    id: "row", type: "RowView", frame: Rect(x: 0, y: 0, width: 390, height: 200),
                    exposure: ["row": 1],
                    children: (0..<2).map { i in
                        ViewNode(
                            id: "item\(i)", type: "ItemView",
                            frame: Rect(x: Double(i) * 195, y: 0, width: 195, height: 200),
                            exposure: ["item": .int(Int64(i)), "slot": "item"])
                    }),
                ViewNode(
                    id: "banner", type: "BannerView", frame: Rect(x: 0, y: 200, width: 390, height: 200),
                    exposure: ["banner": "b"], exposureRule: .default,
                    children: [
                        ViewNode(
                            id: "cta", type: "UIButton", frame: Rect(x: 0, y: 0, width: 100, height: 40),
                            exposure: ["cta": true])
                    ]),
            ])
        let exposed = tracker.update(root: floor, viewport: screen, pageType: "Home", now: 0)
        #expect(exposed.map(\.node.id) == ["item0", "item1", "banner", "cta"], "floor and row are context only")
        #expect(exposed[0].exposureData == ["floor": "f1", "row": 1, "item": 0, "slot": "item"])
        #expect(exposed[2].exposureData == ["floor": "f1", "slot": "floor", "banner": "b"], "an end node by its rule")
        #expect(exposed[3].exposureData == ["floor": "f1", "slot": "floor", "banner": "b", "cta": true])
    }
}
