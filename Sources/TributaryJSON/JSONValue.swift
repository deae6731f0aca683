import Foundation

/// A JSON value: the one every module reads JSON into (`--properties`, settings, a hybrid page's
/// messages, DevTools protocol traffic, apple-app-site-association files). `Sendable`, decoded strictly
/// (a number is never taken for a boolean, nor a boolean for a number).
///
/// Numbers are read by ``JSONNumber``: a whole number within the 64-bit integers is an
/// ``integer(_:)``, exactly (a `Double` rounds those beyond ±2^53, `9007199254740993`); a whole number
/// beyond the 64-bit integers that is not the shortest decimal of its `Double` is an
/// ``inexactInteger(_:)``, which the event rules refuse rather than store it with other digits;
/// every other number is a ``number(_:)``. Two numbers are equal when their values are (`1` and
/// `1.0`), whatever case holds them.
public enum JSONValue: Sendable, Equatable, Decodable {
    case null
    case bool(Bool)
    case number(Double)
    /// A whole number within the 64-bit integers, exactly.
    case integer(Int64)
    /// A whole number beyond the 64-bit integers that a `Double` would store with other digits
    /// (`18446744073709551617`), as `Decimal` reads it.
    case inexactInteger(Decimal)
    case string(String)
    case array([JSONValue])
    case object([String: JSONValue])

    /// Parses `bytes`; nil when they are not JSON.
    ///
    /// A `\u` escape of a lone surrogate (half of a pair, which JavaScript strings may hold and
    /// `JSON.stringify` writes so, but UTF-8 cannot) is read as U+FFFD, as a browser's `TextEncoder`
    /// converts it: a page's message, or a DevTools frame carrying one, is not lost for it.
    public static func parse<C: Collection>(_ bytes: C) -> JSONValue? where C.Element == UInt8 {
        let data = Data(bytes)
        if let json = try? JSONDecoder().decode(JSONValue.self, from: data) { return json }
        guard let repaired = replacingLoneSurrogates(Array(data)) else { return nil }
        return try? JSONDecoder().decode(JSONValue.self, from: Data(repaired))
    }

