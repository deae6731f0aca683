import Foundation
import Testing
import TributaryWire

@Suite("JSONText: sorted compact JSON")
struct JSONTextTests {
    @Test("Parsed JSON is written back with keys in UTF-8 byte order and every value unchanged")
    func parsedValues() throws {
        let text = #"{"b":[1,2.5,-3,true,false,null,"x\"y\\z\n\u0007"],"a":{"z":{},"$y":[]},"_c":1e300,"B":"é😀/"}"#
        let parsed = try JSONSerialization.jsonObject(with: Data(text.utf8))
        let written = try #require(JSONText.sortedCompact(parsed))
        #expect(
            String(decoding: written, as: UTF8.self)
                == #"{"B":"é😀/","_c":1e+300,"a":{"$y":[],"z":{}},"b":[1,2.5,-3,true,false,null,"x\"y\\z\n\u0007"]}"#)
        let reread = try JSONSerialization.jsonObject(with: Data(written)) as? NSDictionary
        #expect(reread == parsed as? NSDictionary)
    }

    @Test("Swift values keep their kind: Bool, Int, Double, String, [String]")
    func swiftValues() throws {
        let object: [String: Any] = ["flag": true, "count": 3, "ratio": 0.25, "whole": 2.0, "name": "n", "tags": ["a"]]
        let written = try #require(JSONText.sortedCompact(object))
        #expect(
            String(decoding: written, as: UTF8.self)
                == #"{"count":3,"flag":true,"name":"n","ratio":0.25,"tags":["a"],"whole":2}"#)
    }

    @Test("Values JSON cannot represent give nil", arguments: [Double.nan, .infinity])
    func unrepresentable(value: Double) {
        #expect(JSONText.sortedCompact(["x": value]) == nil)
        #expect(JSONText.sortedCompact(["x": Date()]) == nil)
    }
}
