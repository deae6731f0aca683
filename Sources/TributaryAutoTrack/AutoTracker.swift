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
    struct State {
        var machine: LifecycleMachine
        var pages: PageFlow
        var exposure = ExposureTracker()
        /// The page view open to an `$AppPageLeave`: from the page view sent to the next page's, the
        /// background or the end.
        var visit: PageVisit?
        /// The visible area last reported, for exposures due by time alone (a minimum stay).
        var viewport: Rect?
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
    enum Action {
        /// Track an event (unless its kind is turned off); `eventID` gives it a derived id.
        case track(String, [String: PropertyValue], ifFailed: Undo? = nil, eventID: String? = nil)
        case markLaunched
        case pauseTimers, resumeTimers, flush
        /// A page visit began (its visit file is written) or ended (removed).
        case visitBegan(PageVisit), visitEnded
    }

    /// What a failed event takes back, so that the next report tries it again.
    enum Undo {
        /// The element is not exposed after all: the next layout update reports it again.
        case exposure(ExposureTracker.Key)
        /// The touch was not recorded: the same touch reported again is a click.
        case click(element: String, touch: UInt64)
    }

    final class Box: Sendable {
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
    let configuration: Configuration
    let box: Box
    /// This process's visit file (the `$AppPageLeave` a crash would keep from being sent).
    let visitFile: VisitFile
    /// One report at a time, from reading the clock to the last commit: reports from several threads
    /// keep their order in the store, and their times and durations.
    let operation = Mutex(())

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
                pages: PageFlow(pageIDs: configuration.pageIDs, ignoredPages: configuration.ignoredPages)))
        visitFile = VisitFile(groupDirectory: tracker.store.groupDirectory, producerID: tracker.producer.id)
        self.box = box
        // Its own slot: the app's dynamic super properties, registered before or after, stay as they are.
        tracker.registerAutomaticProperties {
            let id = box.state.withLock { $0.sessionID }
            return id.isEmpty ? [:] : ["$session_id": .string(id)]
        }
    }

    /// Tells the crash handler whether an `$AppStart` is open, and since when: one the store holds without
    /// an `$AppEnd` tried for it (``State/storedStartBoot``); nothing without crash capture.
    func publishCrashContext() {
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
    static func bootTime(of since: UInt64, now: (configured: UInt64, boot: UInt64)) -> UInt64 {
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
                // The page is left on the way to the background or the end, before the `$AppEnd`.
                let leaving = s.machine.phase == .background || s.machine.phase == .terminated
                return (leaving ? Self.endVisit(&s, at: now) : []) + Self.plan(effects, &s, at: now)
            }
            return try perform(actions)
        }
    }

    private static func plan(_ effects: [LifecycleEffect], _ s: inout State, at now: UInt64) -> [Action] {
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
            actions += beginVisit(&s, owed, at: now)
        }
        return actions
    }

    /// Carries out every action, also after one fails: the state has moved on already, so an `$AppEnd`
    /// refused (the store full) must not keep the timers running or the flush from being asked for. The
    /// first error is thrown at the end; the events before and after it are stored.
    func perform(_ actions: [Action]) throws -> [TrackReceipt] {
        publishCrashContext()
        var receipts: [TrackReceipt] = []
        var firstError: (any Error)?
        var lastTrackFailed = false
        for action in actions {
            do {
                switch action {
                case .track(let event, let properties, let undo, let eventID):
                    if let kind = AutoTrackEvents.kind(of: event), !configuration.events.contains(kind) { continue }
                    // The start a crash would close stays open until its `$AppEnd` is tried (a crash while
                    // it commits backfills it); this one then gets the id the backfill would.
                    let openStart = event == "$AppEnd" ? box.state.withLock { $0.storedStartBoot } : nil
                    let moment =
                        openStart.map { since in
                            EventMoment(
                                eventID: CrashRecord.appEndEventID(pid: getpid(), activeSince: since, bootID: .current))
                        } ?? eventID.map { EventMoment(eventID: $0) }
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
                        // Without `$AppEnd`s, a crash has none to backfill.
                        if event == "$AppStart", configuration.captureCrashes, configuration.events.contains(.appEnd) {
                            let now = (configured: configuration.monotonicNanos(), boot: BootClock.nowNanos())
                            box.state.withLock {
                                $0.storedStartBoot = Self.bootTime(of: $0.machine.activeSince, now: now)
                            }
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
                case .visitBegan(let visit):
                    if configuration.captureCrashes, configuration.events.contains(.appPageLeave) {
                        visitFile.write(visit)
                    }
                case .visitEnded:
                    if configuration.captureCrashes, configuration.events.contains(.appPageLeave) { visitFile.remove() }
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

    // MARK: Performance timings

    /// Starts measuring a request, an image load or any operation, on the monotonic clock.
    public func startTiming(_ kind: String, name: String) -> TimingToken {
        TimingToken(kind: kind, name: name, startedAt: configuration.monotonicNanos())
    }

    /// Ends a measurement: tracks `$AppPerformance` with `$performance_type`, `$performance_name`,
    /// `$event_duration` (seconds) and the current `$screen_name`; nil when `$AppPerformance` is
    /// turned off (``Configuration/events``).
    @discardableResult
    public func endTiming(_ token: TimingToken, properties: [String: PropertyValue] = [:]) throws -> TrackReceipt? {
        guard configuration.events.contains(.appPerformance) else { return nil }
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
