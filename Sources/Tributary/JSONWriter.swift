import Foundation
import TributaryJSON

/// A small, allocation-light JSON writer for event bodies.
///
/// Events are written on every `track()`, so this avoids `JSONEncoder`'s reflection and intermediate
/// dictionaries. Output is compact UTF-8; strings are escaped per RFC 8259.
public struct JSONWriter {
    /// The bytes written so far.
    public private(set) var bytes: [UInt8] = []

    /// Creates an empty writer with room for `capacity` bytes.
    public init(capacity: Int = 512) { bytes.reserveCapacity(capacity) }

    /// Appends raw, already-valid JSON bytes.
    public mutating func raw(_ text: StaticString) {
        text.withUTF8Buffer { bytes.append(contentsOf: $0) }
    }

    /// Appends raw, already-valid JSON bytes.
    public mutating func raw<C: Collection>(_ other: C) where C.Element == UInt8 { bytes.append(contentsOf: other) }

    /// Appends a JSON string literal (``JSONString``).
    public mutating func string(_ s: String) { JSONString.append(s, to: &bytes) }

    /// Appends a whole number.
    public mutating func int(_ v: Int64) { bytes.append(contentsOf: String(v).utf8) }

    /// Appends a finite number (callers validate finiteness first).
    public mutating func double(_ v: Double) {
        if v == v.rounded(), abs(v) < 1e15 {
            bytes.append(contentsOf: String(Int64(v)).utf8)  // 3.0 -> 3, as JavaScript would print it
        } else {
            bytes.append(contentsOf: v.description.utf8)
        }
    }

    /// Appends `"key":`.
    public mutating func key(_ k: String) {
        string(k)
        bytes.append(UInt8(ascii: ":"))
    }

    /// Appends a property value.
    public mutating func value(_ v: PropertyValue) {
        switch v {
        case .string(let s): string(s)
        case .int(let i): int(i)
        case .double(let d): double(d)
        case .bool(let b): raw(b ? "true" : "false")
        case .list(let items):
            bytes.append(UInt8(ascii: "["))
            for (i, item) in items.enumerated() {
                if i > 0 { bytes.append(UInt8(ascii: ",")) }
                string(item)
            }
            bytes.append(UInt8(ascii: "]"))
        case .date(let date): string(Self.sensorsDate(date))
        }
    }

    /// Appends `"k":v` pairs (sorted by key, for stable output), each preceded by a comma unless first.
    public mutating func members(_ properties: [String: PropertyValue], first: inout Bool) {
        for (k, v) in Self.sortedMembers(properties) {
            if !first { bytes.append(UInt8(ascii: ",")) }
            first = false
            key(k)
            value(v)
        }
    }

    /// `properties` as an array sorted by key (`String` order: byte order for the ASCII names
    /// properties have).
    static func sortedMembers(_ properties: [String: PropertyValue]) -> [(key: String, value: PropertyValue)] {
        properties.sorted { $0.key < $1.key }
    }

    /// `yyyy-MM-dd HH:mm:ss.SSS` in local time, the Sensors DATETIME format.
    static func sensorsDate(_ date: Date) -> String {
        let millis = Int64((date.timeIntervalSince1970 * 1000).rounded(.down))
        // Floored, as the milliseconds below: -1.5 s is second -2 and 500 ms, not second -1.
        let ms = Int32(((millis % 1000) + 1000) % 1000)
        var seconds = time_t((millis - Int64(ms)) / 1000)
        var parts = tm()
        localtime_r(&seconds, &parts)
        func pad(_ v: Int32, _ width: Int) -> String {
            let s = String(v)
            return String(repeating: "0", count: max(0, width - s.count)) + s
        }
        return "\(pad(parts.tm_year + 1900, 4))-\(pad(parts.tm_mon + 1, 2))-\(pad(parts.tm_mday, 2)) "
            + "\(pad(parts.tm_hour, 2)):\(pad(parts.tm_min, 2)):\(pad(parts.tm_sec, 2)).\(pad(ms, 3))"
    }
}
