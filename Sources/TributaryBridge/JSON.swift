import Foundation
import Tributary
import TributaryJSON

/// A JSON value, `Sendable`, for bridge messages and DevTools protocol traffic.
///
/// Numbers are read as the native `--properties` reads them (``JSONNumber``, shared with it):
/// a whole number beyond ±2^53 within the 64-bit integers (`9007199254740993`) is an ``integer(_:)``,
/// which a `Double` would round; a whole number beyond the 64-bit integers that is not the shortest
/// decimal of its `Double` is an ``inexactInteger(_:)``, which the bridge refuses rather than store
/// it with other digits; every other number is a ``number(_:)``.
public enum JSON: Sendable, Equatable, Decodable {
    case null
    case bool(Bool)
    case number(Double)
    /// A whole number beyond ±2^53 within the 64-bit integers: a `Double` would round it.
    case integer(Int64)
    /// A whole number beyond the 64-bit integers that a `Double` would store with other digits
    /// (`18446744073709551617`), as `Decimal` reads it.
    case inexactInteger(Decimal)
    case string(String)
    case array([JSON])
    case object([String: JSON])

    /// Parses `bytes`; nil when they are not JSON.
    ///
    /// A `\u` escape of a lone surrogate (half of a pair, which JavaScript strings may hold and
    /// `JSON.stringify` writes so, but UTF-8 cannot) is read as U+FFFD, as a browser's `TextEncoder`
    /// converts it: a page's message, or a DevTools frame carrying one, is not lost for it.
    public static func parse<C: Collection>(_ bytes: C) -> JSON? where C.Element == UInt8 {
        let data = Data(bytes)
        if let json = try? JSONDecoder().decode(JSON.self, from: data) { return json }
        guard let repaired = replacingLoneSurrogates(Array(data)) else { return nil }
        return try? JSONDecoder().decode(JSON.self, from: Data(repaired))
    }

    /// `bytes` with every `\u` escape of a lone surrogate replaced by `\ufffd`, or nil when there is none.
    static func replacingLoneSurrogates(_ bytes: [UInt8]) -> [UInt8]? {
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
    public subscript(key: String) -> JSON? {
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
    public var object: [String: JSON]? {
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
            case .int(let i): self = i.magnitude > 1 << 53 ? .integer(i) : .number(Double(i))
            case .double(let d): self = .number(d)
            case .inexactInteger(let exact): self = .inexactInteger(exact)
            }
        } else if let s = try? c.decode(String.self) {
            self = .string(s)
        } else if let a = try? c.decode([JSON].self) {
            self = .array(a)
        } else {
            self = .object(try c.decode([String: JSON].self))
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
        case .array: "an array"
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

    /// A JSON string literal that is also safe inside a script (U+2028 and U+2029 escaped).
    static func quoted(_ s: String) -> String { JSONString.quoted(s, escapingLineSeparators: true) }
}
