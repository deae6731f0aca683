import Tributary

/// Maps a page's profile record (`data` of an `app_h5_track` message whose `type` is `profile_set`,
/// `profile_set_once`, `profile_increment`, `profile_append`, `profile_unset` or `profile_delete`, as
/// the Sensors JavaScript SDK sends them through the app) to a ``PageProfile``.
///
/// Kept: `type`, `time`, `lib`, `properties` less the page-only keys (`$project`, `$token`, …) and
/// `$is_login_id` (the app's identity decides who the user is). The properties follow the event rules
/// and the operation's (``ProfileRules``).
public enum PageProfileMapping {
    /// Profile properties a page SDK adds for its own use; they never reach the store.
    public static let droppedKeys: Set<String> = PageEventMapping.pageOnlyKeys.union(["$is_login_id", "$time"])

    /// Maps `data` of a profile record; throws ``BridgeRejection`` `invalidEvent` naming the field.
    public static func map(
        _ data: [String: JSON], operation: ProfileOperation, origin: String
    ) throws(BridgeRejection) -> PageProfile {
        func invalid(_ message: String) -> BridgeRejection { BridgeRejection(.invalidEvent, origin: origin, message) }
        guard let time = data["time"]?.number.flatMap(PageEventMapping.millis), time > 0 else {
            throw invalid("The \(operation) record has no numeric time from 1 through \(PageEventMapping.latestTime).")
        }
        var properties: [String: PropertyValue] = [:]
        if let given = data["properties"] {
            guard case .object(let members) = given else { throw invalid("properties is \(given.kindName), not an object.") }
            for (key, value) in members where !droppedKeys.contains(key) {
                guard let converted = try PageEventMapping.propertyValue(value, key: key, origin: origin) else { continue }
                properties[key] = converted
            }
        }
        var lib: [String: PropertyValue] = [:]
        if let given = data["lib"] {
            guard case .object(let members) = given else { throw invalid("lib is \(given.kindName), not an object.") }
            for (key, value) in members {
                guard let converted = try PageEventMapping.propertyValue(value, key: "lib." + key, origin: origin)
                else { continue }
                lib[key] = converted
            }
        }
        do {
            try ProfileRules.validate(operation, properties)
            try EventRules.validateProperties(lib)
        } catch {
            throw invalid("\(error)")
        }
        return PageProfile(operation: operation, timeMillis: time, lib: lib, properties: properties)
    }
}
