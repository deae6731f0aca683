import Tributary

/// A rectangle in points (origin at the top left).
public struct Rect: Sendable, Hashable, CustomStringConvertible {
    /// Left edge.
    public var x: Double
    /// Top edge.
    public var y: Double
    /// Width (zero or less: empty).
    public var width: Double
    /// Height (zero or less: empty).
    public var height: Double

    /// Creates a rectangle.
    public init(x: Double, y: Double, width: Double, height: Double) {
        self.x = x
        self.y = y
        self.width = width
        self.height = height
    }

    /// True when it covers no area.
    public var isEmpty: Bool { width <= 0 || height <= 0 }

    /// The area both rectangles cover (empty when they do not overlap).
    public func intersection(_ other: Rect) -> Rect {
        let x0 = max(x, other.x), y0 = max(y, other.y)
        let x1 = min(x + width, other.x + other.width), y1 = min(y + height, other.y + other.height)
        return Rect(x: x0, y: y0, width: max(0, x1 - x0), height: max(0, y1 - y0))
    }

    /// The rectangle moved by (dx, dy).
    public func offsetBy(dx: Double, dy: Double) -> Rect { Rect(x: x + dx, y: y + dy, width: width, height: height) }

    public var description: String { "(\(x), \(y), \(width)×\(height))" }
}

/// A list or grid cell's position (`section:row`).
public struct CellPosition: Sendable, Hashable, CustomStringConvertible {
    /// The section (0 for lists without sections).
    public var section: Int
    /// The row (or item) within the section.
    public var row: Int

    /// Creates a position.
    public init(section: Int, row: Int) {
        self.section = section
        self.row = row
    }

    public var description: String { "\(section):\(row)" }
}

/// A toolkit-neutral description of one view and its subviews, as a UI toolkit reports it.
///
/// `type` is the class name that appears in `$element_type` and `$element_path`; `frame` is in the
/// parent's coordinates; a scrolling container shifts its children by `contentOffset`. Cells carry their
/// `cell` position. A view with `exposure` data is an exposure element (a "resource slot"), or context for
/// the elements below it (see ``ExposureTracker``); `properties` go on its clicks and exposures.
public struct ViewNode: Sendable, Hashable {
    /// Identifies the view within its page (the toolkit's choice: an object id, a key path…).
    public var id: String
    /// The class name (`UIButton`, `UITableViewCell`, `GtkButton`…).
    public var type: String
    /// Position and size in the parent's coordinate space.
    public var frame: Rect
    /// Hidden views and their subtrees are never visible.
    public var isHidden: Bool
    /// Views with alpha below 0.01 and their subtrees are never visible.
    public var alpha: Double
    /// How far a scrolling container has scrolled: its children move by minus this offset.
    public var contentOffset: (x: Double, y: Double)
    /// The text the view shows, if any.
    public var content: String?
    /// The cell's position when the view is a list or grid cell.
    public var cell: CellPosition?
    /// Properties of an exposure element; nil for views that are not tracked for exposure.
    public var exposure: [String: PropertyValue]?
    /// The element's own exposure rule; it makes the view an end node (seed 002's `isEnd`) even with
    /// exposure data below it. Nil: ``AutoTracker/Configuration/exposureRule``.
    public var exposureRule: ExposureRule?
    /// The element's own properties (Sensors' `sensorsAnalyticsViewProperties`), on its clicks and
    /// exposures; those automatic tracking sets (`$element_type`, …) win.
    public var properties: [String: PropertyValue]
    /// Subviews, back to front.
    public var children: [ViewNode]

    /// Creates a view description.
    public init(
        id: String, type: String, frame: Rect, isHidden: Bool = false, alpha: Double = 1,
        contentOffset: (x: Double, y: Double) = (0, 0), content: String? = nil, cell: CellPosition? = nil,
        exposure: [String: PropertyValue]? = nil, exposureRule: ExposureRule? = nil,
        properties: [String: PropertyValue] = [:], children: [ViewNode] = []
    ) {
        self.id = id
        self.type = type
        self.frame = frame
        self.isHidden = isHidden
        self.alpha = alpha
        self.contentOffset = contentOffset
        self.content = content
        self.cell = cell
        self.exposure = exposure
        self.exposureRule = exposureRule
        self.properties = properties
        self.children = children
    }

    public static func == (a: ViewNode, b: ViewNode) -> Bool {
        a.id == b.id && a.type == b.type && a.frame == b.frame && a.isHidden == b.isHidden && a.alpha == b.alpha
            && a.contentOffset == b.contentOffset && a.content == b.content && a.cell == b.cell
            && a.exposure == b.exposure && a.exposureRule == b.exposureRule && a.properties == b.properties
            && a.children == b.children
    }

