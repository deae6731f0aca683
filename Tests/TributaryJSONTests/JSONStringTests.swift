import Foundation
import Testing
import TributaryJSON

@Suite("JSONString: one way to write a JSON string literal")
struct JSONStringTests {
    static let cases: [(input: String, literal: String)] = [
        ("", #""""#),
        ("BuyProduct", #""BuyProduct""#),
        ("say \"hi\"", #""say \"hi\"""#),
        (#"C:\temp"#, #""C:\\temp""#),
        ("a/b", #""a/b""#),
        ("line\nbreak\r\ttab", #""line\nbreak\r\ttab""#),
        ("\u{08}\u{0C}", #""\b\f""#),
        ("\u{00}\u{01}\u{1F}", #""\u0000\u0001\u001f""#),
        ("\u{7F}", "\"\u{7F}\""),
        ("café 東京 🚀", "\"café 東京 🚀\""),
        ("a\u{2028}b\u{2029}c", "\"a\u{2028}b\u{2029}c\""),
    ]

    @Test("escapes quotes, backslashes and control characters; copies the rest", arguments: cases)
    func literal(_ input: String, _ literal: String) {
        #expect(JSONString.quoted(input) == literal)
    }

    @Test("for scripts, U+2028 and U+2029 are escaped too")
    func lineSeparators() {
        #expect(JSONString.quoted("a\u{2028}b\u{2029}c", escapingLineSeparators: true) == #""a\u2028b\u2029c""#)
        // Their neighbours in UTF-8 (E2 80 A7, E2 80 AA) and a separator at the very end.
        #expect(JSONString.quoted("\u{2027}\u{202A}", escapingLineSeparators: true) == "\"\u{2027}\u{202A}\"")
        #expect(JSONString.quoted("end\u{2029}", escapingLineSeparators: true) == #""end\u2029""#)
    }

    @Test("appends to what is there; bytes and String inputs agree")
    func appends() {
        var out = Array("[".utf8)
        JSONString.append("x\ny", to: &out)
        Array("é\"".utf8).withUnsafeBytes { JSONString.append($0, to: &out) }
        #expect(String(decoding: out, as: UTF8.self) == #"["x\ny""é\"""#)
    }

    @Test("every string of up to two characters reads back unchanged through JSONSerialization")
    func roundTrip() throws {
        // Every control character, the escaped and the unescaped ASCII, U+2028/U+2029 and their UTF-8
        // neighbours, 2-, 3- and 4-byte UTF-8: each alone, each pair (escapes next to each other and to
        // plain text, separators at the end), between plain text.
        let alphabet: [String] =
            (0..<0x20).map { String(Unicode.Scalar(UInt8($0))) }
            + ["\"", "\\", "/", "a", " ", "\u{7F}", "é", "\u{2027}", "\u{2028}", "\u{2029}", "\u{202A}", "東", "🚀"]
        var inputs = [""] + alphabet
        for first in alphabet { for second in alphabet { inputs.append(first + second) } }
        inputs += alphabet.map { "plain " + $0 + " text" }
        // Each character at every offset of a word read eight bytes at a time, in longer plain text.
        inputs += alphabet.flatMap { c in (0...16).map { String(repeating: "a", count: $0) + c + String(repeating: "b", count: 17 - $0) } }
        for input in inputs {
            for escaping in [false, true] {
                let literal = JSONString.quoted(input, escapingLineSeparators: escaping)
                let parsed = try JSONSerialization.jsonObject(with: Data("[\(literal)]".utf8)) as? [String]
                #expect(parsed == [input], "\(Array(input.unicodeScalars)) → \(literal)")
                if escaping { #expect(!literal.contains("\u{2028}") && !literal.contains("\u{2029}")) }
            }
        }
    }
}
