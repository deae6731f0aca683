import Foundation

/// Reads and edits top-level fields of a JSON object held as UTF-8 bytes, without building a tree.
///
/// The drain and upload paths touch every event, so they avoid a full parse: this scanner walks the
/// top-level members properly (strings with escapes, nested objects and arrays are skipped as whole
/// values), so a key inside `properties` or inside a string can never be mistaken for a top-level one.
enum JSONFields {
    /// The top-level string value of `key`, or nil when absent or not a string.
    static func string(_ key: String, in json: [UInt8]) -> String? {
        guard let range = valueRange(Array(key.utf8), in: json), json[range.lowerBound] == UInt8(ascii: "\"") else {
            return nil
        }
        let inner = json[(range.lowerBound + 1)..<(range.upperBound - 1)]
        if !inner.contains(UInt8(ascii: "\\")) { return String(decoding: inner, as: UTF8.self) }
        return unescape(inner)
    }

    /// The top-level integer value of `key`.
    static func int(_ key: String, in json: [UInt8]) -> Int64? {
        guard let range = valueRange(Array(key.utf8), in: json) else { return nil }
        return Int64(String(decoding: json[range], as: UTF8.self))
    }

    /// Inserts `,"key":rawValue` before the object's closing brace (rawValue must be valid JSON).
    static func appending(_ key: String, rawValue: [UInt8], to json: [UInt8]) -> [UInt8]? {
        guard let close = json.lastIndex(where: { !isSpace($0) }), json[close] == UInt8(ascii: "}") else { return nil }
        let isEmpty = json[..<close].lastIndex(where: { !isSpace($0) }).map { json[$0] == UInt8(ascii: "{") } ?? true
        var out: [UInt8] = []
        out.reserveCapacity(json.count + key.utf8.count + rawValue.count + 4)
        out.append(contentsOf: json[..<close])
        if !isEmpty { out.append(UInt8(ascii: ",")) }
        out.append(UInt8(ascii: "\""))
        out.append(contentsOf: key.utf8)
        out.append(contentsOf: "\":".utf8)
        out.append(contentsOf: rawValue)
        out.append(contentsOf: json[close...])
        return out
    }

    /// The byte range of the value of top-level `key` (for strings, including the quotes).
    static func valueRange(_ key: [UInt8], in json: [UInt8]) -> Range<Int>? {
        var i = skipSpace(json, 0)
        guard i < json.count, json[i] == UInt8(ascii: "{") else { return nil }
        i += 1
        while true {
            i = skipSpace(json, i)
            guard i < json.count else { return nil }
            if json[i] == UInt8(ascii: "}") { return nil }
            if json[i] == UInt8(ascii: ",") {
                i += 1
                continue
            }
            guard json[i] == UInt8(ascii: "\""), let keyEnd = stringEnd(json, i) else { return nil }
            let matches = json[(i + 1)..<(keyEnd - 1)].elementsEqual(key)
            i = skipSpace(json, keyEnd)
            guard i < json.count, json[i] == UInt8(ascii: ":") else { return nil }
            i = skipSpace(json, i + 1)
            guard let valueEnd = valueEnd(json, i) else { return nil }
            if matches { return i..<valueEnd }
            i = valueEnd
        }
    }

    private static func isSpace(_ b: UInt8) -> Bool { b == 0x20 || b == 0x0A || b == 0x0D || b == 0x09 }

    private static func skipSpace(_ json: [UInt8], _ start: Int) -> Int {
        var i = start
        while i < json.count, isSpace(json[i]) { i += 1 }
        return i
    }

    /// Index just past the closing quote of the string starting at `start`.
    private static func stringEnd(_ json: [UInt8], _ start: Int) -> Int? {
        var i = start + 1
        while i < json.count {
            switch json[i] {
            case UInt8(ascii: "\\"): i += 2
            case UInt8(ascii: "\""): return i + 1
            default: i += 1
            }
        }
        return nil
    }

    /// Index just past the value starting at `start`.
    private static func valueEnd(_ json: [UInt8], _ start: Int) -> Int? {
        guard start < json.count else { return nil }
        switch json[start] {
        case UInt8(ascii: "\""):
            return stringEnd(json, start)
        case UInt8(ascii: "{"), UInt8(ascii: "["):
            var depth = 0
            var i = start
            while i < json.count {
                switch json[i] {
                case UInt8(ascii: "\""):
                    guard let end = stringEnd(json, i) else { return nil }
                    i = end
                    continue
                case UInt8(ascii: "{"), UInt8(ascii: "["): depth += 1
                case UInt8(ascii: "}"), UInt8(ascii: "]"):
                    depth -= 1
                    if depth == 0 { return i + 1 }
                default: break
                }
                i += 1
            }
            return nil
        default:
            var i = start
            while i < json.count, json[i] != UInt8(ascii: ","), json[i] != UInt8(ascii: "}"), !isSpace(json[i]) { i += 1 }
            return i
        }
    }

    private static func unescape(_ inner: ArraySlice<UInt8>) -> String? {
        var quoted = [UInt8(ascii: "[")]
        quoted.append(UInt8(ascii: "\""))
        quoted.append(contentsOf: inner)
        quoted.append(contentsOf: "\"]".utf8)
        return (try? JSONArrayOfString.decode(quoted))
    }
}

private enum JSONArrayOfString {
    static func decode(_ bytes: [UInt8]) throws -> String? {
        (try JSONSerialization.jsonObject(with: Data(bytes)) as? [String])?.first
    }
}
