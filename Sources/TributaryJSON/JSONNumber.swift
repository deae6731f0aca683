import Foundation

/// A JSON number as the event rules read it, wherever JSON comes in (`--properties`, a hybrid page's
/// message): a whole number within the 64-bit integers exactly, any other number as a double, except
/// a whole number beyond Int64 that is not the shortest decimal of its double, which, stored as that
/// double, would be written back with other digits.
public enum JSONNumber {
    case int(Int64), double(Double), inexactInteger(Decimal)

    /// The number in `container`, or nil when it holds no number (or one no `Double` holds, 1e400).
    public init?(_ container: any SingleValueDecodingContainer) {
        if let i = try? container.decode(Int64.self) {
            self = .int(i)
        } else if let d = try? container.decode(Double.self) {
            // `Decimal(Double)` gives the double's shortest decimal.
            if let exact = try? container.decode(Decimal.self), Self.isWhole(exact), Decimal(d) != exact {
                self = .inexactInteger(exact)
            } else {
                self = .double(d)
            }
        } else {
            return nil
        }
    }

    private static func isWhole(_ value: Decimal) -> Bool {
        var rounded = Decimal()
        var value = value
        NSDecimalRound(&rounded, &value, 0, .plain)
        return rounded == value
    }
}

/// The keys of the object `text` holds (valid JSON, an object), in order, each decoded, repeats included.
private func topLevelKeys(of text: String) -> [String] {
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
