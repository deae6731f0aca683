/// A background-task budget: the Linux form of iOS's `beginBackgroundTask(expirationHandler:)`.
///
/// The agent is given until ``deadline`` to work; its expiration handler runs ``grace`` before it
/// (at ``expiresAt``): it stops claiming work, lets no request run past that moment, commits its
/// state, releases its locks and returns. Times are on `ContinuousClock` (`CLOCK_BOOTTIME` on Linux),
/// so a wall-clock jump neither cuts a deadline short nor stretches it.
public struct BackgroundTask: Sendable, Equatable, CustomStringConvertible {
    /// Why the agent has a deadline.
    public enum Reason: String, Sendable {
        /// `--once --deadline S`: a timer-started background-fetch run.
        case once
        /// SIGTERM with `--stop-timeout S`: systemd is stopping the service.
        case stop
    }

    /// When the time is up.
    public let deadline: ContinuousClock.Instant
    /// How long before the deadline the expiration handler runs.
    public let grace: Duration
    /// Why.
    public let reason: Reason

    /// A task of `budget` from `start`, warning `grace` before its end (at most half the budget).
    public init(budget: Duration, grace: Duration, reason: Reason, start: ContinuousClock.Instant = .now) {
        deadline = start.advanced(by: budget)
        self.grace = min(grace, budget / 2)
        self.reason = reason
    }

    /// When the expiration handler runs.
    public var expiresAt: ContinuousClock.Instant { deadline.advanced(by: .zero - grace) }

    /// Time left before the expiration handler runs (negative once it has).
    public func remaining(at now: ContinuousClock.Instant = .now) -> Duration { expiresAt - now }

    public var description: String { "\(reason) deadline in \(remaining().seconds) s (grace \(grace.seconds) s)" }
}

/// Plans uploads against the remaining time from measured request durations, so that no upload is
/// started that cannot finish: the batch shrinks as time runs out.
struct UploadPlanner {
    /// Smoothed time per event of recent requests (including their fixed cost), in seconds.
    private(set) var secondsPerEvent: Double?

    /// Records a finished request.
    mutating func record(events: Int, took: Duration) {
        guard events > 0 else { return }
        let perEvent = took.seconds / Double(events)
        secondsPerEvent = secondsPerEvent.map { 0.7 * $0 + 0.3 * perEvent } ?? perEvent
    }

    /// How many events one request may carry to finish within `remaining`, with a safety factor of 2;
    /// 0 when not even one would. With no measurements yet, the configured limit (the request
    /// timeout still ends at the deadline).
    func maxEvents(within remaining: Duration, limit: Int) -> Int {
        guard remaining > .milliseconds(20) else { return 0 }
        guard let perEvent = secondsPerEvent, perEvent > 0 else { return limit }
        return max(0, min(limit, Int(remaining.seconds / 2 / perEvent)))
    }
}