    public func hash(into hasher: inout Hasher) {
        hasher.combine(id)
        hasher.combine(type)
    }

    /// Whether the view itself may be drawn (not hidden, alpha ≥ 0.01).
    public var isDrawable: Bool { !isHidden && alpha >= 0.01 }

    /// The text of the view, or of its drawable subviews joined with `-` (how a cell's content is read;
    /// a hidden "Sold out" label is not part of it).
    public var displayedContent: String? {
        if let content, !content.isEmpty { return content }
        let parts = children.filter(\.isDrawable).compactMap(\.displayedContent)
        return parts.isEmpty ? nil : parts.joined(separator: "-")
    }
}

/// One view found in a page's tree, with what `$AppClick` and `$AppExposure` report about it.
public struct LocatedElement: Sendable, Hashable {
    /// The view.
    public var node: ViewNode
    /// `$element_path`: `Page[0]/UIView[0]/UITableView[0]/UITableViewCell[0:2]/UIButton[0]`.
    public var path: String
    /// `$element_position`: the `section:row` of the view, or of the nearest cell containing it.
    public var position: CellPosition?
    /// An exposure element's data: its own, over its ancestors' (nil: its view's own).
    public var exposureData: [String: PropertyValue]? {
        get { assembledData ?? node.exposure }
        set { assembledData = newValue }
    }
    private var assembledData: [String: PropertyValue]?

    /// Describes a view found in a tree.
    public init(node: ViewNode, path: String, position: CellPosition?) {
        self.node = node
        self.path = path
        self.position = position
    }

    /// The element properties (`$element_type`, `$element_content`, `$element_path`, `$element_position`)
    /// over the view's own ``ViewNode/properties``.
    public var properties: [String: PropertyValue] {
        var p = node.properties
        p["$element_type"] = .string(node.type)
        p["$element_path"] = .string(path)
        if let content = node.displayedContent {
            p["$element_content"] = .string(clippedToValueLimit(String(content.prefix(1000))))
        }
        if let position { p["$element_position"] = .string(position.description) }
        return p
    }
}

/// Element paths in the format of the Youhuo article (seed 002): from the page down to the element, each
/// step the class name and its index among same-class siblings (from 0), or `section:row` for cells.
public enum ElementPath {
    /// The path step of `node`, the `index`-th of its class among its siblings.
    static func step(_ node: ViewNode, index: Int) -> String {
        if let cell = node.cell { return "\(node.type)[\(cell.section):\(cell.row)]" }
        return "\(node.type)[\(index)]"
    }

    /// Indices of each child among its same-type siblings.
    static func sameTypeIndices(_ children: [ViewNode]) -> [Int] {
        var seen: [String: Int] = [:]
        return children.map { child in
            let i = seen[child.type, default: 0]
            seen[child.type] = i + 1
            return i
        }
    }

    /// Finds the view with `id` under `root` (the page's root view) and describes it; nil when absent.
    public static func locate(_ id: String, in root: ViewNode, pageType: String) -> LocatedElement? {
        func search(_ node: ViewNode, path: String, cell: CellPosition?) -> LocatedElement? {
            let cell = node.cell ?? cell
            if node.id == id { return LocatedElement(node: node, path: path, position: cell) }
            for (child, index) in zip(node.children, sameTypeIndices(node.children)) {
                if let found = search(child, path: path + "/" + step(child, index: index), cell: cell) { return found }
            }
            return nil
        }
        return search(root, path: "\(pageType)[0]/" + step(root, index: 0), cell: nil)
    }
}

/// `text` cut, at a character boundary, to the property value limit (8,192 UTF-8 bytes): what the
/// toolkit reports (a label's text, a title, a URL) is cut rather than refused, as Sensors does.
func clippedToValueLimit(_ text: String) -> String { clipped(text, toBytes: EventRules.maxStringBytes) }

/// `text` cut to at most `limit` UTF-8 bytes, at a character's end (never inside one).
func clipped(_ text: String, toBytes limit: Int) -> String {
    guard text.utf8.count > limit else { return text }
    var end = text.startIndex
    var bytes = 0
    while end < text.endIndex {
        let next = text.index(after: end)
        bytes += text.utf8.distance(from: end, to: next)
        guard bytes <= limit else { break }
        end = next
    }
    return String(text[..<end])
}
