import Foundation
import TributaryStore

/// An event a hybrid (H5) page handed to the native side, after the bridge verified it and removed
/// the page-only keys (`server_url`, `_nocache`, `$project`, `$token`).
///
/// The page's own `time`, `type`, event name and `lib` object are kept; its identity is not (the
/// app's is written instead) and its properties lose to the app's presets and super properties.
public struct PageEvent: Sendable, Equatable {
    /// The page event's `type`: ``PageEvent/track`` or ``PageEvent/signup``.
    public struct EventType: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
        public let rawValue: String
        public init(rawValue: String) { self.rawValue = rawValue }
        public var description: String { rawValue }

        /// `track`: an ordinary event.
        public static let track = EventType(rawValue: "track")
        /// `track_signup`: the page logged a user in.
        public static let signup = EventType(rawValue: "track_signup")
    }

    /// `track` or `track_signup`.
    public var type: EventType
    /// The event name (`$pageview`, `$WebClick`, or a custom name).
    public var event: String
    /// When the page triggered the event, in ms since the Unix epoch (the page's `time`); within
    /// ``PageEvent/timeRange``.
    public var timeMillis: Int64
    /// The page SDK's `lib` object (`$lib`, `$lib_method`, `$lib_version`, …).
    public var lib: [String: PropertyValue]
    /// The page's properties, page-only keys already removed.
    public var properties: [String: PropertyValue]

    /// The times a page event may have, in ms since the Unix epoch: from 1 through 9999-12-30 UTC (the
    /// last day date properties may have, ``EventRules/dateRange``). The hybrid bridge refuses a page's
    /// `time` outside it, and ``Tracker/trackFromPage(_:)`` a ``PageEvent`` whose ``timeMillis`` is.
    public static let timeRange: ClosedRange<Int64> = 1...Int64(EventRules.dateRange.upperBound * 1000)

    /// Creates a page event.
    public init(
        type: EventType, event: String, timeMillis: Int64, lib: [String: PropertyValue],
        properties: [String: PropertyValue]
    ) {
        self.type = type
        self.event = event
        self.timeMillis = timeMillis
        self.lib = lib
        self.properties = properties
    }
}

extension Tracker {
    /// Records an event a hybrid page handed over, enriched as `docs/hybrid-bridge.md` describes.
    ///
    /// The app's identity is spliced in inside the write transaction (as for every event). The
    /// properties are the page's, overridden by the app's preset properties (those the main app
    /// published to the group, else this producer's own), this launch's properties and this
    /// process's super properties; `$app_version` is the app's; the event gets a new `event_id` and
    /// `_track_id`, and `_hybrid_h5: true` at its top level (where the Sensors SDKs put it). The page's
    /// `time`, `type`, name and `lib` are kept.
    /// A `track_signup` does not log in by itself: ``signUpFromPage(_:loginID:)`` does both.
    ///
    /// - Throws: ``TrackingError`` when the name or a property breaks the rules, the time is outside
    ///   ``PageEvent/timeRange`` or the event is too large; `StoreError` when the store cannot take it.
    ///   Nothing is written then.
    @discardableResult
    public func trackFromPage(_ page: PageEvent) async throws -> TrackReceipt {
        try Self.requireType(page, .track, "a track_signup goes through signUpFromPage(_:loginID:), which logs in too")
        return try await committer.commit(try preparePage(page))
    }

    /// Stores a page's sign-up (`track_signup`): logs the group in as `loginID` and stores the event,
    /// which carries that login, in one transaction, after the events this process queued before.
    /// If the event is refused (invalid, the store full), the login is not changed either.
    public func signUpFromPage(_ page: PageEvent, loginID: String) throws -> TrackReceipt {
        try Self.requireType(page, .signup, "signUpFromPage(_:loginID:) stores the page's sign-up event")
        try EventRules.validateID(loginID, what: "login id")
        let prepared = try preparePage(page)
        return try committer.appendAfterQueued(prepared) { $0.loginID = loginID }
    }

    /// The app's preset properties: those the main app published to the group, else this producer's.
    public func appPresetProperties() -> [String: PropertyValue] {
        guard let text = try? store.configuration()[ConfigurationKey.appPresets],
            // Written by publishAppPresets from a dictionary: no key in it twice, for every page event.
            let published = try? PropertyValue.properties(fromJSON: text, checkingDuplicateKeys: false), !published.isEmpty
        else { return presets }
        return published
    }

