import Tributary

/// What was clicked within an element, for controls whose parts are not views of their own.
public enum ClickDetail: Sendable, Hashable {
    /// The element itself: a control (button, switch), or a cell selected.
    case element
    /// A gesture recognised on the element (whitepaper chapter 6): taps and long presses are clicks
    /// (`$element_type` is the view's class, as for any click); other gestures (pan, swipe, pinch) are
    /// not, and are not tracked.
    case gesture(GestureKind)
    /// A segment of a segmented control: `$element_content` is the segment's title, `$element_position`
    /// its index.
    case segment(index: Int, title: String?)
    /// An item of a tab bar: `$element_content` is the item's title, `$element_position` its index.
    case tabBarItem(index: Int, title: String?)
}

/// A gesture recogniser's kind.
public enum GestureKind: String, Sendable, Hashable {
    /// A tap (`UITapGestureRecognizer`).
    case tap
    /// A long press (`UILongPressGestureRecognizer`).
    case longPress
    /// Any other gesture: not a click.
    case other
}

// MARK: Clicks

extension AutoTracker {
    /// A click on the element `elementID` of the current page: tracks one `$AppClick` with the element's
    /// properties, its own ``ViewNode/properties`` and the page's. When the toolkit reports the same
    /// touch once per target of a control, pass the touch's id: a repeat of the same element and touch
    /// is ignored (returns nil), so one click is one event. Nil too when the click is not tracked: clicks
    /// turned off, the page or the element ignored (``Configuration``), or a gesture other than a tap or
    /// a long press.
    @discardableResult
    public func click(elementID: String, touch: UInt64? = nil, detail: ClickDetail = .element) throws -> TrackReceipt? {
        try operation.withLock { _ in try clickLocked(elementID: elementID, touch: touch, detail: detail) }
    }

    private func clickLocked(elementID: String, touch: UInt64?, detail: ClickDetail) throws -> TrackReceipt? {
        let action: Action? = try box.state.withLock { s in
            guard let current = s.pages.current else {
                throw AutoTrackError(.noPage, "A click on \(elementID) was reported before any page appeared.")
            }
            guard let root = current.page.root else {
                throw AutoTrackError(
                    .noViewTree, "The page \(current.page.className) was reported without a view tree.")
            }
            guard let element = ElementPath.locate(elementID, in: root, pageType: current.page.className) else {
                throw AutoTrackError(
                    .unknownElement, "No view with id \(elementID) in the view tree of \(current.page.className).")
            }
            guard configuration.events.contains(.appClick), !s.pages.isIgnored(current.page),
                !configuration.ignores(element.node)
            else { return nil }
            if case .gesture(.other) = detail { return nil }
            if let touch {
                if let last = s.lastClick, last.element == elementID, last.touch == touch { return nil }
                s.lastClick = (elementID, touch)
            }
            var p = current.page.properties.merging(element.properties) { _, own in own }
            p.merge(s.pages.screenProperties(current.page)) { _, page in page }
            switch detail {
            case .element, .gesture:
                break
            case .segment(let index, let title), .tabBarItem(let index, let title):
                p["$element_position"] = .string(String(index))
                if let title { p["$element_content"] = .string(clippedToValueLimit(String(title.prefix(1000)))) }
            }
            return .track("$AppClick", p, ifFailed: touch.map { .click(element: elementID, touch: $0) })
        }
        guard let action else { return nil }
        return try perform([action]).first
    }
}
