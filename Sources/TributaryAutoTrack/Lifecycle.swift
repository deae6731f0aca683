/// A process signal of the app, named after the iOS `UIApplicationDelegate` callbacks that any UI toolkit
/// has an equivalent of.
public enum AppSignal: Sendable, Hashable, CustomStringConvertible {
    /// The process finished launching: in the foreground (the user opened it) or in the background
    /// (background fetch, silent push, location update: the system started it).
    case didFinishLaunching(inBackground: Bool)
    /// The app is in front and receives input.
    case didBecomeActive
    /// The app is about to stop receiving input (notification centre, control centre, app switcher,
    /// or on its way to the background).
    case willResignActive
    /// The app is no longer visible.
    case didEnterBackground
    /// The app is about to become visible again.
    case willEnterForeground
    /// The process is about to exit.
    case willTerminate

    public var description: String {
        switch self {
        case .didFinishLaunching(let background): background ? "launch(background)" : "launch"
        case .didBecomeActive: "becomeActive"
        case .willResignActive: "resignActive"
        case .didEnterBackground: "enterBackground"
        case .willEnterForeground: "enterForeground"
        case .willTerminate: "terminate"
        }
    }
}

/// What the lifecycle machine asks for in answer to a signal, in order.
public enum LifecycleEffect: Sendable, Hashable {
    /// Start a new session (a new `$session_id`) before anything else is tracked.
    case newSession
    /// Track `$AppStart`.
    case appStart(isFirstTime: Bool, resumeFromBackground: Bool)
    /// Track `$AppStartPassively`: the system launched the app in the background.
    case appStartPassively
    /// Track `$AppEnd`; `duration` (seconds) is nil when the measured time was not in (0 s, 24 h).
    case appEnd(duration: Double?, reason: AppEndReason)
    /// Track `$AppCrashed` (recovered from a crash record at the next start).
    case appCrashed
    /// Track the current page's `$AppViewScreen` again (hot start, or first open after a passive launch).
    case resendPageView
    /// Stop the clocks of running event timers (the app left the foreground).
    case pauseTimers
    /// Restart them.
    case resumeTimers
    /// Ask the agent to upload now.
    case flush
}

/// Why an `$AppEnd` was tracked (`$app_end_reason`).
public enum AppEndReason: String, Sendable, Hashable {
    /// The app went to the background.
    case background
    /// The process was told it would terminate while in front.
    case terminate
    /// The process crashed in front; the `$AppEnd` was backfilled at the next start.
    case crash
}

/// Where the app is, as the iOS application states.
public enum AppPhase: String, Sendable, Hashable {
    /// Before `didFinishLaunching`.
    case notRunning
    /// In front without input: launching, or a notification-centre or app-switcher flicker.
    case inactive
    /// In front, receiving input.
    case active
    /// Not visible (including a passive launch).
    case background
    /// After `willTerminate`.
    case terminated
}

/// The app lifecycle as a pure state machine: signals in, effects out. Times are monotonic nanoseconds.
///
/// Rules (whitepaper chapter 2):
/// - `$AppStart` on `didBecomeActive` unless `willResignActive` came first without a trip to the
///   background (notification centre, control centre, app switcher and back: no `$AppStart`).
/// - A background launch gives `$AppStartPassively` and no page view until the user opens the app.
/// - `$AppEnd` on `didEnterBackground` (or `willTerminate` from the foreground), once per `$AppStart`,
///   with `$event_duration` only when 0 < duration < 24 h.
/// - A new session at launch, and when the app comes back after `sessionTimeout` in the background:
///   at `willEnterForeground`, so that a page shown before `didBecomeActive` is in it too (at
///   `didBecomeActive` when the app skips `willEnterForeground`).
public struct LifecycleMachine: Sendable {
    /// Longest `$AppEnd` duration that is reported (24 h).
    public static let maxDurationNanos: UInt64 = 24 * 3600 * 1_000_000_000

    /// Time in the background after which becoming active starts a new session.
    public var sessionTimeoutNanos: UInt64
    /// The current state.
    public private(set) var phase: AppPhase = .notRunning
    /// True between an `$AppStart` and its `$AppEnd`.
    public private(set) var isStarted = false
    /// When the app last became active (valid while `isStarted`).
    public private(set) var activeSince: UInt64 = 0
    /// Whether any `$AppStart` was ever tracked for this installation (persisted by the caller).
    public private(set) var hasLaunchedBefore: Bool
    private var startedInThisProcess = false
    private var resigned = false
    private var backgroundSince: UInt64?
    /// The session was decided on the way back to the foreground (``AppSignal/willEnterForeground``):
    /// renewed, or kept; ``AppSignal/didBecomeActive`` does not judge it again.
    private var sessionDecided = false