    /// Throws ``TrackingError/Code/invalidValueType`` unless `page` is of type `expected`: a type the
    /// collector does not know was stored and dead-lettered there, and a sign-up through the wrong call
    /// logged in without its event, or stored one without the login.
    private static func requireType(_ page: PageEvent, _ expected: PageEvent.EventType, _ hint: String) throws {
        guard page.type != expected else { return }
        throw TrackingError(
            .invalidValueType, field: "type",
            "Page event \(page.event) has type '\(page.type)' here; expected '\(expected)' (\(hint)).")
    }

    func preparePage(_ page: PageEvent) throws -> PreparedEvent {
        try EventRules.validateEventName(page.event)
        try Self.checkPageTime(page.timeMillis, of: "Page event \(page.event)")
        try EventRules.validateProperties(page.properties)
        try EventRules.validateProperties(page.lib)
        // The page keeps its own $lib and $lib_version (as in the iOS SDK); every other preset is the app's.
        let app = appPresetProperties().filter { $0.key != "$lib" && $0.key != "$lib_version" }
        var properties = page.properties
        properties.merge(app) { _, app in app }
        properties.merge(launchProperties) { _, launch in launch }
        properties.merge(superProperties) { _, custom in custom }
        let dynamic = hooks.dynamicProperties()
        try EventRules.validateProperties(dynamic)
        properties.merge(dynamic) { _, computed in computed }
        let appVersion = app["$app_version"] ?? presets["$app_version"] ?? .string(configuration.appVersion)
        properties["$app_version"] = appVersion
        // The mark goes at the event's top level, as sa-sdk-ios and sa-sdk-android put it (a Sensors
        // server reads it there); a page's own property of that name would only confuse a reader.
        properties["_hybrid_h5"] = nil
        properties["$is_first_day"] = .bool(LocalDay(unixMillis: page.timeMillis) == firstDay)
        var lib = page.lib
        lib["$app_version"] = appVersion

        var head = JSONWriter(capacity: 64 + page.event.utf8.count)
        head.raw("{\"type\":")
        head.string(page.type.rawValue)
        head.raw(",\"event\":")
        head.string(page.event)
        head.raw(",\"time\":")
        head.int(page.timeMillis)
        head.raw(",")

        let eventID = timeOrderedUUIDString(unixMillis: configuration.wallMillis())
        let trackID = Int64(randomInteger(upTo: UInt64(Int32.max)))
        var tail = JSONWriter(capacity: 512)
        tail.raw("\"_track_id\":")
        tail.int(trackID)
        tail.raw(",\"event_id\":")
        tail.string(eventID)
        tail.raw(",\"_hybrid_h5\":true,\"lib\":{")
        var first = true
        tail.members(lib, first: &first)
        tail.raw("},\"properties\":{")
        first = true
        tail.members(properties, first: &first)
        tail.raw("}}")

        var prepared = PreparedEvent(
            prefix: head.bytes, suffix: tail.bytes, eventID: eventID, trackID: trackID, wallTimeMillis: page.timeMillis,
            bootTimeNanos: 0, bootID: .unknown)
        prepared.identityEvent = page.type == .signup ? .signUp : .none
        stampPageMoment(&prepared)
        try checkSize(of: prepared, identityFields: 4, named: "Page event \(page.event)", field: page.event)
        return prepared
    }

    /// Throws ``TrackingError/Code/timeOutOfRange`` unless a page's `millis` is within
    /// ``PageEvent/timeRange``; `what` names the record (`Page event H5View`).
    static func checkPageTime(_ millis: Int64, of what: String) throws {
        guard !PageEvent.timeRange.contains(millis) else { return }
        throw TrackingError(
            .timeOutOfRange, field: "time",
            "\(what) has time \(millis) ms since the epoch; a page event's time must be "
                + "from \(PageEvent.timeRange.lowerBound) through \(PageEvent.timeRange.upperBound) (9999-12-30 UTC).")
    }

    /// Sets the record header's trigger moment of a page record whose wall time is the page's: the
    /// monotonic reading that corresponds to it (now, less the record's age). A page time before this
    /// boot (a backfilled `$time`) or after now has no such reading: it is recorded with the unknown boot
    /// id, which the agent never takes for this boot, so it sends the page's time as given instead of
    /// "correcting" it from a made-up reading.
    func stampPageMoment(_ prepared: inout PreparedEvent) {
        prepared.bootTimeNanos = 0
        prepared.bootID = .unknown
        let (ageMillis, ageOverflow) = configuration.wallMillis().subtractingReportingOverflow(prepared.wallTimeMillis)
        let now = configuration.monotonicNanos()
        if !ageOverflow, ageMillis >= 0 {
            let (ageNanos, overflow) = UInt64(ageMillis).multipliedReportingOverflow(by: 1_000_000)
            if !overflow, ageNanos <= now {
                prepared.bootTimeNanos = now - ageNanos
                prepared.bootID = .current
            }
        }
    }
}
