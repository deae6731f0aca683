import Testing
import Tributary
import TributaryAutoTrack

func view(
    _ id: String, _ type: String, frame: Rect = Rect(x: 0, y: 0, width: 10, height: 10), content: String? = nil,
    cell: CellPosition? = nil, _ children: [ViewNode] = []
) -> ViewNode {
    ViewNode(id: id, type: type, frame: frame, content: content, cell: cell, children: children)
}

@Suite("Element paths")
struct ViewTreeTests {
    /// The seed's example page: labels and buttons next to each other, a table of cells with buttons,
    /// and a container with its own button.
    static let page = view(
        "root", "UIView",
        [
            view("title", "UILabel", content: "Deals"),
            view("b0", "UIButton", content: "Search"),
            view("b1", "UIButton", content: "Cart"),
            view(
                "table", "UITableView",
                (0..<3).map { row in
                    view(
                        "cell\(row)", "UITableViewCell", cell: CellPosition(section: 0, row: row),
                        [
                            view("cell\(row)-title", "UILabel", content: "Item \(row)"),
                            view("cell\(row)-price", "UILabel", content: "\(row + 1).99"),
                            view("cell\(row)-buy", "UIButton", content: "Buy"),
                        ])
                }),
            view("box", "UIView", [view("box-label", "UILabel"), view("box-b", "UIButton", content: "OK")]),
            view("b2", "UIButton", content: "Share"),
            view(
                "grid", "UICollectionView", [view("g", "UICollectionViewCell", cell: CellPosition(section: 2, row: 7))]),
        ])

    @Test(
        "paths",
        arguments: [
            ("b0", "ViewController[0]/UIView[0]/UIButton[0]", nil as String?),
            ("b1", "ViewController[0]/UIView[0]/UIButton[1]", nil),
            ("b2", "ViewController[0]/UIView[0]/UIButton[2]", nil),
            ("cell2-buy", "ViewController[0]/UIView[0]/UITableView[0]/UITableViewCell[0:2]/UIButton[0]", "0:2"),
            ("cell1-price", "ViewController[0]/UIView[0]/UITableView[0]/UITableViewCell[0:1]/UILabel[1]", "0:1"),
            ("cell0", "ViewController[0]/UIView[0]/UITableView[0]/UITableViewCell[0:0]", "0:0"),
            ("box-b", "ViewController[0]/UIView[0]/UIView[0]/UIButton[0]", nil),
            ("g", "ViewController[0]/UIView[0]/UICollectionView[0]/UICollectionViewCell[2:7]", "2:7"),
            ("root", "ViewController[0]/UIView[0]", nil),
        ])
    func path(_ id: String, _ expected: String, _ position: String?) throws {
        let element = try #require(ElementPath.locate(id, in: Self.page, pageType: "ViewController"))
        #expect(element.path == expected)
        #expect(element.position?.description == position)
        #expect(element.properties["$element_path"] == .string(expected))
    }

    @Test("a cell's content is its labels joined with -, a button's its title; type is the class")
    func content() throws {
        let cell = try #require(ElementPath.locate("cell1", in: Self.page, pageType: "P"))
        #expect(cell.properties["$element_content"] == .string("Item 1-2.99-Buy"))
        #expect(cell.properties["$element_type"] == .string("UITableViewCell"))
        #expect(cell.properties["$element_position"] == .string("0:1"))
        let button = try #require(ElementPath.locate("b1", in: Self.page, pageType: "P"))
        #expect(button.properties["$element_content"] == .string("Cart"))
        #expect(button.properties["$element_position"] == nil)
        let empty = try #require(ElementPath.locate("box-label", in: Self.page, pageType: "P"))
        #expect(empty.properties["$element_content"] == nil)
    }

    @Test("an unknown element is not found")
    func unknown() {
        #expect(ElementPath.locate("nope", in: Self.page, pageType: "P") == nil)
    }
}
