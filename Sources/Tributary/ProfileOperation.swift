/// A user-profile operation of the Sensors Analytics data model: the `type` of a profile record.
///
/// Profiles sit beside events: each operation changes the properties of the user the record's
/// `distinct_id` names (`docs/wire-formats.md`, "Profiles").
public struct ProfileOperation: RawRepresentable, Hashable, Sendable, CaseIterable, CustomStringConvertible {
    /// The record's `type`: `profile_set`, `profile_set_once`, ….
    public let rawValue: String

    private init(_ rawValue: String) { self.rawValue = rawValue }

    /// The operation of this record `type`; nil for any other type (`track`, `item_set`, …).
    public init?(rawValue: String) {
        guard let known = Self.allCases.first(where: { $0.rawValue == rawValue }) else { return nil }
        self = known
    }

    public var description: String { rawValue }

    /// `profile_set`: sets each property, replacing its value.
    public static let set = ProfileOperation("profile_set")
    /// `profile_set_once`: sets each property the profile does not have yet; a property it has keeps its value.
    public static let setOnce = ProfileOperation("profile_set_once")
    /// `profile_increment`: adds each number to the property (a missing one counts from 0).
    public static let increment = ProfileOperation("profile_increment")
    /// `profile_append`: appends each list's strings to the list property (a missing one starts empty).
    public static let append = ProfileOperation("profile_append")
    /// `profile_unset`: removes each property named (its value is `true`).
    public static let unset = ProfileOperation("profile_unset")
    /// `profile_delete`: deletes the user's whole profile (no properties).
    public static let delete = ProfileOperation("profile_delete")

    public static let allCases: [ProfileOperation] = [.set, .setOnce, .increment, .append, .unset, .delete]
}

/// The Sensors Analytics rules for the properties of a profile operation, on top of the event rules
/// (names, reserved names, string lengths, finite numbers, dates).
public enum ProfileRules {
    /// Checks `properties` for `operation`; throws ``TrackingError`` naming the property and the rule.
    ///
    /// - `profile_set`, `profile_set_once`: at least one property, of any event property type;
    /// - `profile_increment`: at least one, numbers only;
    /// - `profile_append`: at least one, lists of strings only;
    /// - `profile_unset`: at least one, each `true`;
    /// - `profile_delete`: none.
    public static func validate(_ operation: ProfileOperation, _ properties: [String: PropertyValue]) throws {
        if operation == .delete {
            guard properties.isEmpty else {
                throw TrackingError(
                    .invalidProfileUpdate, field: "properties",
                    "profile_delete deletes the whole profile and takes no properties; it was given \(properties.count).")
            }
            return
        }
        guard !properties.isEmpty else {
            throw TrackingError(
                .invalidProfileUpdate, field: "properties", "\(operation) needs at least one property; it was given none.")
        }
        for (key, value) in properties.sorted(by: { $0.key < $1.key }) {
            try EventRules.validateProperty(key, value)
            let expected: String?
            switch (operation, value) {
            case (.increment, .int), (.increment, .double), (.append, .list), (.unset, .bool(true)): expected = nil
            case (.increment, _): expected = "a number"
            case (.append, _): expected = "a list of strings"
            case (.unset, _): expected = "true (the property is removed)"
            default: expected = nil
            }
            if let expected {
                throw TrackingError(
                    .invalidProfileUpdate, field: key,
                    "Property \(key) of \(operation) is \(value.kindName); \(operation) takes \(expected).")
            }
        }
    }
}

extension PropertyValue {
    /// The value's type in words, for messages (never the value itself).
    var kindName: String {
        switch self {
        case .string: "a string"
        case .int: "a whole number"
        case .double: "a number"
        case .bool(let b): b ? "true" : "false"
        case .list: "a list of strings"
        case .date: "a date"
        }
    }
}
