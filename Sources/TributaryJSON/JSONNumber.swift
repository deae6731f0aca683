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
