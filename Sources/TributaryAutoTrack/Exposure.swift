import Tributary

/// When an exposure element counts as seen (Sensors' exposure configuration): how much of it must be
/// visible, for how long, and whether it is exposed again after leaving the visible area.
public struct ExposureRule: Sendable, Hashable {
    /// The share of the element's area that must be visible, from 0 (any part, seed 002's rule) to 1
    /// (all of it).
    public private(set) var minVisibleRatio: Double
    /// How long the element must stay visible (above the ratio) without a break before it is exposed.
    public private(set) var minStay: Duration
    /// Exposed again each time it comes back into view (true), or once per page visit (false: until a
    /// page switch, a hot start or a refresh).
    public private(set) var repeats: Bool

    /// Any part visible, no minimum stay, exposed again after leaving the visible area.
    public static let `default` = ExposureRule(checked: 0, .zero, true)

    /// A rule.
    /// - Throws: ``AutoTrackError`` (`invalidConfiguration`) for a ratio outside 0…1 or a negative or
    ///   over-a-day stay.
    public init(minVisibleRatio: Double = 0, minStay: Duration = .zero, repeats: Bool = true) throws {
        guard minVisibleRatio >= 0, minVisibleRatio <= 1 else {
            throw AutoTrackError(
                .invalidConfiguration,
                "An exposure's minVisibleRatio must be from 0 through 1; it is \(minVisibleRatio).")
        }
        guard minStay >= .zero, minStay <= .seconds(86_400) else {
            throw AutoTrackError(
                .invalidConfiguration, "An exposure's minStay must be from 0 through 24 hours; it is \(minStay).")
        }
        self.init(checked: minVisibleRatio, minStay, repeats)
    }

    private init(checked ratio: Double, _ stay: Duration, _ repeats: Bool) {
        minVisibleRatio = ratio
        minStay = stay
        self.repeats = repeats
    }

    var minStayNanos: UInt64 {
        let c = minStay.components
        return UInt64(c.seconds) * 1_000_000_000 + UInt64(c.attoseconds / 1_000_000_000)
    }
}

/// Exposure (seed 002): an element is exposed when enough of it (its rule's ratio; by default any part)
/// is in the visible area, for long enough (its rule's stay), while it and every ancestor are drawable
/// (not hidden, alpha ≥ 0.01). Every ancestor clips: a view is visible only inside the visible part of
/// its parent, so nested scroll views clip their content twice. Leaving the visible area and coming back
/// is a new exposure (unless the rule says once); a page switch or a refresh starts over.
///
/// Elements (seed 002's `isEnd` rule): a view with exposure data is an element when it has a rule of
/// its own (``ViewNode/exposureRule``: it is an end node) or when no view below it has exposure data;
/// otherwise its data is context, added to the elements below it (the nearer view's value wins, the
/// element's own wins over all).
public struct ExposureTracker: Sendable {
    /// What makes an element the same one from one update to the next: its view, and what the view
    /// shows. Toolkits reuse the views of list cells, so a view scrolled back in as another row, or
    /// showing other data (a carousel), is a new exposure.
    public struct Key: Sendable, Hashable {
        public var id: String
        public var position: CellPosition?
        public var exposure: [String: PropertyValue]?

        /// The key of a located element.
        public init(_ element: LocatedElement) {
            id = element.node.id
            position = element.position
            exposure = element.exposureData
        }
    }

    /// An element in view: since when, and whether it was exposed in this stay.
    struct Stay: Sendable {
        var since: UInt64
        var minStayNanos: UInt64
        var reported: Bool
    }

    /// Elements in view at the last update.
    private var stays: [Key: Stay] = [:]
    /// Elements of ``ExposureRule/repeats`` false exposed in this page visit.
    private var exposedOnce: Set<Key> = []

    /// Elements visible at the last update.
    public var visible: Set<Key> { Set(stays.keys) }

    /// An empty tracker.
    public init() {}

    /// Forgets what was exposed (page switch, pull to refresh): visible elements are exposed again.
    public mutating func reset() {
        stays = [:]
        exposedOnce = []
    }

