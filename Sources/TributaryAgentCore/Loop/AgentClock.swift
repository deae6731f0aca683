import Synchronization

/// The time the agent's driver reads and waits on: when a flush is due, a backoff ends, a deadline
/// expires, the status is written. ``SystemClock`` (the default) is `ContinuousClock`
/// (`CLOCK_BOOTTIME`); a test gives a ``ManualClock`` and moves it itself, so that the whole agent
/// (real store, outbox and collector) runs through its flush intervals, backoffs and deadlines with no
/// sleeps. Instants are `ContinuousClock`'s on both, so the decisions (``LoopMachine``,
/// ``UploadMachine``) and ``BackgroundTask`` take either.
///
/// What stays on the system's clocks: the watchdog (systemd measures it), the HTTP client's own
/// request timeout, SQLite's busy timeout and the store deletes' thread. A request the agent gives up on
/// is cancelled on this clock (``Agent/stepCancelledAtExpiry(_:maxEvents:timeout:)``).
public protocol AgentClock: Sendable {
    var now: ContinuousClock.Instant { get }
    /// Returns at `deadline`; throws `CancellationError` when the task is cancelled first.
    func sleep(until deadline: ContinuousClock.Instant) async throws
}

/// The system's monotonic clock; its sleeps are event-loop timers (``EventLoopSleep``: `Task.sleep`
/// would start libdispatch's once-a-second pool monitor).
public struct SystemClock: AgentClock {
    public init() {}
    public var now: ContinuousClock.Instant { .now }
    public func sleep(until deadline: ContinuousClock.Instant) async throws {
        try await EventLoopSleep.sleep(until: deadline)
    }
}

/// A clock that moves only when ``advance(by:)`` moves it. It starts at the system clock's now and
/// runs from there; sleepers wake, in deadline order, when it reaches their deadline, or when their
/// task is cancelled. ``nextDeadline()`` waits until someone sleeps on it: how a test moves time
/// while a request is out (the request's watcher, the status ticker); between the loop's turns, the
/// loop's own parks say what it waits for (``LoopParking``).
public final class ManualClock: AgentClock {
    /// A sleep, from its call to its end: announced (its task may be cancelled before it registers),
    /// then waiting with its continuation, or cancelled before it registered.
    private enum Sleep {
        case announced
        case waiting(deadline: ContinuousClock.Instant, continuation: CheckedContinuation<Void, any Error>)
        case cancelledEarly
    }

    private struct State {
        var now: ContinuousClock.Instant
        var nextID: UInt64 = 0
        /// Every sleep not yet over, by id: one that ended (woken or cancelled) is removed.
        var sleeps: [UInt64: Sleep] = [:]
        /// Waiters of ``nextDeadline()``, resumed when the next sleeper registers.
        var watchers: [CheckedContinuation<Void, Never>] = []

        var deadlines: [ContinuousClock.Instant] {
            sleeps.values.compactMap { if case .waiting(let deadline, _) = $0 { deadline } else { nil } }
        }
    }

    private let state: Mutex<State>

    public init(start: ContinuousClock.Instant = .now) { state = Mutex(State(now: start)) }

    public var now: ContinuousClock.Instant { state.withLock { $0.now } }

    /// Moves the clock on by `duration` and wakes every sleeper whose deadline it reached, earliest first.
    public func advance(by duration: Duration) {
        precondition(duration >= .zero, "a manual clock only moves forward")
        let due = state.withLock { state -> [CheckedContinuation<Void, any Error>] in
            state.now = state.now + duration
            var due: [(deadline: ContinuousClock.Instant, continuation: CheckedContinuation<Void, any Error>)] = []
            for (id, sleep) in state.sleeps {
                guard case .waiting(let deadline, let continuation) = sleep, deadline <= state.now else { continue }
                due.append((deadline, continuation))
                state.sleeps[id] = nil
            }
            return due.sorted { $0.deadline < $1.deadline }.map(\.continuation)
        }
        for continuation in due { continuation.resume() }
    }

    /// Moves the clock to `instant` (nothing when it is there already or past it).
    public func advance(to instant: ContinuousClock.Instant) {
        advance(by: max(.zero, now.duration(to: instant)))
    }

    /// The earliest deadline anyone sleeps until, once someone does: waits (without polling) until a
    /// sleeper registers.
    public func nextDeadline() async -> ContinuousClock.Instant {
        while true {
            if let earliest = state.withLock({ $0.deadlines.min() }) { return earliest }
            await withCheckedContinuation { (watcher: CheckedContinuation<Void, Never>) in
                let now = state.withLock { state -> Bool in
                    guard state.deadlines.isEmpty else { return true }
                    state.watchers.append(watcher)
                    return false
                }
                if now { watcher.resume() }
            }
        }
    }

    /// How many sleep on the clock now.
    public var sleeperCount: Int { state.withLock { $0.deadlines.count } }

    public func sleep(until deadline: ContinuousClock.Instant) async throws {
        let id = state.withLock { state -> UInt64 in
            state.nextID += 1
            state.sleeps[state.nextID] = .announced
            return state.nextID
        }
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                let (outcome, watchers) = state.withLock { state -> (Result<Void, any Error>?, [CheckedContinuation<Void, Never>]) in
                    if case .cancelledEarly? = state.sleeps[id] {
                        state.sleeps[id] = nil
                        return (.failure(CancellationError()), [])
                    }
                    if deadline <= state.now {
                        state.sleeps[id] = nil
                        return (.success(()), [])
                    }
                    state.sleeps[id] = .waiting(deadline: deadline, continuation: continuation)
                    defer { state.watchers = [] }
                    return (nil, state.watchers)
                }
                for watcher in watchers { watcher.resume() }
                if let outcome { continuation.resume(with: outcome) }
            }
        } onCancel: {
            let continuation = state.withLock { state -> CheckedContinuation<Void, any Error>? in
                switch state.sleeps[id] {
                case .announced?:
                    state.sleeps[id] = .cancelledEarly
                    return nil
                case .waiting(_, let continuation)?:
                    state.sleeps[id] = nil
                    return continuation
                case .cancelledEarly?, nil:
                    return nil  // over already
                }
            }
            continuation?.resume(throwing: CancellationError())
        }
    }
}
