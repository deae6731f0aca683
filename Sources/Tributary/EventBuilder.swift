import Foundation
import TributaryStore

/// Turns a validated event into the Sensors Analytics JSON body, in two halves.
///
/// Everything but the identity is encoded before the write transaction (`prefix` and `suffix`); the
/// identity fields are spliced in inside it, so an event always carries the identity committed
/// before it, whichever process changed it.
struct PreparedEvent: Sendable {
    /// `{"type":"track","event":…,"time":…,`
    var prefix: [UInt8]
    /// `"_track_id":…,"event_id":…,"lib":{…},"properties":{…}}`
    var suffix: [UInt8]
    var eventID: String
    var trackID: Int64
    var wallTimeMillis: Int64
    var bootTimeNanos: UInt64
    /// The boot `bootTimeNanos` was read in (an event recorded for an earlier process may be older).
    var bootID: BootID = .current
    /// Which identity change the event records, if any (see ``IdentityEvent``).
    var identityEvent: IdentityEvent = .none

    /// The encoded bytes held for the event (what a queued event costs in memory, less its identity).
    var byteCount: Int { prefix.count + suffix.count }

    /// The full body with the identity spliced in: `identity` is the group's identity the event is
    /// stored under, `previous` the one before the change stored in the same transaction (the same
    /// identity when nothing changed).
    func body(with identity: Identity, previous: Identity) -> [UInt8] {
        let carried = identityEvent == .logout ? previous : identity  // a logout carries the login that ended
        var w = JSONWriter(capacity: prefix.count + suffix.count + 128)
        w.raw(prefix)
        w.key("distinct_id")
        w.string(carried.distinctID)
        w.raw(",")
        w.key("anonymous_id")
        w.string(carried.anonymousID)
        w.raw(",")
        if identityEvent == .signUp || identityEvent == .identify {
            w.key("original_id")
            w.string(previous.anonymousID)
            w.raw(",")
        }
        if let login = carried.loginID {
            w.key("login_id")
            w.string(login)
            w.raw(",")
        }
        w.raw(suffix)
        return w.bytes
    }

    func draft(with identity: Identity, previous: Identity? = nil) -> SharedStore.Draft {
        SharedStore.Draft(
            wallTimeMillis: wallTimeMillis, bootTimeNanos: bootTimeNanos, bootID: bootID,
            body: body(with: identity, previous: previous ?? identity))
    }
}

/// The identity changes an event records, in the order of the producer's other events, so that a
/// collector can replay who was who. Each is stored in the same transaction as the change itself.
enum IdentityEvent: Sendable {
    /// An ordinary event.
    case none
    /// `$SignUp` (`track_signup`, as the Sensors SDKs send it): carries the new login id, with
    /// `original_id`, the anonymous id the login is bound to.
    case signUp
    /// `$Logout`: carries the identity that ended (the login id logged out), the user's last act.
    case logout
    /// `$Identify`: carries the new anonymous id, with `original_id`, the anonymous id it replaces.
    case identify
}

/// The properties every event of a producer starts with (presets, then super properties), each
/// member encoded once.
struct BaseProperties: Sendable {
    var merged: [String: PropertyValue]
    /// Each base property's `"key":value` JSON, sorted by key (``JSONWriter/sortedMembers(_:)``).
    var members: [(key: String, json: [UInt8])]
    /// `$app_version`, also written into every event's `lib`.
    var appVersion: String?

    init(presets: [String: PropertyValue], superProperties: [String: PropertyValue]) {
        merged = presets.merging(superProperties) { _, new in new }
        if case .string(let version)? = merged["$app_version"] { appVersion = version }
        members = JSONWriter.sortedMembers(merged).map { key, value in
            var w = JSONWriter(capacity: key.utf8.count + 32)
            w.key(key)
            w.value(value)
            return (key, w.bytes)
        }
    }

    /// Encodes `{base…, properties…}` sorted by key; a property overrides a base property of the same
    /// key. `properties` must be sorted by key (``JSONWriter/sortedMembers(_:)``): both lists are
    /// merged in one pass, without hashing.
    func encode(sorted properties: [(key: String, value: PropertyValue)], into w: inout JSONWriter) {
        w.raw("{")
        var (b, p) = (0, 0)
        while b < members.count || p < properties.count {
            if b + p > 0 { w.raw(",") }
            let baseFirst = p == properties.count || (b < members.count && members[b].key < properties[p].key)
            if baseFirst {
                w.raw(members[b].json)
                b += 1
            } else {
                if b < members.count && members[b].key == properties[p].key { b += 1 }  // the event's own value wins
                w.key(properties[p].key)
                w.value(properties[p].value)
                p += 1
            }
        }
        w.raw("}")
    }
}

enum EventEncoder {
    static func prepare(
        event: String, type: StaticString = "track", properties: [(key: String, value: PropertyValue)],
        base: BaseProperties,
        libMethod: StaticString, wallTimeMillis: Int64, bootTimeNanos: UInt64, eventID: String? = nil
    ) -> PreparedEvent {
        var head = JSONWriter(capacity: 64 + event.utf8.count)
        head.raw("{\"type\":\"")
        head.raw(type)
        head.raw("\",\"event\":")
        head.string(event)
        head.raw(",\"time\":")
        head.int(wallTimeMillis)
        head.raw(",")

        let eventID = eventID ?? timeOrderedUUIDString(unixMillis: wallTimeMillis)
        let trackID = Int64(randomInteger(upTo: UInt64(Int32.max)))
        var tail = JSONWriter(capacity: 512)
        tail.raw("\"_track_id\":")
        tail.int(trackID)
        tail.raw(",\"event_id\":")
        tail.string(eventID)
        tail.raw(",\"lib\":{\"$lib\":")
        tail.string(PresetProperties.libName)
        tail.raw(",\"$lib_version\":")
        tail.string(PresetProperties.libVersion)
        tail.raw(",\"$lib_method\":\"")
        tail.raw(libMethod)
        tail.raw("\"")
        // The event's own `$app_version` (a crash reported by the next run: the crashed run's) wins here
        // too, as it does in `properties`.
        // `properties` is sorted by key: the scan ends at the first key not before it, for most events the first.
        var ownVersion: String?
        for property in properties {
            guard property.key <= "$app_version" else { break }
            if property.key == "$app_version", case .string(let version) = property.value { ownVersion = version }
        }
        if let version = ownVersion ?? base.appVersion {
            tail.raw(",\"$app_version\":")
            tail.string(version)
        }
        tail.raw("},\"properties\":")
        base.encode(sorted: properties, into: &tail)
        tail.raw("}")
        return PreparedEvent(
            prefix: head.bytes, suffix: tail.bytes, eventID: eventID, trackID: trackID, wallTimeMillis: wallTimeMillis,
            bootTimeNanos: bootTimeNanos)
    }
}
