import Synchronization

/// Where the loop stands between turns, for a test that drives the whole agent on a ``ManualClock``:
/// it waits until the loop has done what it could and parks (``next(after:)``), then moves the clock
/// to the instant the loop waits for. Each park is numbered, so one that comes before the test asks
/// is not missed; the run's end is the last "park".
final class LoopParking: Sendable {
    /// A park of the loop: its number, and the instant it waits until (nil: a signal only), or the
    /// run's end.
    struct Park: Sendable, Equatable {
        var number: Int
        var until: ContinuousClock.Instant?
        var ended = false
    }

    private struct State {
        var last = Park(number: 0, until: nil)
        var waiters: [(after: Int, continuation: CheckedContinuation<Park, Never>)] = []
    }

    private let state = Mutex(State())

    /// The loop parks until `until` (nil: until a signal).
    func parked(until: ContinuousClock.Instant?) { publish { Park(number: $0 + 1, until: until) } }

    /// The run is over: no more parks.
    func ended() { publish { Park(number: $0 + 1, until: nil, ended: true) } }

    /// The first park numbered above `number` (the run's end counts), once it has come.
    func next(after number: Int) async -> Park {
        await withCheckedContinuation { (continuation: CheckedContinuation<Park, Never>) in
            let ready = state.withLock { state -> Park? in
                if state.last.number > number || state.last.ended { return state.last }
                state.waiters.append((number, continuation))
                return nil
            }
            if let ready { continuation.resume(returning: ready) }
        }
    }

    private func publish(_ make: (Int) -> Park) {
        let (park, due) = state.withLock { state -> (Park, [CheckedContinuation<Park, Never>]) in
            state.last = make(state.last.number)
            let due = state.waiters.filter { $0.after < state.last.number }.map(\.continuation)
            state.waiters.removeAll { $0.after < state.last.number }
            return (state.last, due)
        }
        for continuation in due { continuation.resume(returning: park) }
    }
}
