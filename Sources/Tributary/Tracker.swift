import Foundation
import Synchronization
import TributaryStore

/// What `track` returns once the event is durable in the shared store.
public struct TrackReceipt: Sendable, Hashable {
    /// The event's unique id (`event_id`), stable all the way to the collector.
    public var eventID: String
    /// The event's `_track_id`.
    public var trackID: Int64
    /// The global sequence number the store assigned.
    public var seq: UInt64
    /// This producer's own sequence number for the event.
    public var producerSeq: UInt64
    /// The `distinct_id` the event carries: the group's identity when it was stored (a login id, or
    /// the anonymous id), which it keeps all the way to the collector.
    public var distinctID: String

    init(event: PreparedEvent, appended: SharedStore.Appended) {
        eventID = event.eventID
        trackID = event.trackID
        seq = appended.seq
        producerSeq = appended.producerSeq
        distinctID = appended.distinctID
    }
}

/// The producer library: records events from one process into its app group's shared store.
///
/// Every producer process (main app, extension, hybrid bridge) creates one `Tracker` for its group.
/// `track` returns only after the event is durably committed; identity is shared by every process of
/// the group through the store.
///
/// ```swift
/// let tracker = try Tracker(configuration: .init(groupDirectory: "/var/lib/myapp/group"))
/// let receipt = try await tracker.track("BuyProduct", properties: ["price": 9.99, "sku": "A-1"])
/// ```
public final class Tracker: Sendable {
    /// How a tracker is set up.
    public struct Configuration: Sendable {
        /// The app group directory holding the shared store.
        public var groupDirectory: String
        /// Which kind of process this is. Default `.app`.
        public var producerKind: ProducerKind = .app
        /// A stable id for this producer. Default: the kind's name (`app`, `extension`, `hybrid`).
        public var producerID: String?
        /// The app's version, sent as `$app_version`. Default `"0.0.0"`.
        public var appVersion: String = "0.0.0"
        /// Largest encoded event, in bytes. Default 256 KiB.
        public var maxEventBytes: Int = 256 << 10
        /// Most events one group commit writes in a transaction. Default 1,000.
        public var maxGroupCommit: Int = 1000
        /// Most events waiting for a group commit; `enqueue` suspends while that many wait. Default
        /// 10,000 (a few MiB of typical events), never less than `maxGroupCommit`.
        public var maxQueuedEvents: Int = 10_000
        /// Most encoded bytes of the events waiting for a group commit; `enqueue` suspends while the
        /// queued events hold that many (the last one admitted may take them past it by its size).
        /// Default 32 MiB: 10,000 events of 256 KiB would otherwise hold 2.5 GiB.
        public var maxQueuedBytes: Int = 32 << 20
        /// Whether an `.app` tracker publishes its preset properties to the group, where the agent
        /// adds them to extension events and the bridge to page events. Default true: the app knows its
        /// version. A short-lived tool that tracks as the app without knowing it (the `tributary` CLI
        /// without `--app-version`) turns it off, leaving what the app published as it is.
        public var publishesAppPresets = true
        /// Whether ``Tracker/logout()`` and ``Tracker/identify(anonymousID:)`` track `$Logout` and
        /// `$Identify`, so that a collector can replay who was who (``Tracker/login(_:properties:)``
        /// always tracks `$SignUp`, as the Sensors SDKs do). Default true. The Sensors SDKs track no
        /// event for these two: turn it off for a collector that refuses `$` events it does not know.
        public var tracksIdentityChanges = true
        /// How the store is opened (quota, durability).
        public var store = SharedStore.Options()
        /// The monotonic clock for timers, in ns. Default `CLOCK_BOOTTIME`; tests pass a manual clock.
        public var monotonicNanos: @Sendable () -> UInt64 = BootClock.nowNanos
        /// The wall clock for event times, in ms. Default `CLOCK_REALTIME`.
        public var wallMillis: @Sendable () -> Int64 = BootClock.wallMillis

        /// A configuration for the group at `groupDirectory`, with defaults for everything else.
        public init(groupDirectory: String, producerKind: ProducerKind = .app, producerID: String? = nil) {
            self.groupDirectory = groupDirectory
            self.producerKind = producerKind
            self.producerID = producerID
        }
    }

    private struct State {
        var superProperties: [String: PropertyValue] = [:]
        var base: BaseProperties
        var timers: [String: EventTimer] = [:]
        /// How many times ``Tracker/clearTrackTimers()`` ran: a refused `trackTimerEnd` puts its timer
        /// back only if no clear came meanwhile.
        var timerClears = 0
        var inBackground = false
        /// Properties of this launch (`$latest_utm_*` after a deep link); see `DeepLink.swift`.
        var launchProperties: [String: PropertyValue] = [:]
        /// The store seq of the launch event whose link set `launchProperties` (0: none yet).
        var launchPropertiesSeq: UInt64 = 0

