import Testing
import Tributary
import TributaryAutoTrack

@Suite("Exposure")
struct ExposureTests {
    static let screen = Rect(x: 0, y: 0, width: 390, height: 800)

    /// A page with a vertical list of 10 rows of 100 pt, scrolled by `offset`.
    static func list(offset: Double, hiddenRow: Int? = nil, alphaRow: (Int, Double)? = nil) -> ViewNode {
        let rows = (0..<10).map { row in
            ViewNode(
                id: "row\(row)", type: "UITableViewCell",
                frame: Rect(x: 0, y: Double(row) * 100, width: 390, height: 100),
                isHidden: row == hiddenRow, alpha: alphaRow?.0 == row ? alphaRow!.1 : 1,
                cell: CellPosition(section: 0, row: row), exposure: ["item": .int(Int64(row))])
        }
        let table = ViewNode(
            id: "table", type: "UITableView", frame: Rect(x: 0, y: 200, width: 390, height: 400),
            contentOffset: (0, offset), children: rows)
        return ViewNode(id: "root", type: "UIView", frame: screen, children: [table])
    }

    static func ids(_ elements: [LocatedElement]) -> [String] { elements.map(\.node.id) }

    @Test(
        "any visible part exposes; the list clips its rows (a 400 pt list shows rows 0-3; scrolled by 1 pt, a sliver of row 4)"
    )
    func partial() {
        var tracker = ExposureTracker()
        #expect(
            Self.ids(tracker.update(root: Self.list(offset: 0), viewport: Self.screen, pageType: "P")) == [
                "row0", "row1", "row2", "row3",
            ])
        var t2 = ExposureTracker()
        #expect(
            Self.ids(t2.update(root: Self.list(offset: 1), viewport: Self.screen, pageType: "P")) == [
                "row0", "row1", "row2", "row3", "row4",
            ])
        var t3 = ExposureTracker()
        let exposed = t3.update(root: Self.list(offset: 50), viewport: Self.screen, pageType: "Home")
        #expect(exposed.first?.path == "Home[0]/UIView[0]/UITableView[0]/UITableViewCell[0:0]")
        #expect(exposed.first?.position == CellPosition(section: 0, row: 0))
    }

    @Test("staying visible is one exposure; scrolled out and back is a new one")
    func scrollOutAndBack() {
        var tracker = ExposureTracker()
        #expect(Self.ids(tracker.update(root: Self.list(offset: 0), viewport: Self.screen, pageType: "P")).count == 4)
        #expect(tracker.update(root: Self.list(offset: 0), viewport: Self.screen, pageType: "P").isEmpty)
        #expect(
            Self.ids(tracker.update(root: Self.list(offset: 150), viewport: Self.screen, pageType: "P")) == [
                "row4", "row5",
            ])
        #expect(
            Self.ids(tracker.update(root: Self.list(offset: 600), viewport: Self.screen, pageType: "P")) == [
                "row6", "row7", "row8", "row9",
            ])
        #expect(
            Self.ids(tracker.update(root: Self.list(offset: 0), viewport: Self.screen, pageType: "P")) == [
                "row0", "row1", "row2", "row3",
            ])
    }

    @Test("hidden, alpha < 0.01 and a hidden ancestor are not visible; alpha 0.01 is")
    func hiddenAndAlpha() {
        var t1 = ExposureTracker()
        #expect(
            Self.ids(t1.update(root: Self.list(offset: 0, hiddenRow: 1), viewport: Self.screen, pageType: "P")) == [
                "row0", "row2", "row3",
            ])
        var t2 = ExposureTracker()
        #expect(
            Self.ids(t2.update(root: Self.list(offset: 0, alphaRow: (2, 0.009)), viewport: Self.screen, pageType: "P"))
                == ["row0", "row1", "row3"])
        var t3 = ExposureTracker()
        #expect(
            Self.ids(t3.update(root: Self.list(offset: 0, alphaRow: (2, 0.01)), viewport: Self.screen, pageType: "P"))
                .count == 4)
        var hiddenTable = Self.list(offset: 0)
        hiddenTable.children[0].isHidden = true
        var t4 = ExposureTracker()
        #expect(t4.update(root: hiddenTable, viewport: Self.screen, pageType: "P").isEmpty)
        // Shown again: a new exposure of every visible row.
        var t5 = ExposureTracker()
        _ = t5.update(root: Self.list(offset: 0), viewport: Self.screen, pageType: "P")
        #expect(t5.update(root: hiddenTable, viewport: Self.screen, pageType: "P").isEmpty)
        #expect(t5.update(root: Self.list(offset: 0), viewport: Self.screen, pageType: "P").count == 4)
    }

    /// A vertical page scroll view holding a horizontal carousel of 5 items of 150 pt in a 390 pt frame.
    static func nested(pageOffset: Double, carouselOffset: Double) -> ViewNode {
        let items = (0..<5).map { i in
            ViewNode(
                id: "item\(i)", type: "UICollectionViewCell",
                frame: Rect(x: Double(i) * 150, y: 0, width: 140, height: 200),
                cell: CellPosition(section: 0, row: i), exposure: ["slot": .int(Int64(i))])
        }
        let carousel = ViewNode(
            id: "carousel", type: "UICollectionView", frame: Rect(x: 0, y: 1000, width: 390, height: 200),
            contentOffset: (carouselOffset, 0), children: items)
        let page = ViewNode(
            id: "scroll", type: "UIScrollView", frame: Rect(x: 0, y: 0, width: 800, height: 800),
            contentOffset: (0, pageOffset), children: [carousel])
        return ViewNode(id: "root", type: "UIView", frame: Rect(x: 0, y: 0, width: 800, height: 800), children: [page])
    }

    @Test(
        "nested scroll views: each ancestor clips (items inside the wide screen but outside the carousel are not exposed)"
    )
    func nestedScrollViews() {
        let wide = Rect(x: 0, y: 0, width: 800, height: 800)
        var tracker = ExposureTracker()
        #expect(
            tracker.update(root: Self.nested(pageOffset: 0, carouselOffset: 0), viewport: wide, pageType: "P").isEmpty)
        // The page scrolls the carousel into view: items 0-2 (item 2 spans 300-440, clipped at 390).
        #expect(
            Self.ids(
                tracker.update(root: Self.nested(pageOffset: 500, carouselOffset: 0), viewport: wide, pageType: "P"))
                == ["item0", "item1", "item2"])
        // The carousel scrolls by 300: items 2-4 visible, 3 and 4 are new.
        #expect(
            Self.ids(
                tracker.update(root: Self.nested(pageOffset: 500, carouselOffset: 300), viewport: wide, pageType: "P"))
                == ["item3", "item4"])
        // The page scrolls the carousel out: nothing visible; back: items 2-4 exposed again.
        #expect(
            tracker.update(root: Self.nested(pageOffset: 0, carouselOffset: 300), viewport: wide, pageType: "P").isEmpty
        )
        #expect(
            Self.ids(
                tracker.update(root: Self.nested(pageOffset: 500, carouselOffset: 300), viewport: wide, pageType: "P"))
                == ["item2", "item3", "item4"])
    }

    @Test("a page switch or refresh resets: what is visible is exposed again")
    func reset() {
        var tracker = ExposureTracker()
        _ = tracker.update(root: Self.list(offset: 0), viewport: Self.screen, pageType: "P")
        tracker.reset()
        #expect(tracker.visible.isEmpty)
        #expect(tracker.update(root: Self.list(offset: 0), viewport: Self.screen, pageType: "P").count == 4)
    }

    // Toolkits reuse cell views: the view that showed item A at row 0 shows item I at row 8 after a
    // scroll. Keyed by the view alone, item I was never exposed.
    @Test("a reused view showing another row or other data is a new exposure")
    func reusedViews() {
        func page(item: Int64, row: Int) -> ViewNode {
            let cell = ViewNode(
                id: "0x1", type: "UITableViewCell", frame: Rect(x: 0, y: 0, width: 390, height: 100),
                cell: CellPosition(section: 0, row: row), exposure: ["item": .int(item)])
            return ViewNode(id: "root", type: "UIView", frame: Self.screen, children: [cell])
        }
        var tracker = ExposureTracker()
        #expect(tracker.update(root: page(item: 0, row: 0), viewport: Self.screen, pageType: "P").count == 1)
        #expect(tracker.update(root: page(item: 0, row: 0), viewport: Self.screen, pageType: "P").isEmpty, "unchanged")
        #expect(tracker.update(root: page(item: 8, row: 8), viewport: Self.screen, pageType: "P").count == 1, "reused as row 8")
        #expect(tracker.update(root: page(item: 9, row: 8), viewport: Self.screen, pageType: "P").count == 1, "new data")
    }
}
