import TributaryStore

/// A profile operation a hybrid page handed over, after the bridge verified it.
public struct PageProfile: Sendable, Equatable {
    /// The operation (the page record's `type`).
    public var operation: ProfileOperation
    /// When the page made it, in ms since the Unix epoch; within ``PageEvent/timeRange``.
    public var timeMillis: Int64
    /// The page SDK's `lib` object.
    public var lib: [String: PropertyValue]
    /// The profile properties, page-only keys already removed.
    public var properties: [String: PropertyValue]

    /// Creates a page profile operation.
    public init(
        operation: ProfileOperation, timeMillis: Int64, lib: [String: PropertyValue], properties: [String: PropertyValue]
    ) {
        self.operation = operation
        self.timeMillis = timeMillis
        self.lib = lib
        self.properties = properties
    }
}

// User profiles: records of type `profile_*` that go through the store, the agent and the wire exactly
// as events do (same order, retry and dedup: each has its own `event_id`), for the user the group's
// identity names when the record is stored.
extension Tracker {
    /// Sets each property of the user's profile (`profile_set`); returns once it is durably stored.
    @discardableResult
    public func profileSet(_ properties: [String: PropertyValue]) async throws -> TrackReceipt {
        try await profile(.set, properties: properties)
    }

    /// Sets each property the user's profile does not have yet (`profile_set_once`).
    @discardableResult
    public func profileSetOnce(_ properties: [String: PropertyValue]) async throws -> TrackReceipt {
        try await profile(.setOnce, properties: properties)
    }

    /// Adds numbers to profile properties (`profile_increment`); a value that is not a number is a
    /// ``TrackingError`` `invalidProfileUpdate`.
    @discardableResult
    public func profileIncrement(_ properties: [String: PropertyValue]) async throws -> TrackReceipt {
        try await profile(.increment, properties: properties)
    }

    /// Appends strings to list properties of the profile (`profile_append`); a value that is not a list
    /// of strings is a ``TrackingError`` `invalidProfileUpdate`.
    @discardableResult
    public func profileAppend(_ properties: [String: PropertyValue]) async throws -> TrackReceipt {
        try await profile(.append, properties: properties)
    }

    /// Removes properties from the user's profile (`profile_unset`).
    @discardableResult
    public func profileUnset(_ names: [String]) async throws -> TrackReceipt {
        try await profile(.unset, properties: Dictionary(names.map { ($0, .bool(true)) }) { first, _ in first })
    }

    /// Deletes the user's whole profile (`profile_delete`).
    @discardableResult
    public func profileDelete() async throws -> TrackReceipt {
        try await profile(.delete, properties: [:])
    }

    /// Records a profile operation and resumes once it is durably committed (group commit, as `track`).
    ///
    /// - Throws: ``TrackingError`` when a property breaks the event rules or the operation's
    ///   (``ProfileRules``); `StoreError` when the store cannot take it. Nothing is written then.
    @discardableResult
    public func profile(_ operation: ProfileOperation, properties: [String: PropertyValue]) async throws -> TrackReceipt {
        try await committer.commit(try prepareProfile(operation, properties: properties))
    }

    /// Records a profile operation and returns once it is durably committed, after every event this
    /// tracker queued before the call.
    @discardableResult
    public func profile(_ operation: ProfileOperation, properties: [String: PropertyValue]) throws -> TrackReceipt {
        try committer.appendAfterQueued(try prepareProfile(operation, properties: properties))
    }

    /// Records a profile operation a hybrid page handed over: the page's time and `lib` are kept, its
    /// properties are the profile's (no presets are added: they describe the device, not the user),
    /// the identity is the app's, and the record gets `_hybrid_h5: true` at its top level.
    @discardableResult
    public func profileFromPage(_ page: PageProfile) async throws -> TrackReceipt {
        try Self.checkPageTime(page.timeMillis, of: "Page \(page.operation)")
        try EventRules.validateProperties(page.lib)
        var lib = page.lib
        lib["$app_version"] = appPresetProperties()["$app_version"] ?? .string(configuration.appVersion)
        let prepared = try prepareProfile(
            page.operation, properties: page.properties, timeMillis: page.timeMillis, lib: lib, fromPage: true)
        return try await committer.commit(prepared)
    }

    /// Validates and encodes a profile record: `{"type":"profile_…","time":…,` then, after the identity
    /// spliced in at commit, `"_track_id":…,"event_id":…,"lib":{…},"properties":{…}}`.
    func prepareProfile(
        _ operation: ProfileOperation, properties: [String: PropertyValue], timeMillis: Int64? = nil,
        lib: [String: PropertyValue]? = nil, fromPage: Bool = false
    ) throws -> PreparedEvent {
        try ProfileRules.validate(operation, properties)
        let wallTimeMillis = timeMillis ?? configuration.wallMillis()
        var head = JSONWriter(capacity: 64)
        head.raw("{\"type\":")
        head.string(operation.rawValue)
        head.raw(",\"time\":")
        head.int(wallTimeMillis)
        head.raw(",")

        let eventID = timeOrderedUUIDString(unixMillis: configuration.wallMillis())
        let trackID = Int64(randomInteger(upTo: UInt64(Int32.max)))
        var tail = JSONWriter(capacity: 256)
        tail.raw("\"_track_id\":")
        tail.int(trackID)
        tail.raw(",\"event_id\":")
        tail.string(eventID)
        if fromPage { tail.raw(",\"_hybrid_h5\":true") }
        tail.raw(",\"lib\":{")
        var first = true
        let appVersion = presets["$app_version"] ?? .string(configuration.appVersion)
        tail.members(
            lib ?? [
                "$lib": .string(PresetProperties.libName), "$lib_version": .string(PresetProperties.libVersion),
                "$lib_method": "code", "$app_version": appVersion,
            ], first: &first)
        tail.raw("},\"properties\":{")
        first = true
        tail.members(properties, first: &first)
        tail.raw("}}")
        var prepared = PreparedEvent(
            prefix: head.bytes, suffix: tail.bytes, eventID: eventID, trackID: trackID, wallTimeMillis: wallTimeMillis,
            bootTimeNanos: configuration.monotonicNanos())
        // A page's time may be before this boot or ahead: recorded as a page event's is (Tracker+Bridge.swift).
        if fromPage { stampPageMoment(&prepared) }
        try checkSize(of: prepared, identityFields: 3, named: "Profile \(operation)", field: operation.rawValue)
        return prepared
    }
}
