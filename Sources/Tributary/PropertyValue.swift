import Foundation
import TributaryJSON

/// A property value an event may carry (the Sensors Analytics value types).
public enum PropertyValue: Sendable, Hashable {
    /// Text, at most ``EventRules/maxStringBytes`` UTF-8 bytes.
    case string(String)
    /// A whole number.
    case int(Int64)
    /// A finite floating-point number (NaN and infinities are rejected).
    case double(Double)
    /// True or false.
    case bool(Bool)
    /// A list of strings (Sensors' LIST type).
    case list([String])
    /// A point in time, sent as `yyyy-MM-dd HH:mm:ss.SSS` in local time (Sensors' DATETIME type).
    case date(Date)
}

extension PropertyValue: ExpressibleByStringLiteral, ExpressibleByIntegerLiteral, ExpressibleByFloatLiteral,
    ExpressibleByBooleanLiteral, ExpressibleByArrayLiteral
{
    public init(stringLiteral value: String) { self = .string(value) }
    public init(integerLiteral value: Int64) { self = .int(value) }
    public init(floatLiteral value: Double) { self = .double(value) }
    public init(booleanLiteral value: Bool) { self = .bool(value) }
    public init(arrayLiteral elements: String...) { self = .list(elements) }
}

extension PropertyValue {
    /// Parses a JSON object of properties (as the CLI's `--properties` takes it).
    ///
    /// Strings, numbers, booleans and arrays of strings map to the matching case; anything else
    /// (null, nested objects, mixed arrays) is a ``TrackingError`` naming the property.
    ///
    /// `checkingDuplicateKeys`: the text is typed JSON, checked strictly (its syntax by the collector's
    /// scanner, which refuses a trailing comma JSONDecoder takes and names each fault's offset; a key
    /// given twice, which JSON decoding would keep one value of); off for JSON this code wrote itself
    /// from a dictionary, which is valid and cannot repeat a key.
    public static func properties(fromJSON text: String, checkingDuplicateKeys: Bool = true) throws -> [String: PropertyValue] {
        // JSONDecoder takes a trailing comma (`{"a":1,}`) for JSON, and gives one catch-all reason for
        // most faults: typed text is first checked by the collector's strict scanner, which names the
        // fault and where it is.
        if checkingDuplicateKeys {
            let bytes = Array(text.utf8)
            let fault: JSONSyntaxError? = bytes.withUnsafeBufferPointer { buffer in
                do throws(JSONSyntaxError) {
                    _ = try JSONScanner.scanDocument(buffer, range: 0..<buffer.count)
                    return nil
                } catch {
                    return error
                }
            }
            if let fault {
                throw TrackingError(.malformedProperties, field: "properties", "The properties are not valid JSON: \(fault).")
            }
        }
        let parsed: JSONValue
        do {
            parsed = try JSONDecoder().decode(JSONValue.self, from: Data(text.utf8))
        } catch {
            throw TrackingError(.malformedProperties, field: "properties", "The properties are not valid JSON: \(error).")
        }
        guard case .object(let object) = parsed else {
            throw TrackingError(.malformedProperties, field: "properties", "The properties must be a JSON object.")
        }
        // JSONDecoder keeps one of two equal keys and drops the other without a word.
        var seen = Set<String>()
        for key in checkingDuplicateKeys ? JSONValue.topLevelKeys(of: text) : [] where !seen.insert(key).inserted {
            throw TrackingError(
                .malformedProperties, field: key, "Property \(key) appears more than once in the properties; give it once.")
        }
        var out: [String: PropertyValue] = [:]
        for (key, value) in object {
            switch value {
            case .string(let s): out[key] = .string(s)
            case .integer(let i): out[key] = .int(i)
            case .number(let d): out[key] = .double(d)
            case .bool(let b): out[key] = .bool(b)
            case .array(let items):
                var strings: [String] = []
                for item in items {
                    guard case .string(let s) = item else {
                        throw TrackingError(
                            .invalidValueType, field: key,
                            "Property \(key) is a list; list elements must all be strings.")
                    }
                    strings.append(s)
                }
                out[key] = .list(strings)
            case .inexactInteger:
                throw TrackingError(
                    .inexactNumber, field: key,
                    "Property \(key) is a whole number beyond the 64-bit integers (±9223372036854775807) that a double "
                        + "would store with other digits; send it as a string, or as a double's digits (1.8e19).")
            case .null, .object:
                throw TrackingError(
                    .invalidValueType, field: key,
                    "Property \(key) is \(value.kindName); allowed types are string, number, boolean and list of strings.")
            }
        }
        return out
    }
}