    /// A machine for a process that has not launched yet.
    public init(hasLaunchedBefore: Bool, sessionTimeoutNanos: UInt64 = 30_000_000_000) {
        self.hasLaunchedBefore = hasLaunchedBefore
        self.sessionTimeoutNanos = sessionTimeoutNanos
    }

    /// Page views are tracked only while the user can see the app.
    public var pageViewsVisible: Bool { phase == .inactive || phase == .active }

    /// The `$event_duration` of an `$AppEnd`, in seconds with 3 decimals, or nil outside (0, 24 h)
    /// (under half a millisecond rounds to 0, and is left out too).
    public static func duration(from start: UInt64, to end: UInt64) -> Double? {
        guard end > start, end - start < maxDurationNanos else { return nil }
        let seconds = (Double(end - start) / 1_000_000).rounded() / 1000
        return seconds > 0 ? seconds : nil
    }

    /// What the next start does with a crash record: `$AppCrashed`, and the `$AppEnd` the crashed
    /// process never sent when it crashed between an `$AppStart` and its `$AppEnd`.
    public static func crashEffects(foreground: Bool, activeSince: UInt64, crashedAt: UInt64) -> [LifecycleEffect] {
        guard foreground else { return [.appCrashed] }
        return [.appCrashed, .appEnd(duration: duration(from: activeSince, to: crashedAt), reason: .crash)]
    }

    /// Whether the time in the background, up to `now`, reached the session timeout.
    private func sessionTimedOut(at now: UInt64) -> Bool {
        guard let since = backgroundSince, now >= since else { return false }
        return now - since >= sessionTimeoutNanos
    }

    /// Applies one signal received at `now` and returns the effects to carry out, in order.
    public mutating func handle(_ signal: AppSignal, at now: UInt64) -> [LifecycleEffect] {
        switch signal {
        case .didFinishLaunching(let inBackground):
            guard phase == .notRunning else { return [] }
            resigned = false
            if inBackground {
                phase = .background
                backgroundSince = now
                return [.newSession, .appStartPassively, .pauseTimers]
            }
            phase = .inactive
            return [.newSession]

        case .didBecomeActive:
            switch phase {
            case .active, .notRunning, .terminated:
                return []
            case .inactive where resigned && isStarted:
                // Notification centre, control centre, app switcher and back: not a start.
                resigned = false
                phase = .active
                return []
            case .inactive, .background:
                var effects: [LifecycleEffect] = []
                if !sessionDecided, sessionTimedOut(at: now) { effects.append(.newSession) }
                sessionDecided = false
                let cameFromBackground = backgroundSince != nil
                effects.append(.appStart(isFirstTime: !hasLaunchedBefore, resumeFromBackground: startedInThisProcess))
                if cameFromBackground { effects += [.resumeTimers, .resendPageView] }
                hasLaunchedBefore = true
                startedInThisProcess = true
                isStarted = true
                activeSince = now
                backgroundSince = nil
                resigned = false
                phase = .active
                return effects
            }

        case .willResignActive:
            guard phase == .active else { return [] }
            phase = .inactive
            resigned = true
            return []

        case .didEnterBackground:
            guard phase == .active || phase == .inactive else { return [] }
            var effects: [LifecycleEffect] = []
            if isStarted {
                effects.append(.appEnd(duration: Self.duration(from: activeSince, to: now), reason: .background))
                isStarted = false
            }
            phase = .background
            backgroundSince = now
            resigned = false
            sessionDecided = false
            return effects + [.pauseTimers, .flush]

        case .willEnterForeground:
            guard phase == .background else { return [] }
            phase = .inactive
            resigned = false
            // The pages shown from here on are tracked at once, before didBecomeActive: they belong to
            // the new session (they carried the one that had timed out). Decided here either way: a
            // didBecomeActive that comes late (a lock screen, a prompt) measures no time in front as
            // time in the background, and does not split the session these pages are in.
            sessionDecided = true
            guard sessionTimedOut(at: now) else { return [] }
            return [.newSession]

        case .willTerminate:
            guard phase != .terminated, phase != .notRunning else { return [] }
            var effects: [LifecycleEffect] = []
            if isStarted {
                effects.append(.appEnd(duration: Self.duration(from: activeSince, to: now), reason: .terminate))
                isStarted = false
            }
            phase = .terminated
            return effects + [.flush]
        }
    }
}
