import Foundation
import Testing
import TributaryJSON

/// The one JSON value every module reads JSON into (``JSONValue``).
@Suite("JSONValue")
struct JSONValueTests {
    @Test("numbers: whole numbers within Int64 exactly, others as doubles, inexact big ones kept apart", arguments: [
        ("1", JSONValue.integer(1)),
        ("-7", .integer(-7)),
        ("9007199254740993", .integer(9_007_199_254_740_993)),
        ("9223372036854775807", .integer(.max)),
        ("1.5", .number(1.5)),
        ("1e20", .number(1e20)),
        ("18446744073709551617", .inexactInteger(Decimal(string: "18446744073709551617")!)),
    ])
    func numbers(text: String, expected: JSONValue) throws {
        let parsed = try #require(JSONValue.parse(Array(text.utf8)))
        #expect(parsed == expected)
        if case .integer = expected { #expect(parsed.text == text, "an integer is written back with its digits") }
    }

    @Test("numbers are equal by value, whichever case holds them; a number is never a boolean")
    func equality() {
        #expect(JSONValue.integer(1) == .number(1))
        #expect(JSONValue.number(2) == .integer(2))
        #expect(JSONValue.integer(9_007_199_254_740_993) != .number(9_007_199_254_740_992), "no Double holds it")
        #expect(JSONValue.integer(1) != .bool(true))
        #expect(JSONValue.parse(Array("true".utf8)) == .bool(true))
        #expect(JSONValue.parse(Array("[1,\"a\",null]".utf8)) == .array([.integer(1), .string("a"), .null]))
    }

    @Test("accessors, kind names and compact text")
    func accessorsAndText() throws {
        let value = try #require(JSONValue.parse(Array(#"{"b":[true,null],"a":"x\u2028","n":2.5,"i":3}"#.utf8)))
        #expect(value["a"]?.string == "x\u{2028}")
        #expect(value["n"]?.number == 2.5 && value["n"]?.int == nil)
        #expect(value["i"]?.int == 3 && value["i"]?.number == 3)
        #expect(value["missing"] == nil && value.object?.count == 4)
        #expect(value.text == #"{"a":"x\u2028","b":[true,null],"i":3,"n":2.5}"#, "keys sorted, U+2028 escaped for scripts")
        #expect(JSONValue.array([]).kindName == "a list" && JSONValue.integer(1).kindName == "a number")
        #expect(JSONValue.parse(Array("{".utf8)) == nil)
    }

    @Test("a lone surrogate escape, which a page's JSON.stringify may write, reads as U+FFFD")
    func loneSurrogate() {
        #expect(JSONValue.parse(Array(#""a\ud800b""#.utf8)) == .string("a\u{FFFD}b"))
        #expect(JSONValue.parse(Array(#""\ud83d\ude00""#.utf8)) == .string("😀"))
    }
}