    /// Forgets one exposure (it could not be recorded): the next update reports it again, if it is
    /// still in view.
    public mutating func forget(_ key: Key) {
        stays[key]?.reported = false
        exposedOnce.remove(key)
    }

    /// When the next element in view reaches its minimum stay (monotonic ns), if any: an update then
    /// exposes it.
    public var nextDue: UInt64? {
        stays.values.filter { !$0.reported }.map { $0.since &+ $0.minStayNanos }.min()
    }

    /// Recomputes visibility of the tree under `root` (in window coordinates, its frame relative to
    /// the window) against `viewport` at `now` (monotonic ns; only minimum stays read it), and returns the
    /// elements exposed now, in tree order.
    /// `ignoring` leaves elements out; `rule` applies to elements without a rule of their own.
    public mutating func update(
        root: ViewNode, viewport: Rect, pageType: String, now: UInt64 = 0, rule: ExposureRule = .default,
        ignoring: (ViewNode) -> Bool = { _ in false }
    ) -> [LocatedElement] {
        var inView: [(element: LocatedElement, rule: ExposureRule)] = []
        Self.collect(
            root, origin: (0, 0), clip: viewport, path: "\(pageType)[0]/" + ElementPath.step(root, index: 0),
            cell: nil, context: [:], rule: rule, ignoring: ignoring, into: &inView)
        var next: [Key: Stay] = [:]
        var fresh: [LocatedElement] = []
        for (element, rule) in inView {
            let key = Key(element)
            guard next[key] == nil else { continue }
            var stay = stays[key] ?? Stay(since: now, minStayNanos: rule.minStayNanos, reported: false)
            if !rule.repeats, exposedOnce.contains(key) { stay.reported = true }
            if !stay.reported, now >= stay.since, now - stay.since >= stay.minStayNanos {
                stay.reported = true
                if !rule.repeats { exposedOnce.insert(key) }
                fresh.append(element)
            }
            next[key] = stay
        }
        stays = next
        return fresh
    }

    /// Exposure elements of the tree visible within `clip`, above their rule's ratio (`defaultRule` for
    /// those without their own), with their data assembled from `context`, their ancestors'.
    private static func collect(
        _ node: ViewNode, origin: (x: Double, y: Double), clip: Rect, path: String, cell: CellPosition?,
        context: [String: PropertyValue], rule defaultRule: ExposureRule, ignoring: (ViewNode) -> Bool,
        into out: inout [(element: LocatedElement, rule: ExposureRule)]
    ) {
        guard node.isDrawable else { return }
        let frame = node.frame.offsetBy(dx: origin.x, dy: origin.y)
        let shown = frame.intersection(clip)
        guard !shown.isEmpty else { return }
        let cell = node.cell ?? cell
        var context = context
        if let data = node.exposure {
            let isEnd = node.exposureRule != nil || !node.children.contains(where: \.containsExposureData)
            if isEnd {
                let rule = node.exposureRule ?? defaultRule
                let ratio = (shown.width * shown.height) / (frame.width * frame.height)
                if !ignoring(node), ratio >= rule.minVisibleRatio || ratio >= 1 {
                    var element = LocatedElement(node: node, path: path, position: cell)
                    element.exposureData = context.merging(data) { _, own in own }
                    out.append((element, rule))
                }
            }
            context.merge(data) { _, inner in inner }
        }
        let childOrigin = (frame.x - node.contentOffset.x, frame.y - node.contentOffset.y)
        for (child, index) in zip(node.children, ElementPath.sameTypeIndices(node.children)) {
            collect(
                child, origin: childOrigin, clip: shown, path: path + "/" + ElementPath.step(child, index: index),
                cell: cell, context: context, rule: defaultRule, ignoring: ignoring, into: &out)
        }
    }
}

extension ViewNode {
    /// Whether this view or one below it has exposure data.
    var containsExposureData: Bool { exposure != nil || children.contains(where: \.containsExposureData) }
}
