import Foundation
import TributaryWire

/// Reads and edits top-level fields of a JSON object held as UTF-8 bytes, without building a tree.
///
/// The drain and upload paths touch every event, so they avoid a full parse: this scanner walks the
/// top-level members properly (strings with escapes, nested objects and arrays are skipped as whole
/// values), so a key inside `properties` or inside a string can never be mistaken for a top-level one.
enum JSONFields {
    /// The top-level string value of `key`, or nil when absent or not a string.
    static func string(_ key: String, in json: [UInt8]) -> String? {
        json.withUnsafeBytes { json in
            guard let range = stringRange(key, in: json) else { return nil }
            return string(at: range, in: json)
        }
    }

    /// The range of the top-level string value of `key` without its quotes, or nil when absent or
    /// not a string.
    static func stringRange(_ key: String, in json: UnsafeRawBufferPointer) -> Range<Int>? {
        guard let range = valueRange(key, in: json), json[range.lowerBound] == UInt8(ascii: "\"") else { return nil }
        return (range.lowerBound + 1)..<(range.upperBound - 1)
    }

    /// The string whose escaped text (without quotes) is at `range`; nil when an escape is invalid.
    static func string(at range: Range<Int>, in json: UnsafeRawBufferPointer) -> String? {
        let inner = UnsafeRawBufferPointer(rebasing: json[range])
        if !inner.contains(UInt8(ascii: "\\")) { return String(decoding: inner, as: UTF8.self) }
        return unescape(inner)
    }

    /// The top-level integer value of `key`.
    static func int(_ key: String, in json: [UInt8]) -> Int64? {
        json.withUnsafeBytes { json in
            guard let range = valueRange(key, in: json) else { return nil }
            return Int64(String(decoding: UnsafeRawBufferPointer(rebasing: json[range]), as: UTF8.self))
        }
    }

    /// Inserts `,"key":rawValue` before the object's closing brace (rawValue must be valid JSON).
    static func appending(_ key: String, rawValue: [UInt8], to json: [UInt8]) -> [UInt8]? {
        var member: [UInt8] = [UInt8(ascii: "\"")]
        member.append(contentsOf: key.utf8)
        member.append(contentsOf: "\":".utf8)
        member.append(contentsOf: rawValue)
        var out: [UInt8] = []
        out.reserveCapacity(json.count + member.count + 1)
        let added = json.withUnsafeBytes { json in
            member.withUnsafeBytes { member in appendJSONObject(json, adding: member, to: &out) }
        }
        return added ? out : nil
    }

    /// The byte range of the value of top-level `key` (for strings, including the quotes).
    static func valueRange(_ key: String, in json: UnsafeRawBufferPointer) -> Range<Int>? {
        var key = key
        return key.withUTF8 { key in valueRange(UnsafeRawBufferPointer(key), in: json) }
    }

    /// The byte range of the value of top-level `key` (for strings, including the quotes).
    static func valueRange(_ key: UnsafeRawBufferPointer, in json: UnsafeRawBufferPointer) -> Range<Int>? {
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
            let matches = keyEnd - 2 - i == key.count
                && (key.isEmpty || memcmp(json.baseAddress! + i + 1, key.baseAddress!, key.count) == 0)
            i = skipSpace(json, keyEnd)
            guard i < json.count, json[i] == UInt8(ascii: ":") else { return nil }
            i = skipSpace(json, i + 1)
            guard let valueEnd = valueEnd(json, i) else { return nil }
            if matches { return i..<valueEnd }
            i = valueEnd
        }
    }

    private static func isSpace(_ b: UInt8) -> Bool { b == 0x20 || b == 0x0A || b == 0x0D || b == 0x09 }

    private static func skipSpace(_ json: UnsafeRawBufferPointer, _ start: Int) -> Int {
        var i = start
        while i < json.count, isSpace(json[i]) { i += 1 }
        return i
    }

    /// Index just past the closing quote of the string whose opening quote is at `start`.
    ///
    /// Each quote is found with `memchr` (vectorized in glibc) and is the end unless escaped, that is
    /// preceded by an odd number of backslashes: a byte loop cost the drain about 7 instructions a byte
    /// of every string it passed.
    private static func stringEnd(_ json: UnsafeRawBufferPointer, _ start: Int) -> Int? {
        guard let base = json.baseAddress else { return nil }
        var from = start + 1
        while from < json.count {
            guard let found = memchr(base + from, Int32(UInt8(ascii: "\"")), json.count - from) else { return nil }
            let quote = base.distance(to: UnsafeRawPointer(found))
            var backslash = quote - 1
            while backslash > start, json[backslash] == UInt8(ascii: "\\") { backslash -= 1 }
            if (quote - 1 - backslash) % 2 == 0 { return quote + 1 }
            from = quote + 1
        }
        return nil
    }

    /// Index just past the value starting at `start`.
    private static func valueEnd(_ json: UnsafeRawBufferPointer, _ start: Int) -> Int? {
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

    private static func unescape(_ inner: UnsafeRawBufferPointer) -> String? {
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
