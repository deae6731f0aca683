import Tributary

/// Maps a page event's JSON (`data` of an `app_h5_track` message) to a ``PageEvent``.
///
/// Kept: `type`, `event`, `time` (or `properties.$time` when it is a plausible time, as in the iOS
/// SDK), `lib`, `properties`. Removed: `server_url`, `_nocache`, `$project`, `$token` (at the top level
/// and among the properties) and `properties.$time`. The identity fields are checked by the bridge,
/// then replaced by the app's when the event is written.
public enum PageEventMapping {
    /// Keys a page event carries for the web SDK's own use; they never reach the store.
    public static let pageOnlyKeys: Set<String> = ["server_url", "_nocache", "$project", "$token"]
    /// The earliest `properties.$time` taken as the event time (2015-05-15, the iOS SDK's bound).
    public static let earliestCustomTime: Int64 = 1_431_656_640_000
    /// The latest event time a page may give: 9999-12-30 UTC, as for date properties
    /// (``EventRules/dateRange``; ``PageEvent/timeRange``).
    public static let latestTime = PageEvent.timeRange.upperBound

    /// Maps `data`; throws ``BridgeRejection`` (`invalidEvent` or `unsupportedType`) naming the field.
    public static func map(_ data: [String: JSON], origin: String) throws(BridgeRejection) -> PageEvent {
        func invalid(_ message: String) -> BridgeRejection { BridgeRejection(.invalidEvent, origin: origin, message) }
        let typeName = data["type"]?.string ?? ""
        let type = PageEvent.EventType(rawValue: typeName)
        guard type == .track || type == .signup else {
            throw BridgeRejection(
                .unsupportedType, origin: origin,
                "Event type \(typeName.prefix(40)) is not bridged; track, track_signup and the profile_* "
                    + "operations are.")
        }
        guard let event = data["event"]?.string else { throw invalid("The event has no string event name.") }
        guard let time = data["time"]?.number.flatMap(Self.millis), time > 0 else {
            throw invalid("The event has no numeric time from 1 through \(latestTime) (ms since the epoch).")
        }
        var properties: [String: PropertyValue] = [:]
        var customTime: Int64?
        if let given = data["properties"] {
            guard case .object(let members) = given else {
                throw invalid("properties is \(given.kindName), not an object.")
            }
            for (key, value) in members where !pageOnlyKeys.contains(key) {
                if key == "$time" {
                    if let t = value.number.flatMap(Self.millis), t >= earliestCustomTime { customTime = t }
                    continue
                }
                guard let converted = try propertyValue(value, key: key, origin: origin) else { continue }
                properties[key] = converted
            }
        }
        var lib: [String: PropertyValue] = [:]
        if let given = data["lib"] {
            guard case .object(let members) = given else { throw invalid("lib is \(given.kindName), not an object.") }
            for (key, value) in members {
                guard let converted = try propertyValue(value, key: "lib." + key, origin: origin) else { continue }
                lib[key] = converted
            }
        }
        do {
            try EventRules.validateEventName(event)
            try EventRules.validateProperties(properties)
            try EventRules.validateProperties(lib)
        } catch {
            throw invalid("\(error)")
        }
        return PageEvent(
            type: type, event: event, timeMillis: customTime ?? time, lib: lib, properties: properties)
    }

    /// A JavaScript time (ms since the epoch) as whole milliseconds; nil when it is not finite, before
    /// the epoch or after ``latestTime`` (a page's `1e19` must be refused, not trap converting to `Int64`).
    static func millis(_ number: Double) -> Int64? {
        guard number.isFinite, number >= 0, number <= Double(latestTime) else { return nil }
        return Int64(number.rounded(.down))
    }

    /// A JSON property value as an event property; nil for `null` (dropped, as the iOS SDK drops NSNull).
    static func propertyValue(_ value: JSON, key: String, origin: String) throws(BridgeRejection) -> PropertyValue? {
        switch value {
        case .null: return nil
        case .bool(let b): return .bool(b)
        case .string(let s): return .string(s)
        case .number(let n):
            if n == n.rounded(), abs(n) <= 9_007_199_254_740_992 { return .int(Int64(n)) }
            return .double(n)
        case .integer(let i): return .int(i)
        case .inexactInteger:
            // As the native `--properties` refuses it (`TrackingError` `inexactNumber`).
            throw BridgeRejection(
                .invalidEvent, origin: origin,
                "Property \(key) is a whole number beyond the 64-bit integers (±9223372036854775807) that a double "
                    + "would store with other digits; send it as a string, or as a double's digits (1.8e19).")
        case .array(let items):
            var strings: [String] = []
            for item in items {
                guard let s = item.string else {
                    throw BridgeRejection(
                        .invalidEvent, origin: origin, "Property \(key) is a list whose elements are not all strings.")
                }
                strings.append(s)
            }
            return .list(strings)
        case .object:
            throw BridgeRejection(
                .invalidEvent, origin: origin,
                "Property \(key) is an object; allowed are string, number, boolean and list of strings.")
        }
    }
}
