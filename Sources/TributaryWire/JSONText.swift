import Foundation
import TributaryJSON

/// Compact JSON text of the values `JSONSerialization` produces (`[String: Any]`, `[Any]`, `String`,
/// `NSNumber`, `NSNull`), with sorted keys: what the agent writes for re-encoded extension events.
///
/// Written here rather than with `JSONSerialization.data(withJSONObject:options: .sortedKeys)`: on
/// Linux, Foundation sorts keys with locale-aware (ICU) string comparison, about 1 ms of CPU per event
/// (it made the reference collector, which then stored events re-encoded, the bottleneck of every
/// end-to-end run). Keys here are sorted by their UTF-8 bytes; `/` is not escaped; numbers keep their
/// kind (integer, double, boolean).
public enum JSONText {
    private static let booleanType = ObjectIdentifier(type(of: NSNumber(value: true)))

    /// `value` as compact JSON with every object's keys sorted by their UTF-8 bytes, or nil when it holds
    /// something JSON cannot represent (a non-finite number, a value of another type).
    public static func sortedCompact(_ value: Any) -> [UInt8]? {
        var output: [UInt8] = []
        output.reserveCapacity(1024)
        guard write(value, to: &output) else { return nil }
        return output
    }

    private static func write(_ value: Any, to output: inout [UInt8]) -> Bool {
        switch value {
        case let string as String:
            JSONString.append(string, to: &output)
        case let object as [String: Any]:
            output.append(UInt8(ascii: "{"))
            let keys = object.keys.sorted { $0.utf8.lexicographicallyPrecedes($1.utf8) }
            for (i, key) in keys.enumerated() {
                if i > 0 { output.append(UInt8(ascii: ",")) }
                JSONString.append(key, to: &output)
                output.append(UInt8(ascii: ":"))
                guard write(object[key]!, to: &output) else { return false }
            }
            output.append(UInt8(ascii: "}"))
        case let array as [Any]:
            output.append(UInt8(ascii: "["))
            for (i, element) in array.enumerated() {
                if i > 0 { output.append(UInt8(ascii: ",")) }
                guard write(element, to: &output) else { return false }
            }
            output.append(UInt8(ascii: "]"))
        case let number as NSNumber where !isSwiftScalar(value):
            return write(exactValue(of: number), to: &output)  // as the Swift value of its type, below
        case let bool as Bool:
            output.append(contentsOf: (bool ? "true" : "false").utf8)
        case let int as Int:
            output.append(contentsOf: String(int).utf8)
        case let int as Int64:
            output.append(contentsOf: String(int).utf8)
        case let int as UInt64:
            output.append(contentsOf: String(int).utf8)
        case let double as Double:
            guard double.isFinite else { return false }
            output.append(contentsOf: doubleText(double).utf8)
        case is NSNull:
            output.append(contentsOf: "null".utf8)
        default:
            return false
        }
        return true
    }

    /// A number `JSONSerialization` read, as the Swift value of the type it was written as: `Bool` for
    /// `true`/`false`, `Double` for a number with a fraction or an exponent, else `Int64` (`UInt64`
    /// above `Int64.max`). On Linux every such `NSNumber` casts to `Bool`, `Int` and `Double` alike,
    /// 0 and 1 to `Bool` first: a cast would turn a `0` into `false`.
    public static func exactValue(of number: NSNumber) -> any Sendable {
        if ObjectIdentifier(type(of: number)) == booleanType { return number.boolValue }
        switch UInt8(bitPattern: number.objCType.pointee) {
        case UInt8(ascii: "f"), UInt8(ascii: "d"): return number.doubleValue
        case UInt8(ascii: "Q"), UInt8(ascii: "L"): return number.uint64Value
        default: return number.int64Value
        }
    }

    /// Whole doubles below 2^53 as integers (as Foundation writes them), others in Swift's shortest form.
    private static func doubleText(_ double: Double) -> String {
        if double.rounded() == double, abs(double) < 0x1p53 { return String(Int64(double)) }
        return "\(double)"
    }

    /// Whether `value` is a Swift `Bool`, `Int`, `Int64`, `UInt64` or `Double` rather than an `NSNumber` (on Linux,
    /// both cast to either; the exact type says which one was stored).
    private static func isSwiftScalar(_ value: Any) -> Bool {
        let type = ObjectIdentifier(Swift.type(of: value))
        return type == ObjectIdentifier(Bool.self) || type == ObjectIdentifier(Int.self)
            || type == ObjectIdentifier(Int64.self) || type == ObjectIdentifier(UInt64.self)
            || type == ObjectIdentifier(Double.self)
    }
}
