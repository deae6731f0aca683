import Tributary
import TributaryAutoTrack

/// The simulated app's pages and their view trees (UIKit class names, as an iOS app would report).
enum Catalog {
    static let viewport = Rect(x: 0, y: 0, width: 390, height: 844)

    static let pageIDs = [
        "HomeViewController": "home", "ProductListViewController": "product_list",
        "ProductDetailViewController": "product_detail", "CartViewController": "cart",
    ]

    struct Page {
        var className: String
        var title: String
        var endpoint: String
        /// Rows in the page's scrolling list (0: no list).
        var rows: Int
        var rowHeight: Double
        var buttons: [String]

        /// The page's own properties (on its page view, leave, clicks and exposures).
        var properties: [String: PropertyValue] {
            ["page_kind": .string(rows > 12 ? "list" : rows > 0 ? "mixed" : "detail")]
        }

        var scrollHeight: Double { max(0, Double(rows) * rowHeight - (viewport.height - 100)) }

        static let halfVisible = try! ExposureRule(minVisibleRatio: 0.5)

        func tree(scroll: Double) -> ViewNode {
            let cells = (0..<rows).map { row in
                ViewNode(
                    id: "cell-\(row)", type: rows > 12 ? "UICollectionViewCell" : "UITableViewCell",
                    frame: Rect(x: 0, y: Double(row) * rowHeight, width: 390, height: rowHeight),
                    cell: CellPosition(section: 0, row: row),
                    exposure: ["item_id": .string("\(className.prefix(4))-\(row)")],
                    // The product grid's items count once half of one is on screen.
                    exposureRule: rows > 12 ? Self.halfVisible : nil,
                    children: [
                        ViewNode(
                            id: "cell-\(row)-label", type: "UILabel", frame: Rect(x: 16, y: 8, width: 250, height: 24),
                            content: "Item \(row)"),
                        ViewNode(
                            id: "cell-\(row)-add", type: "UIButton", frame: Rect(x: 300, y: 8, width: 74, height: 32),
                            content: "Add"),
                    ])
            }
            // The list's own data is context for its items (seed 002's isEnd rule): each item has both.
            let list = ViewNode(
                id: "list", type: rows > 12 ? "UICollectionView" : "UITableView",
                frame: Rect(x: 0, y: 100, width: 390, height: viewport.height - 100), contentOffset: (0, scroll),
                exposure: ["list": .string(className)], children: cells)
            let bar = buttons.enumerated().map { i, title in
                ViewNode(
                    id: "button-\(i)", type: "UIButton",
                    frame: Rect(x: 16 + Double(i) * 120, y: 50, width: 110, height: 40),
                    content: title)
            }
            return ViewNode(id: "root", type: "UIView", frame: viewport, children: bar + (rows > 0 ? [list] : []))
        }

        /// Ids of elements a user can tap at this scroll position.
        func clickable(scroll: Double) -> [String] {
            guard rows > 0 else { return buttons.indices.map { "button-\($0)" } }
            let first = Int(scroll / rowHeight)
            let visibleRows = first..<min(rows, first + Int((viewport.height - 100) / rowHeight) + 1)
            return buttons.indices.map { "button-\($0)" } + visibleRows.flatMap { ["cell-\($0)", "cell-\($0)-add"] }
        }
    }

    static let home = Page(
        className: "HomeViewController", title: "Home", endpoint: "GET /feed", rows: 8,
        rowHeight: 160, buttons: ["Search", "Cart"])
    static let all = [
        home,
        Page(
            className: "ProductListViewController", title: "Products", endpoint: "GET /products", rows: 40,
            rowHeight: 120, buttons: ["Filter", "Sort"]),
        Page(
            className: "ProductDetailViewController", title: "Product", endpoint: "GET /product", rows: 0,
            rowHeight: 0, buttons: ["Buy", "Add to cart", "Share"]),
        Page(
            className: "CartViewController", title: "Cart", endpoint: "GET /cart", rows: 5, rowHeight: 90,
            buttons: ["Checkout"]),
        Page(
            className: "SettingsViewController", title: "Settings", endpoint: "GET /settings", rows: 6,
            rowHeight: 60, buttons: ["Log out"]),
    ]
}