        /// Re-encodes the base properties: presets, then this launch's properties, then super properties.
        mutating func rebase(presets: [String: PropertyValue]) {
            base = BaseProperties(
                presets: presets.merging(launchProperties) { _, launch in launch }, superProperties: superProperties)
        }
    }

    /// The shared store this tracker writes to.
    public let store: SharedStore
    /// The producer identity written into every record.
    public let producer: SharedStore.Producer
    package let configuration: Configuration
    let presets: [String: PropertyValue]
    private let state: Mutex<State>
    let committer: GroupCommitter
    /// The first day of the installation, local time (`$is_first_day`); see Tracker+Identity.swift.
    let firstDay: LocalDay
    /// Per-event hooks (dynamic super properties); see Tracker+Hooks.swift.
    let hooks = TrackerHooks()

    /// Opens the group's store and registers this producer.
    public init(configuration: Configuration) throws {
        let producerID = configuration.producerID ?? configuration.producerKind.description
        try EventRules.validateID(producerID, what: "producer id")
        for (name, value) in [
            ("maxEventBytes", configuration.maxEventBytes), ("maxGroupCommit", configuration.maxGroupCommit),
            ("maxQueuedEvents", configuration.maxQueuedEvents), ("maxQueuedBytes", configuration.maxQueuedBytes),
        ] where value < 1 {
            throw TrackingError(.invalidConfiguration, field: name, "Tracker.Configuration.\(name) must be at least 1, not \(value).")
        }
        // Every event of this producer carries it, and an app's is published for its extensions' events:
        // refused here, before anything is written (an empty or 9,000-byte version went out as it was).
        do {
            try EventRules.validateID(configuration.appVersion, what: "app version")
        } catch let error as TrackingError {
            throw TrackingError(.invalidConfiguration, field: "appVersion", "Tracker.Configuration.appVersion: \(error.message)")
        }
        self.configuration = configuration
        store = try SharedStore(groupDirectory: configuration.groupDirectory, options: configuration.store)
        producer = SharedStore.Producer(kind: configuration.producerKind, id: producerID)
        let identity = try store.identity()
        presets = PresetProperties.current(appVersion: configuration.appVersion, deviceID: identity.deviceID)
        firstDay = try Self.firstDay(of: store, today: LocalDay(unixMillis: configuration.wallMillis()))
        state = Mutex(State(base: BaseProperties(presets: presets, superProperties: [:])))
        committer = GroupCommitter(
            store: store, producer: producer, maxBatch: configuration.maxGroupCommit,
            maxQueued: configuration.maxQueuedEvents, maxQueuedBytes: configuration.maxQueuedBytes)
        if configuration.producerKind == .app && configuration.publishesAppPresets { try publishAppPresets() }
    }

    private func publishAppPresets() throws {
        var w = JSONWriter()
        var first = true
        w.raw("{")
        w.members(presets, first: &first)
        w.raw("}")
        let json = String(decoding: w.bytes, as: UTF8.self)
        if try store.configuration()[ConfigurationKey.appPresets] != json {
            try store.setConfiguration(ConfigurationKey.appPresets, json: json)
        }
    }

    /// Asks the group's agent to upload now (call it when the app enters the background).
    ///
    /// Returns false when no agent is running (or this user may not write to its socket); the events
    /// stay safely in the store either way. Never blocks, whatever the agent does: an agent that has not
    /// yet read the requests before this one (busy, or stopped) flushes when it reads them.
    @discardableResult
    public func flush() -> Bool {
        AgentChannel.requestFlush(groupDirectory: store.groupDirectory)
    }

    // MARK: Tracking

    /// Records an event and returns once it is durably committed (one write transaction per call),
    /// after every event this tracker queued before the call (``enqueue(_:properties:)``, the async
    /// `track`): events keep the order they were tracked in.
    @discardableResult
    public func track(_ event: String, properties: [String: PropertyValue] = [:]) throws -> TrackReceipt {
        try committer.appendAfterQueued(try prepare(event, properties: properties))
    }

    /// Records an event and resumes once it is durably committed. Concurrent callers share one write
    /// transaction (group commit); each resumes only after the transaction holding its event is durable.
    @discardableResult
    public func track(_ event: String, properties: [String: PropertyValue] = [:]) async throws -> TrackReceipt {
        let prepared = try prepare(event, properties: properties)
        return try await committer.commit(prepared)
    }

