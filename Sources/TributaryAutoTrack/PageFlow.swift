import Tributary

/// A page (a view controller, a window, a route) as the UI toolkit describes it when it appears.
public struct PageDescription: Sendable, Hashable {
    /// Identifies this shown instance of the page (two pushes of the same class are two instances).
    public var instanceID: String
    /// The class name; mapped to a page id by ``AutoTracker/Configuration/pageIDs``.
    public var className: String
    /// The page title (`$title`).
    public var title: String?
    /// Its root view, for clicks and exposure; nil when the toolkit does not describe views.
    public var root: ViewNode?

    /// Creates a page description.
    public init(instanceID: String, className: String, title: String? = nil, root: ViewNode? = nil) {
        self.instanceID = instanceID
        self.className = className
        self.title = title
        self.root = root
    }
}

/// The page flow (seed 002's PAGE_ID / SOURCE_ID chain): every `$AppViewScreen` names the page
/// (`$screen_name`, the page id from the class→id map, else the class name) and the page viewed before
/// it (`$referrer`). A page's first appearance also reports its load time (`$page_load_duration`,
/// created → appeared, monotonic).
public struct PageFlow: Sendable {
    /// Class name → page id.
    public var pageIDs: [String: String]
    /// The page on screen and the properties of its page view.
    public private(set) var current: (page: PageDescription, properties: [String: PropertyValue])?
    private var createdAt: [String: UInt64] = [:]
    private var lastScreen: String?

    /// A flow with a class→id map.
    public init(pageIDs: [String: String] = [:]) { self.pageIDs = pageIDs }

    /// The page id of a class.
    public func screenName(_ className: String) -> String { clippedToValueLimit(pageIDs[className] ?? className) }

    /// The screen name of the page on screen.
    public var currentScreen: String? { current.map { screenName($0.page.className) } }

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

    /// A page appeared: returns its `$AppViewScreen` properties. The page becomes the referrer of the
    /// next one even when the view is not reported (app in the background).
    public mutating func appeared(_ page: PageDescription, at now: UInt64) -> [String: PropertyValue] {
        let name = screenName(page.className)
        var properties: [String: PropertyValue] = ["$screen_name": .string(name)]
        if let title = page.title { properties["$title"] = .string(clippedToValueLimit(title)) }
        if let lastScreen { properties["$referrer"] = .string(lastScreen) }
        var reported = properties
        if let start = createdAt.removeValue(forKey: page.instanceID), now >= start {
            reported["$page_load_duration"] = .double((Double(now - start) / 1_000_000).rounded() / 1000)
        }
        current = (page, properties)
        lastScreen = name
        return reported
    }

    /// The properties to send the current page view again (hot start, first open after a passive launch).
    public var resend: [String: PropertyValue]? { current?.properties }
}

extension PageFlow {
    /// Replaces the view tree of the page on screen (after a layout change).
    mutating func replaceCurrentRoot(_ root: ViewNode) {
        guard var current else { return }
        current.page.root = root
        self.current = current
    }
}
