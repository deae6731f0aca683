import Foundation
import Testing

@testable import TributaryBridge

// How a page's JSON is read: lone surrogates, whole numbers past a double's precision, booleans and numbers.
extension HybridBridgeTests {
    @Test("a lone surrogate a page's JSON.stringify wrote is read as U+FFFD; a pair, and an escaped backslash, are kept")
    func loneSurrogates() async throws {
        try await Self.withBridge { bridge, store in
            let template = Self.message(Self.pageEvent(properties: ["cut": .string("CUT"), "pair": .string("PAIR"), "slash": .string("SLASH")]))
            let message = template.replacingOccurrences(of: "CUT", with: #"x\ud83dy\ude00z"#)
                .replacingOccurrences(of: "PAIR", with: #"\ud83d\ude00"#)
                .replacingOccurrences(of: "SLASH", with: #"\\ud800"#)
            _ = try await bridge.receive(message, origin: Self.origin).get()
            let properties = try #require(try Self.storedBodies(store).first?.body["properties"] as? [String: Any])
            #expect(properties["cut"] as? String == "x\u{FFFD}y\u{FFFD}z")
            #expect(properties["pair"] as? String == "😀")
            #expect(properties["slash"] as? String == #"\ud800"#)
        }
        #expect(JSON.replacingLoneSurrogates(Array(#"{"a":"\u0041\\u"}"#.utf8)) == nil, "nothing to replace")
    }

    @Test("whole numbers keep their digits as --properties keeps them: exactly within Int64, beyond it a double's own")
    func exactNumbers() async throws {
        try await Self.withBridge { bridge, store in
            let numbers = [
                "above": "9007199254740993", "max": "9223372036854775807", "min": "-9223372036854775808",
                "edge": "9007199254740992", "double": "100000000000000000000",
            ]
            var message = Self.message(Self.pageEvent(properties: numbers.mapValues { _ in .string("N") }))
            for (key, digits) in numbers {
                message = message.replacingOccurrences(of: #""\#(key)":"N""#, with: #""\#(key)":\#(digits)"#)
            }
            _ = try await bridge.receive(message, origin: Self.origin).get()
            let body = String(decoding: try #require(try store.events(limit: 1).first).record.get().body, as: UTF8.self)
            for key in ["above", "max", "min", "edge"] {
                #expect(body.contains(#""\#(key)":\#(numbers[key]!)"#), "\(key) keeps its digits: \(body)")
            }
            let stored = try #require(try Self.storedBodies(store).first?.body["properties"] as? [String: Any])
            #expect(stored["double"] as? Double == 1e20, "the shortest decimal of a double is that double")
        }
        #expect(JSON.parse(Array("9007199254740993".utf8)) == .integer(9_007_199_254_740_993))
        #expect(JSON.parse(Array("9007199254740992".utf8)) == .number(9_007_199_254_740_992))
        #expect(JSON.parse(Array("1e20".utf8)) == .number(1e20))
        #expect(
            JSON.parse(Array("18446744073709551617".utf8)) == .inexactInteger(Decimal(string: "18446744073709551617")!))
    }

    @Test("JSON keeps booleans and numbers apart")
    func jsonKinds() {
        #expect(
            JSON.parse(Array(#"{"a":true,"b":1,"c":0,"d":"x","e":null}"#.utf8))
                == .object([
                    "a": .bool(true), "b": .number(1), "c": .number(0), "d": .string("x"), "e": .null,
                ]))
        #expect(JSON.parse(Array("{".utf8)) == nil)
        #expect(JSON.object(["k": .string("a\"\n\u{1}")]).text == #"{"k":"a\"\n\u0001"}"#)
    }
}