    /// Queues an event for the next group commit and returns without waiting for it to be durable;
    /// `receipt()` on the result resumes once it is. Suspends only while the queue is full
    /// (`maxQueuedEvents` events, or `maxQueuedBytes` of them).
    ///
    /// For callers that track faster than one commit per event allows: keep a window of pending
    /// events and await the oldest, and every transaction carries many events at the cost of one
    /// fsync. An event is safe only once its receipt arrived; if the process dies before that, it is
    /// lost, like an event whose `track` call had not returned. Events of one caller are stored in the
    /// order they were queued. Validation errors are thrown here, at once.
    ///
    /// ```swift
    /// var window: [PendingTrack] = []
    /// for item in items {
    ///     window.append(try await tracker.enqueue("ItemViewed", properties: ["id": .string(item.id)]))
    ///     if window.count == 128 { _ = try await window.removeFirst().receipt() }
    /// }
    /// for pending in window { _ = try await pending.receipt() }
    /// ```
    public func enqueue(_ event: String, properties: [String: PropertyValue] = [:]) async throws -> PendingTrack {
        let prepared = try prepare(event, properties: properties)
        return await committer.enqueue(prepared)
    }

    /// `withoutLaunchPrefix`: this launch's properties with that prefix are left out of this event.
    /// `type` is the body's `type` (`track`, or `track_signup` for a sign-up).
    func prepare(
        _ event: String, properties: [String: PropertyValue], libMethod: StaticString = "code",
        moment: EventMoment? = nil, withoutLaunchPrefix: String? = nil, type: StaticString = "track"
    ) throws -> PreparedEvent {
        try EventRules.validateEventName(event)
        let wallTimeMillis = moment?.wallTimeMillis ?? configuration.wallMillis()
        var own = hooks.withDynamicProperties(properties)
        if own["$is_first_day"] == nil {
            own["$is_first_day"] = .bool(LocalDay(unixMillis: wallTimeMillis) == firstDay)
        }
        let sorted = JSONWriter.sortedMembers(own)
        for (key, value) in sorted { try EventRules.validateProperty(key, value) }
        let base = state.withLock { state in
            guard let prefix = withoutLaunchPrefix, state.launchProperties.keys.contains(where: { $0.hasPrefix(prefix) })
            else { return state.base }
            var without = state
            without.launchProperties = state.launchProperties.filter { !$0.key.hasPrefix(prefix) }
            without.rebase(presets: presets)
            return without.base
        }
        var prepared = EventEncoder.prepare(
            event: event, type: type, properties: sorted, base: base, libMethod: libMethod,
            wallTimeMillis: wallTimeMillis,
            bootTimeNanos: moment?.bootTimeNanos ?? configuration.monotonicNanos(), eventID: moment?.eventID)
        if let bootID = moment?.bootID { prepared.bootID = bootID }
        try checkSize(of: prepared, identityFields: 3, named: "Event \(event)", field: event)
        return prepared
    }

    /// Throws ``TrackingError/Code/eventTooLarge`` unless `prepared`, with `identityFields` identity
    /// fields of the longest ids added when it is committed, fits in ``Configuration/maxEventBytes``.
    func checkSize(of prepared: PreparedEvent, identityFields: Int, named name: String, field: String) throws {
        let encoded = prepared.prefix.count + prepared.suffix.count
        let identity = identityFields * EventRules.maxEncodedIDFieldBytes
        guard encoded + identity <= configuration.maxEventBytes else {
            throw TrackingError(
                .eventTooLarge, field: field,
                "\(name) encodes to about \(encoded) bytes, and its identity may add up to \(identity); the limit is "
                    + "\(configuration.maxEventBytes).")
        }
    }

    // MARK: Super properties (this process)

    /// Properties added to every later event of this process; an event's own properties win.
    public func registerSuperProperties(_ properties: [String: PropertyValue]) throws {
        try EventRules.validateProperties(properties)
        state.withLock { state in
            state.superProperties.merge(properties) { _, new in new }
            state.rebase(presets: presets)
        }
    }

    /// Removes one super property.
    public func unregisterSuperProperty(_ key: String) {
        state.withLock { state in
            state.superProperties[key] = nil
            state.rebase(presets: presets)
        }
    }

    /// Removes every super property.
    public func clearSuperProperties() {
        state.withLock { state in
            state.superProperties = [:]
            state.rebase(presets: presets)
        }
    }

    /// The current super properties.
    public var superProperties: [String: PropertyValue] { state.withLock { $0.superProperties } }

    /// The preset properties of this producer.
    public var presetProperties: [String: PropertyValue] { presets }

    /// Properties every later event of this launch carries (`$latest_utm_*` after a deep link).
    public var launchProperties: [String: PropertyValue] { state.withLock { $0.launchProperties } }

