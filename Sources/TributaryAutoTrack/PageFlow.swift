import Tributary

/// A page (a view controller, a window, a route) as the UI toolkit describes it when it appears.
public struct PageDescription: Sendable, Hashable {
    /// Identifies this shown instance of the page (two pushes of the same class are two instances; the
    /// same instance appearing again is a back navigation to it).
    public var instanceID: String
    /// The class name; mapped to a page id by ``AutoTracker/Configuration/pageIDs``.
    public var className: String
    /// The page title (`$title`).
    public var title: String?
    /// Its root view, for clicks and exposure; nil when the toolkit does not describe views.
    public var root: ViewNode?
    /// The page's address (`$url`), such as a route or a deep link path; nil: its page id.
    public var url: String?
    /// The page's own properties (seed 002's TYPE_ID: a product id, a brand id; Sensors' page-level
    /// `getTrackProperties`): on its `$AppViewScreen`, `$AppPageLeave`, clicks and exposures. They do not
    /// replace the properties automatic tracking sets (`$screen_name`, `$title`, …).
    public var properties: [String: PropertyValue]

    /// Creates a page description.
    public init(
        instanceID: String, className: String, title: String? = nil, root: ViewNode? = nil, url: String? = nil,
        properties: [String: PropertyValue] = [:]
    ) {
        self.instanceID = instanceID
        self.className = className
        self.title = title
        self.root = root
        self.url = url
        self.properties = properties
    }
}

/// The page flow (seed 002's PAGE_ID / SOURCE_ID chain) over a navigation stack: every `$AppViewScreen`
/// names the page (`$screen_name`, the page id from the class→id map, else the class name) and the page
/// below it in the stack (`$referrer`). A page instance not in the stack is pushed on top of the page on
/// screen; one already in it appears again by a back navigation, and the pages above it are popped (its
/// referrer stays the page below it, not the page just left). A page's first appearance also reports
/// its load time (`$page_load_duration`, created → appeared, monotonic). Ignored pages
/// (``AutoTracker/Configuration/ignoredPages``) stay in the stack, and are nobody's referrer.
public struct PageFlow: Sendable {
    /// Class name → page id.
    public var pageIDs: [String: String]
    /// Class names and page ids of pages tracked by no event.
    public var ignoredPages: Set<String>
    /// The navigation stack, bottom first; its last entry is the page on screen.
    public private(set) var stack: [PageDescription] = []
    private var createdAt: [String: UInt64] = [:]

    /// A flow with a class→id map.
    public init(pageIDs: [String: String] = [:], ignoredPages: Set<String> = []) {
        self.pageIDs = pageIDs
        self.ignoredPages = ignoredPages
    }

    /// The page id of a class.
    public func screenName(_ className: String) -> String { clippedToValueLimit(pageIDs[className] ?? className) }

    /// Whether a page is tracked by no event (its class or its page id is ignored).
    public func isIgnored(_ page: PageDescription) -> Bool {
        ignoredPages.contains(page.className) || ignoredPages.contains(screenName(page.className))
    }

    /// The page on screen and its page view's properties.
    public var current: (page: PageDescription, properties: [String: PropertyValue])? {
        guard let page = stack.last else { return nil }
        return (page, viewProperties(stack.count - 1))
    }

    /// The screen name of the page on screen.
    public var currentScreen: String? { stack.last.map { screenName($0.className) } }

    /// The deepest navigation stack remembered; the bottom pages go first beyond it.
    static let maxStackDepth = 256

    /// Pages created and not yet shown that are remembered; the oldest go first beyond it.
    static let maxCreatedPages = 256

    /// A page instance was created (its view started loading).
    public mutating func created(_ instanceID: String, at now: UInt64) {
        createdAt[instanceID] = now
        // Pages created but never shown (a prefetch, a cancelled push) would otherwise pile up.
        if createdAt.count > Self.maxCreatedPages, let oldest = createdAt.min(by: { $0.value < $1.value })?.key {
            createdAt[oldest] = nil
        }
    }

    /// A page appeared: returns its `$AppViewScreen` properties (with its load time on its first
    /// appearance). It is in the stack from now on even when its view is not reported (app in the
    /// background).
    public mutating func appeared(_ page: PageDescription, at now: UInt64) -> [String: PropertyValue] {
        if let index = stack.lastIndex(where: { $0.instanceID == page.instanceID }) {
            stack.removeSubrange(index...)  // back to it: what was above is gone
        }
        stack.append(page)
        // A toolkit that never reports a page again (each appearance a new instance) would grow it forever.
        if stack.count > Self.maxStackDepth { stack.removeFirst(stack.count - Self.maxStackDepth) }
        var reported = viewProperties(stack.count - 1)
        if let start = createdAt.removeValue(forKey: page.instanceID), now >= start {
            reported["$page_load_duration"] = .double((Double(now - start) / 1_000_000).rounded() / 1000)
        }
        return reported
    }

    /// The properties describing the page at `index` of the stack: its own properties, then `$screen_name`,
    /// `$title`, `$url` and `$referrer` over them.
    private func viewProperties(_ index: Int) -> [String: PropertyValue] {
        let page = stack[index]
        let name = screenName(page.className)
        var properties = page.properties
        properties["$screen_name"] = .string(name)
        properties["$url"] = .string(clippedToValueLimit(page.url ?? name))
        if let title = page.title { properties["$title"] = .string(clippedToValueLimit(title)) }
        if let below = stack[..<index].last(where: { !isIgnored($0) }) {
            properties["$referrer"] = .string(screenName(below.className))
        }
        return properties
    }

    /// The properties to send the current page view again (hot start, first open after a passive launch).
    public var resend: [String: PropertyValue]? {
        guard let current, !isIgnored(current.page) else { return nil }
        return current.properties
    }

    /// `$screen_name` and `$title` of a page, for its clicks and exposures.
    func screenProperties(_ page: PageDescription) -> [String: PropertyValue] {
        var p: [String: PropertyValue] = [:]
        p["$screen_name"] = .string(screenName(page.className))
        if let title = page.title { p["$title"] = .string(clippedToValueLimit(title)) }
        return p
    }
}

extension PageFlow {
    /// Replaces the view tree of the page on screen (after a layout change).
    mutating func replaceCurrentRoot(_ root: ViewNode) {
        guard !stack.isEmpty else { return }
        stack[stack.count - 1].root = root
    }
}
