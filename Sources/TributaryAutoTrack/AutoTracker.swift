import CTributaryCrash
import Synchronization
import Tributary
import TributaryStore

#if canImport(Glibc)
import Glibc
#endif

/// A running performance measurement (see ``AutoTracker/startTiming(_:name:)``).
public struct TimingToken: Sendable, Hashable {
    /// `$performance_type`: `request`, `image`, or a type of your own.
    public var kind: String
    /// `$performance_name`: the URL, image key or operation.
    public var name: String
    /// Monotonic start, in nanoseconds.
    public var startedAt: UInt64
}

/// Automatic tracking for the main app: feed it the app's lifecycle signals, page appearances, clicks and
/// layout changes from any UI toolkit; it tracks `$AppStart`, `$AppStartPassively`, `$AppEnd`,
/// `$AppViewScreen`, `$AppClick`, `$AppExposure`, `$AppPerformance` and, at the next start after a crash,
/// `$AppCrashed` with the missing `$AppEnd`. Every event of the process (code-tracked ones too) carries
/// `$session_id`.
///
/// Each call tracks synchronously (one durable transaction per event) and returns the receipts. When
/// an event is refused (the store full, a property over a limit), the call still does everything else
/// the report implies (the other events, pausing timers, the flush) and then throws the first error.
/// Calls are expected from one UI thread; from several, they are taken one at a time.
///
/// ```swift
/// let auto = try AutoTracker(tracker: tracker, configuration: .init(pageIDs: ["HomeViewController": "home"]))
/// try auto.start()                                   // recovers a crash of the previous run
/// try auto.handle(.didFinishLaunching(inBackground: false))
/// try auto.pageAppeared(PageDescription(instanceID: "1", className: "HomeViewController", root: tree))
/// try auto.handle(.didBecomeActive)
/// ```
public final class AutoTracker: Sendable {
    /// How automatic tracking behaves.
    public struct Configuration: Sendable {
        /// Time in the background after which the next start is a new session. Default 30 s.
        public var sessionTimeout: Duration = .seconds(30)
        /// Class name → page id (`$screen_name`, `$referrer`); unmapped classes use their class name.
        public var pageIDs: [String: String] = [:]
        /// Install the crash signal handlers in ``AutoTracker/start()``. Default true.
        public var captureCrashes = true
        /// Ask the agent to upload when the app enters the background. Default true.
        public var flushOnBackground = true
        /// The monotonic clock, in nanoseconds. Default `CLOCK_BOOTTIME`; tests and simulations inject one.
        public var monotonicNanos: @Sendable () -> UInt64 = BootClock.nowNanos

        /// The defaults, with an optional class→page id map.
        public init(pageIDs: [String: String] = [:]) { self.pageIDs = pageIDs }
    }

    private struct State {
        var machine: LifecycleMachine
        var pages: PageFlow
        var exposure = ExposureTracker()
        var sessionID = ""
        var lastClick: (element: String, touch: UInt64)?
        /// The page view owed to the user: one held back while the app was not visible, or the current
        /// page's again after a trip to the background. Sent, and cleared, when the app becomes active.
        var pageViewOwed: [String: PropertyValue]?
        /// An `$AppStart` the store holds and no `$AppEnd` was tried for yet: since when, in
        /// `CLOCK_BOOTTIME` (the configured clock's start translated once, when it was stored); nil when
        /// none. The crash handler records a start open only then: a crash backfills an `$AppEnd` for no
        /// start the store refused, and none after an `$AppEnd` was tried (stored, or refused: its
        /// duration would count time in the background). Until the `$AppEnd` is stored, a crash backfills
        /// it, under the same event id (``CrashRecord/appEndEventID(pid:activeSince:bootID:)``).
        var storedStartBoot: UInt64?
    }

    /// What to do once the state's lock is released.
    private enum Action {
        case track(String, [String: PropertyValue], ifFailed: Undo? = nil)
        case markLaunched
        case pauseTimers, resumeTimers, flush
    }

    /// What a failed event takes back, so that the next report tries it again.
    private enum Undo {
        /// The element is not exposed after all: the next layout update reports it again.
        case exposure(ExposureTracker.Key)
        /// The touch was not recorded: the same touch reported again is a click.
        case click(element: String, touch: UInt64)
    }

