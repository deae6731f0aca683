import Foundation
import Testing
import Tributary

@Suite("JSON writer")
struct JSONWriterTests {
    @Test("strings round trip through a JSON parser", arguments: [
        "", "plain", "quote \" backslash \\ slash /", "tab\tnewline\ncr\r", "\u{0}\u{1}\u{1f}", "é中文😀", "\u{7f}",
    ])
    func strings(text: String) throws {
        var w = JSONWriter()
        w.raw("[")
        w.string(text)
        w.raw("]")
        let parsed = try JSONSerialization.jsonObject(with: Data(w.bytes)) as? [String]
        #expect(parsed == [text])
    }

    @Test("numbers", arguments: [(0.0, "0"), (3.0, "3"), (-2.5, "-2.5"), (0.1, "0.1"), (1e20, "1e+20")])
    func numbers(value: Double, expected: String) {
        var w = JSONWriter()
        w.double(value)
        #expect(String(decoding: w.bytes, as: UTF8.self) == expected)
    }

    @Test("members are sorted and comma-separated")
    func members() throws {
        var w = JSONWriter()
        var first = true
        w.raw("{")
        w.members(["b": 2, "a": "x", "c": ["p", "q"], "d": true], first: &first)
        w.raw("}")
        #expect(String(decoding: w.bytes, as: UTF8.self) == #"{"a":"x","b":2,"c":["p","q"],"d":true}"#)
    }
}
