import GRDB
import TributaryJSON

/// A profile record of an ingest batch (`type` `profile_set`, …), checked and read: what it does to
/// which user's profile.
struct ProfileUpdate: Sendable {
    /// The operations the collector applies, by record `type`.
    enum Operation: String, Sendable, CaseIterable {
        case set = "profile_set"
        case setOnce = "profile_set_once"
        case increment = "profile_increment"
        case append = "profile_append"
        case unset = "profile_unset"
        case delete = "profile_delete"

        /// The key of this operation's row in the `counters` table.
        var counterName: String { "profile." + rawValue }
    }

    var operation: Operation
    /// The user whose profile it changes.
    var distinctID: String
    var properties: [String: JSONValue]

    /// Reads and checks a profile record (its JSON text); throws naming the field and the rule.
    ///
    /// It needs a non-empty string `distinct_id` and an object `properties` (`profile_delete`: may be
    /// absent); `profile_increment` values are numbers, `profile_append` values lists of strings.
    static func read(
        _ text: UnsafeBufferPointer<UInt8>, type: String, _ invalid: (String, String) -> InvalidEvent
    ) throws(InvalidEvent) -> ProfileUpdate {
        guard let operation = Operation(rawValue: type) else {
            throw invalid(
                "type", "is not a profile operation the collector knows (\(Operation.allCases.map(\.rawValue).joined(separator: ", ")))")
        }
        guard let record = JSONValue.parse(text)?.object else { throw invalid("type", "record is not a JSON object") }
        guard let distinctID = record["distinct_id"]?.string, !distinctID.isEmpty else {
            throw invalid("distinct_id", "is missing or not a non-empty string (required for a profile record)")
        }
        if distinctID.unicodeScalars.contains(where: { $0 == "\u{0}" || $0 == "\u{FEFF}" }) {
            throw invalid("distinct_id", "contains U+0000 or U+FEFF, which the collector cannot index")
        }
        let properties: [String: JSONValue]
        switch record["properties"] {
        case nil where operation == .delete: properties = [:]
        case .object(let members)?: properties = members
        default: throw invalid("properties", "is missing or not an object (required for type \"\(type)\")")
        }
        for (key, value) in properties.sorted(by: { $0.key < $1.key }) {
            switch (operation, value) {
            case (.increment, .integer), (.increment, .number): continue
            case (.increment, _): throw invalid("properties.\(key)", "is \(value.kindName); profile_increment takes numbers")
            case (.append, .array(let items)) where items.allSatisfy({ $0.string != nil }): continue
            case (.append, _):
                throw invalid("properties.\(key)", "is \(value.kindName); profile_append takes lists of strings")
            default: continue
            }
        }
        return ProfileUpdate(operation: operation, distinctID: distinctID, properties: properties)
    }
}

/// The collector's user profiles: one row per user (`distinct_id`) with its properties as a JSON
/// object, changed by each unique profile record in arrival order, in the batch's transaction.
enum ProfileTable {
    static let schema = """
        -- One row per user with a profile; properties is a JSON object (keys sorted).
        CREATE TABLE profiles (distinct_id TEXT PRIMARY KEY, properties TEXT NOT NULL, records INTEGER NOT NULL);
        """

    /// Applies `update` to its user's profile.
    ///
    /// `profile_set` replaces each value; `profile_set_once` sets only properties the profile lacks;
    /// `profile_increment` adds to a number (a missing or non-number property counts from 0; whole
    /// numbers stay whole); `profile_append` appends to a list (a missing or non-list property starts
    /// empty); `profile_unset` removes the properties named; `profile_delete` removes the profile.
    static func apply(_ update: ProfileUpdate, in db: Database) throws {
        if update.operation == .delete {
            try db.execute(sql: "DELETE FROM profiles WHERE distinct_id = ?", arguments: [update.distinctID])
            return
        }
        let row = try Row.fetchOne(
            db, sql: "SELECT properties, records FROM profiles WHERE distinct_id = ?", arguments: [update.distinctID])
        var profile = (row?["properties"] as String?).flatMap { JSONValue.parse($0.utf8)?.object } ?? [:]
        for (key, value) in update.properties {
            switch update.operation {
            case .set: profile[key] = value
            case .setOnce: if profile[key] == nil { profile[key] = value }
            case .increment: profile[key] = sum(profile[key], value)
            case .append:
                var list: [JSONValue] = []
                if case .array(let items)? = profile[key] { list = items }
                if case .array(let items) = value { list += items }
                profile[key] = .array(list)
            case .unset: profile[key] = nil
            case .delete: break
            }
        }
        try db.execute(
            sql: """
                INSERT INTO profiles (distinct_id, properties, records) VALUES (?, ?, 1)
                ON CONFLICT (distinct_id) DO UPDATE SET properties = excluded.properties, records = records + 1
                """,
            arguments: [update.distinctID, JSONValue.object(profile).text])
    }

    /// `current + increment`: whole numbers stay whole while the sum fits, anything else is a double.
    private static func sum(_ current: JSONValue?, _ increment: JSONValue) -> JSONValue {
        switch (current, increment) {
        case (.integer(let a)?, .integer(let b)):
            let (total, overflow) = a.addingReportingOverflow(b)
            return overflow ? .number(Double(a) + Double(b)) : .integer(total)
        case (nil, _), (.null?, _), (.string?, _), (.bool?, _), (.array?, _), (.object?, _): return increment
        default: return .number((current?.number ?? 0) + (increment.number ?? 0))
        }
    }

    /// Users with a profile.
    static func count(in db: Database) throws -> Int {
        try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM profiles") ?? 0
    }

    /// A user's profile as `{"distinct_id":…,"properties":{…}}`, or nil when the user has none.
    static func profileJSON(of distinctID: String, in db: Database) throws -> String? {
        guard let properties = try String.fetchOne(
            db, sql: "SELECT properties FROM profiles WHERE distinct_id = ?", arguments: [distinctID])
        else { return nil }
        return "{\"distinct_id\":" + JSONValue.string(distinctID).text + ",\"properties\":" + properties + "}"
    }
}