    private final class Box: Sendable {
        let state: Mutex<State>
        init(_ state: State) { self.state = Mutex(state) }
    }

    /// The longest ``Configuration/sessionTimeout``: 365 days.
    public static let maxSessionTimeout: Duration = .seconds(365 * 86_400)

    /// Configuration key (store `config` table) recording that `$AppStart` was tracked once.
    public static let launchedKey = "app.has_launched_once"

    /// The tracker events go to.
    public let tracker: Tracker
    /// This producer's crash file.
    public let crashLog: CrashLog
    private let configuration: Configuration
    private let box: Box
    /// One report at a time, from reading the clock to the last commit: reports from several threads
    /// keep their order in the store, and their times and durations.
    private let operation = Mutex(())

    /// Sets up automatic tracking on `tracker` and registers `$session_id` as a dynamic super property.
    public init(tracker: Tracker, configuration: Configuration = Configuration()) throws {
        let timeout = configuration.sessionTimeout.components
        guard configuration.sessionTimeout > .zero, configuration.sessionTimeout <= Self.maxSessionTimeout else {
            throw AutoTrackError(
                .invalidConfiguration,
                "sessionTimeout must be positive and at most 365 days; it is \(configuration.sessionTimeout).")
        }
        let nanos = UInt64(timeout.seconds) * 1_000_000_000 + UInt64(timeout.attoseconds / 1_000_000_000)
        self.tracker = tracker
        self.configuration = configuration
        crashLog = CrashLog(groupDirectory: tracker.store.groupDirectory, producerID: tracker.producer.id)
        let launched = try tracker.store.configuration()[Self.launchedKey] != nil
        let box = Box(
            State(
                machine: LifecycleMachine(hasLaunchedBefore: launched, sessionTimeoutNanos: nanos),
                pages: PageFlow(pageIDs: configuration.pageIDs)))
        self.box = box
        // Its own slot: the app's dynamic super properties, registered before or after, stay as they are.
        tracker.registerAutomaticProperties {
            let id = box.state.withLock { $0.sessionID }
            return id.isEmpty ? [:] : ["$session_id": .string(id)]
        }
    }

    // MARK: Start and crashes

    /// Turns the crash records of earlier runs into `$AppCrashed` (and the `$AppEnd` each crash kept
    /// from being sent), dated at the crash, and installs the crash handlers (unless
    /// ``Configuration/captureCrashes`` is false). Call it once, early, before the app's first signal.
    ///
    /// The records are set aside first and the handlers installed before they are tracked, so a crash
    /// while they are tracked is kept, and a failure to track them (the store full) leaves crash capture
    /// on: the error is thrown after the handlers are in place, and the records wait for the next start.
    /// An event the tracker refuses for itself (a ``TrackingError``: over `maxEventBytes` even with the
    /// shortest backtrace) is given up instead, and its error thrown once the other records are tracked.
    @discardableResult
    public func start() throws -> [TrackReceipt] {
        // Capture goes on even when the records cannot be set aside: a record then left in the file is
        // tracked at a later start, under the same event ids.
        let setAside = Result { try crashLog.setAside() }
        if configuration.captureCrashes {
            try crashLog.install(bootID: .current, appVersion: tracker.configuration.appVersion)
            publishCrashContext()
        }
        try setAside.get()
        var receipts: [TrackReceipt] = []
        // An event no store could ever take (over the tracker's maxEventBytes even with the shortest
        // backtrace) is given up, and said by the error thrown at the end; kept, it would be refused at
        // every start, and every crash after it would wait behind it. The store's own refusals (full)
        // end the start at once, the records kept for the next.
        var refused: TrackingError?
        for record in try crashLog.readSetAside() {
            let effects = LifecycleMachine.crashEffects(
                foreground: record.foreground, activeSince: record.activeSince, crashedAt: record.bootTimeNanos)
            for effect in effects {
                var properties: [String: PropertyValue] = [:]
                if !record.sessionID.isEmpty { properties["$session_id"] = .string(record.sessionID) }
                if !record.screenName.isEmpty { properties["$screen_name"] = .string(record.screenName) }
                // The crashed run's version, not this one's: the app may have been updated since.
                if let version = record.appVersion, !version.isEmpty { properties["$app_version"] = .string(version) }
                let event: String
                // Backtraces of fewer frames, down to the signal's line alone, for an event over the limit.
                var reasonLimits: [Int?] = [nil]
                switch effect {
                case .appEnd(let duration, let reason):
                    event = "$AppEnd"
                    properties["$app_end_reason"] = .string(reason.rawValue)
                    if let duration { properties["$event_duration"] = .double(duration) }
                default:
                    event = "$AppCrashed"
                    reasonLimits = [EventRules.maxStringBytes, 2048, 512, 0]
                }
                let moment = EventMoment(
                    wallTimeMillis: record.wallTimeMillis, bootTimeNanos: record.bootTimeNanos, bootID: record.bootID,
                    eventID: record.eventID(for: event))
                for (attempt, limit) in reasonLimits.enumerated() {
                    if let limit { properties["app_crashed_reason"] = .string(record.reason(limit: limit)) }
                    do {
                        receipts.append(try tracker.trackAutomatic(event, properties: properties, moment: moment))
                        break
                    } catch let error as TrackingError where error.code == .eventTooLarge && attempt + 1 < reasonLimits.count {
                        continue
                    } catch let error as TrackingError {
                        refused = refused ?? error
                        break
                    }
                }
            }
        }
        // Also when no record was intact: torn bytes alone are not read again at every start.
        try crashLog.discardSetAside()
        if let refused { throw refused }
        return receipts
    }

