import Tributary

/// Exposure (seed 002): an element is exposed when any part of it enters the visible area while it and
/// every ancestor are drawable (not hidden, alpha ≥ 0.01). Every ancestor clips: a view is visible only
/// inside the visible part of its parent, so nested scroll views clip their content twice. Leaving the
/// visible area and coming back is a new exposure; a page switch or a refresh starts over.
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
            exposure = element.node.exposure
        }
    }

    /// Elements visible at the last update (reported once while they stay visible).
    public private(set) var visible: Set<Key> = []

    /// An empty tracker.
    public init() {}

    /// Forgets what was exposed (page switch, pull to refresh): visible elements are exposed again.
    public mutating func reset() { visible = [] }

    /// Forgets one element (its exposure could not be recorded): the next update reports it again.
    public mutating func forget(_ key: Key) { visible.remove(key) }

    /// Recomputes visibility of the tree under `root` (in window coordinates, its frame relative to
    /// the window) against `viewport`, and returns the elements that just became visible, in tree order.
    public mutating func update(root: ViewNode, viewport: Rect, pageType: String) -> [LocatedElement] {
        var now: [LocatedElement] = []
        Self.collect(
            root, origin: (0, 0), clip: viewport, path: "\(pageType)[0]/" + ElementPath.step(root, index: 0),
            cell: nil, into: &now)
        let fresh = now.filter { !visible.contains(Key($0)) }
        visible = Set(now.map(Key.init))
        return fresh
    }

    /// Exposure elements of the tree visible within `clip`.
    private static func collect(
        _ node: ViewNode, origin: (x: Double, y: Double), clip: Rect, path: String, cell: CellPosition?,
        into out: inout [LocatedElement]
    ) {
        guard node.isDrawable else { return }
        let frame = node.frame.offsetBy(dx: origin.x, dy: origin.y)
        let shown = frame.intersection(clip)
        guard !shown.isEmpty else { return }
        let cell = node.cell ?? cell
        if node.exposure != nil { out.append(LocatedElement(node: node, path: path, position: cell)) }
        let childOrigin = (frame.x - node.contentOffset.x, frame.y - node.contentOffset.y)
        for (child, index) in zip(node.children, ElementPath.sameTypeIndices(node.children)) {
            collect(
                child, origin: childOrigin, clip: shown, path: path + "/" + ElementPath.step(child, index: index),
                cell: cell, into: &out)
        }
    }
}
