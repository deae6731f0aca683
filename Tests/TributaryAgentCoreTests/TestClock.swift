import Synchronization

/// A clock that moves only when a test advances it: the agent loop's decisions (``LoopMachine``) run
/// on it step by step, with no sleeps.
final class TestClock: Clock, Sendable {
    struct Instant: InstantProtocol {
        /// Time since the clock's start.
        var offset: Duration

        func advanced(by duration: Duration) -> Instant { Instant(offset: offset + duration) }
        func duration(to other: Instant) -> Duration { other.offset - offset }
        static func < (lhs: Instant, rhs: Instant) -> Bool { lhs.offset < rhs.offset }
    }

    private struct State {
        var now = Instant(offset: .zero)
        var sleepers: [(until: Instant, continuation: CheckedContinuation<Void, any Error>)] = []
    }

    private let state = Mutex(State())

    var now: Instant { state.withLock { $0.now } }
    var minimumResolution: Duration { .nanoseconds(1) }

    /// Moves the clock on by `duration`, waking every sleeper whose time has come.
    func advance(by duration: Duration) {
        let due = state.withLock { state in
            state.now = state.now.advanced(by: duration)
            let now = state.now
            let due = state.sleepers.filter { $0.until <= now }
            state.sleepers.removeAll { $0.until <= now }
            return due.map(\.continuation)
        }
        for continuation in due { continuation.resume() }
    }

    func sleep(until deadline: Instant, tolerance: Duration?) async throws {
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
            let now = state.withLock { state -> Bool in
                guard deadline > state.now else { return true }
                state.sleepers.append((deadline, continuation))
                return false
            }
            if now { continuation.resume() }
        }
    }
}