    /// Tells the crash handler whether an `$AppStart` is open, and since when: one the store holds without
    /// an `$AppEnd` tried for it (``State/storedStartBoot``); nothing without crash capture.
    private func publishCrashContext() {
        guard configuration.captureCrashes else { return }
        let (activeSince, session, screen) = box.state.withLock { s in
            (s.storedStartBoot, s.sessionID, s.pages.currentScreen ?? "")
        }
        // The record's field holds 127 bytes and a NUL: cut at a character's end, not inside one.
        let screenName = clipped(screen, toBytes: Int(TRIBUTARY_CRASH_SCREEN_NAME) - 1)
        tributary_crash_set_context(activeSince != nil ? 1 : 0, activeSince ?? 0, session, screenName)
    }

    /// `since`, a reading of the configured clock (an injected one may run ahead), as `CLOCK_BOOTTIME`,
    /// the clock the crash handler reads, given both clocks' readings `now`.
    private static func bootTime(of since: UInt64, now: (configured: UInt64, boot: UInt64)) -> UInt64 {
        let elapsed = now.configured >= since ? now.configured - since : 0
        return now.boot >= elapsed ? now.boot - elapsed : 0
    }

    // MARK: Lifecycle

    /// Feeds one lifecycle signal; tracks what it implies and returns the receipts, in order.
    @discardableResult
    public func handle(_ signal: AppSignal) throws -> [TrackReceipt] {
        try operation.withLock { _ in
            let now = configuration.monotonicNanos()
            let actions = box.state.withLock { s in
                let effects = s.machine.handle(signal, at: now)
                if s.machine.phase == .background, s.pageViewOwed == nil { s.pageViewOwed = s.pages.resend }
                return Self.plan(effects, &s)
            }
            return try perform(actions)
        }
    }

    private static func plan(_ effects: [LifecycleEffect], _ s: inout State) -> [Action] {
        var actions: [Action] = []
        for effect in effects {
            switch effect {
            case .newSession:
                s.sessionID = randomUUIDString()
            case .appStart(let first, let resume):
                var p: [String: PropertyValue] = [
                    "$is_first_time": .bool(first), "$resume_from_background": .bool(resume),
                ]
                if let screen = s.pages.currentScreen { p["$screen_name"] = .string(screen) }
                actions.append(.track("$AppStart", p))
                if first { actions.append(.markLaunched) }
            case .appStartPassively:
                actions.append(.track("$AppStartPassively", [:]))
            case .appEnd(let duration, let reason):
                var p: [String: PropertyValue] = ["$app_end_reason": .string(reason.rawValue)]
                if let duration { p["$event_duration"] = .double(duration) }
                if let screen = s.pages.currentScreen { p["$screen_name"] = .string(screen) }
                actions.append(.track("$AppEnd", p))
            case .appCrashed:
                break  // only from crash records, in start()
            case .resendPageView:
                break  // the page view owed, below: also one held back before the first start

            case .pauseTimers:
                actions.append(.pauseTimers)
            case .resumeTimers:
                actions.append(.resumeTimers)
            case .flush:
                actions.append(.flush)
            }
        }
        if s.machine.phase == .active, let owed = s.pageViewOwed {
            s.pageViewOwed = nil
            s.exposure.reset()
            actions.append(.track("$AppViewScreen", owed))
        }
        return actions
    }

