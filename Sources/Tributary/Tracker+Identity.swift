import Foundation
import TributaryStore

#if canImport(Glibc)
import Glibc
#endif

/// A calendar day in local time (`$is_first_day`).
struct LocalDay: Sendable, Hashable, CustomStringConvertible {
    var year: Int32
    var month: Int32
    var day: Int32

    /// The local day of a moment, ms since the epoch.
    init(unixMillis: Int64) {
        var seconds = time_t(unixMillis / 1000)
        var parts = tm()
        localtime_r(&seconds, &parts)
        year = parts.tm_year + 1900
        month = parts.tm_mon + 1
        day = parts.tm_mday
    }

    /// Parses `yyyy-MM-dd`.
    init?(_ text: String) {
        let fields = text.split(separator: "-").compactMap { Int32($0) }
        guard fields.count == 3 else { return nil }
        (year, month, day) = (fields[0], fields[1], fields[2])
    }

    var description: String {
        func two(_ v: Int32) -> String { v < 10 ? "0\(v)" : "\(v)" }
        return "\(year)-\(two(month))-\(two(day))"
    }
}

extension ConfigurationKey {
    /// The installation's first day, local time (`"yyyy-MM-dd"`): the day its first tracker opened the
    /// group. Every event tracked on that day carries `$is_first_day: true`.
    public static let firstDay = "app.first_day"
}

// MARK: Identity (shared by every process of the group)

extension Tracker {
    /// The first day of the group's installation, recorded by the first tracker of the group.
    static func firstDay(of store: SharedStore, today: LocalDay) throws -> LocalDay {
        func parse(_ json: String?) -> LocalDay? {
            guard let json, json.count > 2 else { return nil }
            return LocalDay(String(json.dropFirst().dropLast()))
        }
        if let recorded = parse(try store.configurationValue(ConfigurationKey.firstDay)) { return recorded }
        var chosen = today
        try store.updateConfiguration(ConfigurationKey.firstDay) { old in
            if let recorded = parse(old) {  // another process recorded it meanwhile
                chosen = recorded
                return old
            }
            return "\"\(today)\""
        }
        return chosen
    }

    /// The group's current identity.
    public func identity() throws -> Identity { try store.identity() }

    // Each identity change first waits until the events this process queued before it (`enqueue`,
    // `track` in flight) are committed, so that they carry the identity they were tracked under:
    // promise 3 keeps a producer's events in its order, and an identity change is part of that order.

    /// Logs the group in as `loginID`; later events of every process carry it. As the Sensors SDKs do,
    /// a login that changes the login id tracks `$SignUp` (type `track_signup`, with `original_id`, the
    /// anonymous id the login is bound to), stored in the same transaction as the login: both, or neither
    /// (the event refused, the group stays as it was). Logging in again as the current login id tracks
    /// nothing. Events this process queued before the call keep the identity they were tracked under
    /// (the call waits for them).
    ///
    /// - Throws: ``TrackingError`` for an invalid login id or a `properties` value that breaks the rules;
    ///   `StoreError` when the store cannot take the event. The login is not changed then.
    @discardableResult
    public func login(_ loginID: String, properties: [String: PropertyValue] = [:]) throws -> Identity {
        _ = try signUp(loginID, properties: properties)
        return try store.identity()
    }

    /// Logs the group in as ``login(_:properties:)`` does, and returns the receipt of its `$SignUp`;
    /// nil when the group was logged in as `loginID` already (nothing tracked).
    @discardableResult
    public func signUp(_ loginID: String, properties: [String: PropertyValue] = [:]) throws -> TrackReceipt? {
        try EventRules.validateID(loginID, what: "login id")
        committer.waitForQueued()
        guard try store.identity().loginID != loginID else { return nil }
        var signUp = try prepare("$SignUp", properties: properties, type: "track_signup")
        signUp.identityEvent = .signUp
        try checkSize(of: signUp, identityFields: 4, named: "Event $SignUp", field: "$SignUp")
        return try committer.appendAfterQueued(signUp) { $0.loginID = loginID }
    }

    /// Logs the group out; later events carry the anonymous id only. Tracks `$Logout` in the same
    /// transaction, carrying the login that ended, unless ``Configuration/tracksIdentityChanges`` is
    /// off; a group that is not logged in stays as it is and tracks nothing. Events this process
    /// queued before the call keep the login they were tracked under (the call waits for them).
    ///
    /// - Throws: `StoreError` when the store cannot take the change; the group stays logged in then.
    @discardableResult
    public func logout() throws -> Identity {
        _ = try signOut()
        return try store.identity()
    }

    /// Logs the group out as ``logout()`` does, and returns the receipt of its `$Logout`; nil when
    /// nothing was tracked (the group was not logged in, or identity changes are not tracked).
    @discardableResult
    public func signOut() throws -> TrackReceipt? {
        try trackIdentityChange("$Logout", .logout, identityFields: 3, unchanged: { $0.loginID == nil }) {
            $0.loginID = nil
        }
    }

    /// Replaces the anonymous id (for apps that bring their own). Tracks `$Identify` in the same
    /// transaction, carrying the new anonymous id with `original_id`, the one it replaces, unless
    /// ``Configuration/tracksIdentityChanges`` is off; the same id again tracks nothing. Events this
    /// process queued before the call keep the id they were tracked under (the call waits for them).
    ///
    /// - Throws: ``TrackingError`` for an invalid id; `StoreError` when the store cannot take the
    ///   change. The anonymous id is not changed then.
    @discardableResult
    public func identify(anonymousID: String) throws -> Identity {
        _ = try reidentify(anonymousID: anonymousID)
        return try store.identity()
    }

    /// Replaces the anonymous id as ``identify(anonymousID:)`` does, and returns the receipt of its
    /// `$Identify`; nil when nothing was tracked (the id was the group's already, or identity changes
    /// are not tracked).
    @discardableResult
    public func reidentify(anonymousID: String) throws -> TrackReceipt? {
        try EventRules.validateID(anonymousID, what: "anonymous id")
        return try trackIdentityChange(
            "$Identify", .identify, identityFields: 4, unchanged: { $0.anonymousID == anonymousID }
        ) {
            $0.anonymousID = anonymousID
        }
    }

    /// Makes `change` to the group's identity once the events this process queued are committed, and
    /// tracks `name` (recording `kind`) in the same transaction; nil when nothing was tracked: the
    /// identity is `unchanged` by it (nothing is written), or identity changes are not tracked (the
    /// change alone is written).
    private func trackIdentityChange(
        _ name: String, _ kind: IdentityEvent, identityFields: Int, unchanged: (Identity) -> Bool,
        change: @escaping (inout Identity) -> Void
    ) throws -> TrackReceipt? {
        committer.waitForQueued()
        guard configuration.tracksIdentityChanges else {
            _ = try store.updateIdentity(change)
            return nil
        }
        guard try !unchanged(store.identity()) else { return nil }
        var event = try prepare(name, properties: [:])
        event.identityEvent = kind
        try checkSize(of: event, identityFields: identityFields, named: "Event \(name)", field: name)
        return try committer.appendAfterQueued(event, changingIdentity: change)
    }
}