    /// Replaces this launch's properties whose key starts with `prefix` by `properties` (process
    /// lifetime; super properties still win), set by the launch event stored at `seq`: properties set by
    /// a later event are kept (two launches tracked at once may resume in either order).
    func replaceLaunchProperties(prefix: String, with properties: [String: PropertyValue], setBy seq: UInt64) {
        state.withLock { state in
            guard seq > state.launchPropertiesSeq else { return }
            state.launchPropertiesSeq = seq
            state.launchProperties = state.launchProperties.filter { !$0.key.hasPrefix(prefix) }
                .merging(properties) { _, new in new }
            state.rebase(presets: presets)
        }
    }

    // MARK: Event timers (monotonic clock, paused in background)

    /// Starts (or restarts) a timer for `event`.
    public func trackTimerStart(_ event: String) throws {
        try EventRules.validateEventName(event)
        let now = configuration.monotonicNanos()
        state.withLock { state in
            var timer = EventTimer(startedAt: now)
            if state.inBackground { timer.pause(at: now, byApp: false) }
            state.timers[event] = timer
        }
    }

    /// Pauses the timer for `event`.
    public func trackTimerPause(_ event: String) throws {
        let now = configuration.monotonicNanos()
        try withTimer(event) { $0.pause(at: now, byApp: true) }
    }

    /// Resumes the timer for `event`.
    public func trackTimerResume(_ event: String) throws {
        let now = configuration.monotonicNanos()
        try withTimer(event) { $0.resume(at: now, byApp: true) }
    }

    /// Ends the timer for `event` and tracks it with `$event_duration` (seconds, 3 decimals). When the
    /// event is refused (a property, a full store), the timer goes on as if this call had not been
    /// made, unless another was started for `event`, or every timer cleared, meanwhile: the call can be
    /// made again.
    @discardableResult
    public func trackTimerEnd(_ event: String, properties: [String: PropertyValue] = [:]) async throws -> TrackReceipt {
        let now = configuration.monotonicNanos()
        let (timer, clears) = state.withLock { ($0.timers.removeValue(forKey: event), $0.timerClears) }
        guard let timer else {
            throw Self.unknownTimer(event)
        }
        var properties = properties
        properties["$event_duration"] = .double(Self.seconds(timer.elapsed(at: now)))
        do {
            return try await track(event, properties: properties)
        } catch {
            state.withLock { state in
                if state.timers[event] == nil && state.timerClears == clears { state.timers[event] = timer }
            }
            throw error
        }
    }

    /// Removes every timer without tracking.
    public func clearTrackTimers() {
        state.withLock { state in
            state.timers.removeAll()
            state.timerClears += 1
        }
    }

    private static func unknownTimer(_ event: String) -> TrackingError {
        TrackingError(.unknownTimer, field: event, "No timer was started for event \(event).")
    }

    /// Nanoseconds as seconds with 3 decimals (whole milliseconds), as `$event_duration` holds them.
    private static func seconds(_ nanos: UInt64) -> Double {
        (Double(nanos) / 1_000_000).rounded() / 1000
    }

    private func withTimer(_ event: String, _ body: (inout EventTimer) -> Void) throws {
        let found = state.withLock { state in
            guard var timer = state.timers[event] else { return false }
            body(&timer)
            state.timers[event] = timer
            return true
        }
        guard found else {
            throw Self.unknownTimer(event)
        }
    }

    // MARK: App state

    /// The app entered the background: running timers stop counting.
    public func enterBackground() {
        let now = configuration.monotonicNanos()
        state.withLock { state in
            state.inBackground = true
            for key in state.timers.keys { state.timers[key]!.pause(at: now, byApp: false) }
        }
    }

    /// The app returns to the foreground: timers paused by backgrounding resume.
    public func enterForeground() {
        let now = configuration.monotonicNanos()
        state.withLock { state in
            state.inBackground = false
            for key in state.timers.keys { state.timers[key]!.resume(at: now, byApp: false) }
        }
    }
}

/// One event timer: accumulated running time, and who paused it (the app, or backgrounding).
struct EventTimer: Sendable {
    private var accumulated: UInt64 = 0
    private var runningSince: UInt64?
    private var pausedByApp = false
    private var pausedByBackground = false

    init(startedAt now: UInt64) { runningSince = now }

    mutating func pause(at now: UInt64, byApp: Bool) {
        if byApp { pausedByApp = true } else { pausedByBackground = true }
        if let since = runningSince {
            accumulated += now >= since ? now - since : 0
            runningSince = nil
        }
    }

    mutating func resume(at now: UInt64, byApp: Bool) {
        if byApp { pausedByApp = false } else { pausedByBackground = false }
        if runningSince == nil && !pausedByApp && !pausedByBackground { runningSince = now }
    }

    func elapsed(at now: UInt64) -> UInt64 {
        accumulated + (runningSince.map { now >= $0 ? now - $0 : 0 } ?? 0)
    }
}