    /// Carries out every action, also after one fails: the state has moved on already, so an `$AppEnd`
    /// refused (the store full) must not keep the timers running or the flush from being asked for. The
    /// first error is thrown at the end; the events before and after it are stored.
    private func perform(_ actions: [Action]) throws -> [TrackReceipt] {
        publishCrashContext()
        var receipts: [TrackReceipt] = []
        var firstError: (any Error)?
        var lastTrackFailed = false
        for action in actions {
            do {
                switch action {
                case .track(let event, let properties, let undo):
                    // The start a crash would close stays open until its `$AppEnd` is tried (a crash while
                    // it commits backfills it); this one then gets the id the backfill would.
                    let openStart = event == "$AppEnd" ? box.state.withLock { $0.storedStartBoot } : nil
                    let moment = openStart.map { since in
                        EventMoment(eventID: CrashRecord.appEndEventID(pid: getpid(), activeSince: since, bootID: .current))
                    }
                    defer {
                        if event == "$AppEnd" {
                            box.state.withLock { $0.storedStartBoot = nil }
                            publishCrashContext()
                        }
                    }
                    do {
                        receipts.append(try tracker.trackAutomatic(event, properties: properties, moment: moment))
                        lastTrackFailed = false
                        // Kept for the crash handler only (nil, it is never published nor gives an id).
                        if event == "$AppStart", configuration.captureCrashes {
                            let now = (configured: configuration.monotonicNanos(), boot: BootClock.nowNanos())
                            box.state.withLock { $0.storedStartBoot = Self.bootTime(of: $0.machine.activeSince, now: now) }
                            publishCrashContext()
                        }
                    } catch {
                        lastTrackFailed = true
                        if let undo { self.undo(undo) }
                        throw error
                    }
                case .markLaunched:
                    // It follows the first `$AppStart`: refused, that start is owed to the next launch.
                    guard !lastTrackFailed else { continue }
                    try tracker.store.setConfiguration(Self.launchedKey, json: "true")
                case .pauseTimers:
                    tracker.enterBackground()
                case .resumeTimers:
                    tracker.enterForeground()
                case .flush:
                    if configuration.flushOnBackground { tracker.flush() }
                }
            } catch {
                if firstError == nil { firstError = error }
            }
        }
        if let firstError { throw firstError }
        return receipts
    }

    private func undo(_ undo: Undo) {
        box.state.withLock { s in
            switch undo {
            case .exposure(let key): s.exposure.forget(key)
            case .click(let element, let touch):
                if let last = s.lastClick, last.element == element, last.touch == touch { s.lastClick = nil }
            }
        }
    }

    /// The current session id (`$session_id`).
    public var sessionID: String { box.state.withLock { $0.sessionID } }
    /// The lifecycle state.
    public var phase: AppPhase { box.state.withLock { $0.machine.phase } }

    // MARK: Pages

    /// A page instance was created (its view starts loading): the start of its `$page_load_duration`.
    public func pageCreated(_ instanceID: String) {
        let now = configuration.monotonicNanos()
        box.state.withLock { $0.pages.created(instanceID, at: now) }
    }

    /// A page appeared: tracks `$AppViewScreen` (unless the app is in the background, as after a passive
    /// launch: the page view is then sent when the user opens the app), resets exposures, and with a
    /// `viewport` reports the elements already visible.
    @discardableResult
    public func pageAppeared(_ page: PageDescription, viewport: Rect? = nil) throws -> [TrackReceipt] {
        try operation.withLock { _ in
            let now = configuration.monotonicNanos()
            let actions: [Action] = box.state.withLock { s in
                let properties = s.pages.appeared(page, at: now)
                s.exposure.reset()
                guard s.machine.pageViewsVisible else {
                    s.pageViewOwed = properties  // with its load time: sent when the user opens the app
                    return []
                }
                s.pageViewOwed = nil
                var actions: [Action] = [.track("$AppViewScreen", properties)]
                if let viewport { actions += Self.exposures(&s, viewport: viewport) }
                return actions
            }
            return try perform(actions)
        }
    }

