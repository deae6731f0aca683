import Tributary
import TributaryStore

/// The kinds of event automatic tracking sends, each of which can be turned off
/// (``AutoTracker/Configuration/events``), as Sensors' `autoTrackEventType`.
public struct AutoTrackEvents: OptionSet, Sendable, Hashable {
    public let rawValue: UInt32
    public init(rawValue: UInt32) { self.rawValue = rawValue }

    /// `$AppStart` and `$AppStartPassively`.
    public static let appStart = AutoTrackEvents(rawValue: 1 << 0)
    /// `$AppEnd` (also the one backfilled after a crash).
    public static let appEnd = AutoTrackEvents(rawValue: 1 << 1)
    /// `$AppViewScreen`.
    public static let appViewScreen = AutoTrackEvents(rawValue: 1 << 2)
    /// `$AppPageLeave` (also the one backfilled after a crash).
    public static let appPageLeave = AutoTrackEvents(rawValue: 1 << 3)
    /// `$AppClick`.
    public static let appClick = AutoTrackEvents(rawValue: 1 << 4)
    /// `$AppExposure`.
    public static let appExposure = AutoTrackEvents(rawValue: 1 << 5)
    /// `$AppPerformance`.
    public static let appPerformance = AutoTrackEvents(rawValue: 1 << 6)
    /// Every kind (the default).
    public static let all: AutoTrackEvents = [
        .appStart, .appEnd, .appViewScreen, .appPageLeave, .appClick, .appExposure, .appPerformance,
    ]

    /// The kind an event name belongs to; nil for events no switch controls (`$AppCrashed`).
    static func kind(of event: String) -> AutoTrackEvents? {
        switch event {
        case "$AppStart", "$AppStartPassively": .appStart
        case "$AppEnd": .appEnd
        case "$AppViewScreen": .appViewScreen
        case "$AppPageLeave": .appPageLeave
        case "$AppClick": .appClick
        case "$AppExposure": .appExposure
        case "$AppPerformance": .appPerformance
        default: nil
        }
    }
}

extension AutoTracker {
    /// How automatic tracking behaves.
    public struct Configuration: Sendable {
        /// Time in the background after which the next start is a new session. Default 30 s.
        public var sessionTimeout: Duration = .seconds(30)
        /// Class name → page id (`$screen_name`, `$referrer`); unmapped classes use their class name.
        public var pageIDs: [String: String] = [:]
        /// The events sent; the others are not tracked at all. Default: every kind.
        public var events: AutoTrackEvents = .all
        /// Pages (class names or page ids) that send no page view, page leave, click or exposure, and are
        /// nobody's `$referrer`. Default none.
        public var ignoredPages: Set<String> = []
        /// Element classes (`ViewNode.type`) whose clicks and exposures are not tracked. Default none.
        public var ignoredElementTypes: Set<String> = []
        /// Element ids (`ViewNode.id`) whose clicks and exposures are not tracked. Default none.
        public var ignoredElementIDs: Set<String> = []
        /// The exposure rule of an element that has none of its own (`ViewNode.exposureRule`). Default:
        /// any visible part, no minimum stay, exposed again after leaving the visible area.
        public var exposureRule = ExposureRule.default
        /// Install the crash signal handlers in ``AutoTracker/start()``. Default true.
        public var captureCrashes = true
        /// Ask the agent to upload when the app enters the background. Default true.
        public var flushOnBackground = true
        /// The monotonic clock, in nanoseconds. Default `CLOCK_BOOTTIME`; tests and simulations inject one.
        public var monotonicNanos: @Sendable () -> UInt64 = BootClock.nowNanos

        /// The defaults, with an optional class→page id map.
        public init(pageIDs: [String: String] = [:]) { self.pageIDs = pageIDs }

        /// Whether an element's clicks and exposures are left out.
        func ignores(_ node: ViewNode) -> Bool {
            ignoredElementIDs.contains(node.id) || ignoredElementTypes.contains(node.type)
        }
    }
}