    /// `bytes` with every `\u` escape of a lone surrogate replaced by `\ufffd`, or nil when there is none.
    package static func replacingLoneSurrogates(_ bytes: [UInt8]) -> [UInt8]? {
        func unit(at i: Int) -> UInt16? {
            guard i + 6 <= bytes.count, bytes[i] == UInt8(ascii: "\\"), bytes[i + 1] == UInt8(ascii: "u") else { return nil }
            return UInt16(String(decoding: bytes[(i + 2)..<(i + 6)], as: UTF8.self), radix: 16)
        }
        let replacement = Array(#"\ufffd"#.utf8)
        var out: [UInt8] = []
        out.reserveCapacity(bytes.count)
        var changed = false
        var i = 0
        while i < bytes.count {
            guard bytes[i] == UInt8(ascii: "\\"), i + 1 < bytes.count else {
                out.append(bytes[i])
                i += 1
                continue
            }
            guard let code = unit(at: i) else {
                out.append(contentsOf: bytes[i...(i + 1)])  // another escape, `\\` included: kept whole
                i += 2
                continue
            }
            switch code {
            case 0xD800...0xDBFF where unit(at: i + 6).map { (0xDC00...0xDFFF).contains($0) } == true:
                out.append(contentsOf: bytes[i..<(i + 12)])
                i += 12
            case 0xD800...0xDFFF:
                out.append(contentsOf: replacement)
                changed = true
                i += 6
            default:
                out.append(contentsOf: bytes[i..<(i + 6)])
                i += 6
            }
        }
        return changed ? out : nil
    }

    /// The member `key` of an object (nil for other values or a missing key).
    public subscript(key: String) -> JSONValue? {
        if case .object(let o) = self { return o[key] }
        return nil
    }

    /// The string, if this is one.
    public var string: String? {
        if case .string(let s) = self { return s }
        return nil
    }

    /// The number, if this is one (an ``integer(_:)`` as the nearest `Double`; nil for an
    /// ``inexactInteger(_:)``, which no `Double` holds).
    public var number: Double? {
        switch self {
        case .number(let n): n
        case .integer(let i): Double(i)
        default: nil
        }
    }

    /// The number, if this is one that is a whole number an `Int` holds exactly (nil for 1.5, 1e19): for
    /// ids and counts a peer sends, which must not trap when they are out of range.
    public var int: Int? {
        switch self {
        case .integer(let i): Int(exactly: i)
        case .number(let n): Int(exactly: n)
        default: nil
        }
    }

    /// The members, if this is an object.
    public var object: [String: JSONValue]? {
        if case .object(let o) = self { return o }
        return nil
    }

    /// Decodes strictly: a number is never taken for a boolean, nor a boolean for a number.
    public init(from decoder: any Decoder) throws {
        let c = try decoder.singleValueContainer()
        if c.decodeNil() {
            self = .null
        } else if let b = try? c.decode(Bool.self) {
            self = .bool(b)
        } else if let number = JSONNumber(c) {
            switch number {
            case .int(let i): self = .integer(i)
            case .double(let d): self = .number(d)
            case .inexactInteger(let exact): self = .inexactInteger(exact)
            }
        } else if let s = try? c.decode(String.self) {
            self = .string(s)
        } else if let a = try? c.decode([JSONValue].self) {
            self = .array(a)
        } else {
            self = .object(try c.decode([String: JSONValue].self))
        }
    }

    /// A short name of the value's kind, for error messages (never the value itself).
    public var kindName: String {
        switch self {
        case .null: "null"
        case .bool: "a boolean"
        case .number, .integer: "a number"
        case .inexactInteger: "a whole number beyond the 64-bit integers"
        case .string: "a string"
        case .array: "a list"
        case .object: "an object"
        }
    }

    /// Compact JSON text.
    public var text: String {
        switch self {
        case .null: return "null"
        case .bool(let b): return b ? "true" : "false"
        case .number(let n):
            if n == n.rounded(), abs(n) < 1e15 { return String(Int64(n)) }
            return n.isFinite ? n.description : "null"
        case .integer(let i): return String(i)
        case .inexactInteger(let d): return d.description
        case .string(let s): return Self.quoted(s)
        case .array(let items): return "[" + items.map(\.text).joined(separator: ",") + "]"
        case .object(let o):
            return "{"
                + o.sorted { $0.key < $1.key }.map { Self.quoted($0.key) + ":" + $0.value.text }
                .joined(separator: ",") + "}"
        }
    }

    /// Equal values: numbers by value, whichever case holds them (an ``integer(_:)`` beyond ±2^53
    /// equals no ``number(_:)``: no `Double` holds it exactly).
    public static func == (lhs: JSONValue, rhs: JSONValue) -> Bool {
        switch (lhs, rhs) {
        case (.null, .null): true
        case (.bool(let a), .bool(let b)): a == b
        case (.number(let a), .number(let b)): a == b
        case (.integer(let a), .integer(let b)): a == b
        case (.integer(let a), .number(let b)), (.number(let b), .integer(let a)): Double(exactly: a) == b
        case (.inexactInteger(let a), .inexactInteger(let b)): a == b
        case (.string(let a), .string(let b)): a == b
        case (.array(let a), .array(let b)): a == b
        case (.object(let a), .object(let b)): a == b
        default: false
        }
    }

    /// A JSON string literal that is also safe inside a script (U+2028 and U+2029 escaped).
    package static func quoted(_ s: String) -> String { JSONString.quoted(s, escapingLineSeparators: true) }

    /// The keys of the object `text` holds (valid JSON, an object), in order, each decoded, repeats
    /// included: what a decoded object cannot say (a key given twice).
    package static func topLevelKeys(of text: String) -> [String] {
        let bytes = Array(text.utf8)
        var keys: [String] = []
        var depth = 0
        var i = 0
        while i < bytes.count {
            switch bytes[i] {
            case UInt8(ascii: "{"), UInt8(ascii: "["): depth += 1
            case UInt8(ascii: "}"), UInt8(ascii: "]"): depth -= 1
            case UInt8(ascii: "\""):
                // A string: up to its closing quote, past escaped ones.
                let start = i
                i += 1
                while i < bytes.count && bytes[i] != UInt8(ascii: "\"") { i += bytes[i] == UInt8(ascii: "\\") ? 2 : 1 }
                let literal = bytes[start...min(i, bytes.count - 1)]
                var next = i + 1
                while next < bytes.count, JSONBytes.isWhitespace(bytes[next]) { next += 1 }
                if depth == 1, next < bytes.count, bytes[next] == UInt8(ascii: ":"),
                    let key = try? JSONDecoder().decode(String.self, from: Data(literal))
                {
                    keys.append(key)
                }
            default: break
            }
            i += 1
        }
        return keys
    }
}
