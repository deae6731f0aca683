import Synchronization

/// Wakes the agent's loop early: a flush request, or a shutdown.
///
/// ``wait(until:)`` returns when ``signal()`` is called (or was called since the last wait), when
/// the timeout passes, or when the waiting task is cancelled — whichever comes first. Each wait has
/// an id, so a timeout or cancellation that fires before the waiter has registered is not lost.
final class Wakeup: Sendable {
    private struct State {
        var pending = false
        var nextID: UInt64 = 0
        var waiter: (id: UInt64, continuation: CheckedContinuation<Void, Never>)?
        /// The wait whose timeout or cancellation fired before it registered.
        var endedEarly: UInt64?
    }

    private let state = Mutex(State())
    /// What a wait's timeout is measured on.
    private let clock: any AgentClock

    init(clock: any AgentClock = SystemClock()) { self.clock = clock }

    /// Wakes the current or next waiter.
    func signal() {
        let waiter = state.withLock { state -> CheckedContinuation<Void, Never>? in
            if let waiter = state.waiter {
                state.waiter = nil
                return waiter.continuation
            }
            state.pending = true
            return nil
        }
        waiter?.resume()
    }

    /// Ends wait `id` (its timeout passed or its task was cancelled), whether or not it has registered
    /// yet. An end that comes late, for a wait already over, changes nothing: recording it would
    /// overwrite the early end of the wait after it, which would then sleep without a timeout.
    func end(_ id: UInt64) {
        state.withLock { state -> CheckedContinuation<Void, Never>? in
            if let waiter = state.waiter, waiter.id == id {
                state.waiter = nil
                return waiter.continuation
            }
            if id == state.nextID { state.endedEarly = id }
            return nil
        }?.resume()
    }

    /// Waits for a signal, the timeout or cancellation; with no timeout, for a signal or cancellation
    /// only (no timer: nothing wakes the process meanwhile).
    func wait(timeout: Duration?) async {
        await wait(until: timeout.map { clock.now + $0 })
    }

    /// Waits for a signal, the clock reaching `deadline`, or cancellation; with no deadline, for a signal
    /// or cancellation only (no timer: nothing wakes the process meanwhile). The timer is a child task
    /// of the wait: the first of the two to end ends the other. The deadline is an instant, not a time
    /// from now: a wait that starts late (the clock moved meanwhile, as a test's manual clock does)
    /// still ends when it was meant to.
    func wait(until deadline: ContinuousClock.Instant?) async {
        guard let deadline else {
            guard !Task.isCancelled else { return }
            await park(begin())
            return
        }
        guard deadline > clock.now, !Task.isCancelled else { return }
        let id = begin()
        await withTaskGroup(of: Void.self) { group in
            group.addTask {
                // Cancelled: the wait is over already.
                guard (try? await self.clock.sleep(until: deadline)) != nil else { return }
                self.end(id)
            }
            await park(id)
            group.cancelAll()
        }
    }

    /// Starts wait number `id`: its timer may end it from here on, even before ``park(_:)`` registers it.
    func begin() -> UInt64 {
        state.withLock { state -> UInt64 in
            state.nextID += 1
            return state.nextID
        }
    }

    /// Sleeps as wait `id` until a signal, ``end(_:)`` of `id` (which may have come already), or
    /// cancellation.
    func park(_ id: UInt64) async {
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let resumeNow = state.withLock { state -> Bool in
                    if state.pending || state.endedEarly == id {
                        state.pending = false
                        state.endedEarly = nil
                        return true
                    }
                    state.waiter = (id, continuation)
                    return false
                }
                if resumeNow { continuation.resume() }
            }
        } onCancel: {
            end(id)
        }
    }
}
