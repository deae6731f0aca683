import Foundation
import TributaryJSON

/// A JSON value, `Sendable`, for bridge messages and DevTools protocol traffic.
public enum JSON: Sendable, Equatable, Decodable {
    case null
    case bool(Bool)
    case number(Double)
    case string(String)
    case array([JSON])
    case object([String: JSON])

    /// Parses `bytes`; nil when they are not JSON.
    public static func parse<C: Collection>(_ bytes: C) -> JSON? where C.Element == UInt8 {
        try? JSONDecoder().decode(JSON.self, from: Data(bytes))
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

    /// The number, if this is one.
    public var number: Double? {
        if case .number(let n) = self { return n }
        return nil
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
        } else if let n = try? c.decode(Double.self) {
            self = .number(n)
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
        case .number: "a number"
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