    /// The visible area or the current page's views changed (scroll, layout, show/hide): tracks an
    /// `$AppExposure` for each element that just came into view. `root` replaces the page's view tree.
    @discardableResult
    public func layoutChanged(viewport: Rect, root: ViewNode? = nil) throws -> [TrackReceipt] {
        try operation.withLock { _ in
            let actions: [Action] = try box.state.withLock { s in
                guard s.pages.current != nil else {
                    throw AutoTrackError(.noPage, "A layout change was reported before any page appeared.")
                }
                if let root { s.pages.replaceCurrentRoot(root) }
                guard s.machine.pageViewsVisible else { return [] }
                return Self.exposures(&s, viewport: viewport)
            }
            return try perform(actions)
        }
    }

    /// The page was refreshed (pull to refresh): everything visible is exposed again at the next update.
    public func refresh() { box.state.withLock { $0.exposure.reset() } }

    private static func exposures(_ s: inout State, viewport: Rect) -> [Action] {
        guard let current = s.pages.current, let root = current.page.root else { return [] }
        let fresh = s.exposure.update(root: root, viewport: viewport, pageType: current.page.className)
        return fresh.map { element in
            var p = element.properties.merging(element.node.exposure ?? [:]) { own, _ in own }
            p["$screen_name"] = .string(s.pages.screenName(current.page.className))
            if let title = current.page.title { p["$title"] = .string(clippedToValueLimit(title)) }
            return .track("$AppExposure", p, ifFailed: .exposure(ExposureTracker.Key(element)))
        }
    }

    // MARK: Clicks

    /// A click on the element `elementID` of the current page: tracks one `$AppClick`. When the toolkit
    /// reports the same touch once per target of a control, pass the touch's id: a repeat of the same
    /// element and touch is ignored (returns nil), so one click is one event.
    @discardableResult
    public func click(elementID: String, touch: UInt64? = nil) throws -> TrackReceipt? {
        try operation.withLock { _ in try clickLocked(elementID: elementID, touch: touch) }
    }

    private func clickLocked(elementID: String, touch: UInt64?) throws -> TrackReceipt? {
        let action: Action? = try box.state.withLock { s in
            guard let current = s.pages.current else {
                throw AutoTrackError(.noPage, "A click on \(elementID) was reported before any page appeared.")
            }
            guard let root = current.page.root else {
                throw AutoTrackError(
                    .noViewTree, "The page \(current.page.className) was reported without a view tree.")
            }
            guard let element = ElementPath.locate(elementID, in: root, pageType: current.page.className) else {
                throw AutoTrackError(
                    .unknownElement, "No view with id \(elementID) in the view tree of \(current.page.className).")
            }
            if let touch {
                if let last = s.lastClick, last.element == elementID, last.touch == touch { return nil }
                s.lastClick = (elementID, touch)
            }
            var p = element.properties
            p["$screen_name"] = .string(s.pages.screenName(current.page.className))
            if let title = current.page.title { p["$title"] = .string(clippedToValueLimit(title)) }
            return .track("$AppClick", p, ifFailed: touch.map { .click(element: elementID, touch: $0) })
        }
        guard let action else { return nil }
        return try perform([action]).first
    }

    // MARK: Performance timings

    /// Starts measuring a request, an image load or any operation, on the monotonic clock.
    public func startTiming(_ kind: String, name: String) -> TimingToken {
        TimingToken(kind: kind, name: name, startedAt: configuration.monotonicNanos())
    }

    /// Ends a measurement: tracks `$AppPerformance` with `$performance_type`, `$performance_name`,
    /// `$event_duration` (seconds) and the current `$screen_name`.
    @discardableResult
    public func endTiming(_ token: TimingToken, properties: [String: PropertyValue] = [:]) throws -> TrackReceipt {
        let now = configuration.monotonicNanos()
        let elapsed = now >= token.startedAt ? now - token.startedAt : 0
        var p = properties
        p["$performance_type"] = .string(token.kind)
        p["$performance_name"] = .string(clippedToValueLimit(token.name))
        p["$event_duration"] = .double((Double(elapsed) / 1_000_000).rounded() / 1000)
        if let screen = box.state.withLock({ $0.pages.currentScreen }) { p["$screen_name"] = .string(screen) }
        return try tracker.trackAutomatic("$AppPerformance", properties: p)
    }
}
