import Synchronization

/// Wakes the agent's loop early: a flush request, or a shutdown.
///
/// ``wait(timeout:)`` returns when ``signal()`` is called (or was called since the last wait), when
/// the timeout passes, or when the waiting task is cancelled — whichever comes first.
final class Wakeup: Sendable {
    private struct State {
        var pending = false
        var waiter: CheckedContinuation<Void, Never>?
    }

    private let state = Mutex(State())

    /// Wakes the current or next waiter.
    func signal() {
        let waiter = state.withLock { state -> CheckedContinuation<Void, Never>? in
            if let waiter = state.waiter {
                state.waiter = nil
                return waiter
            }
            state.pending = true
            return nil
        }
        waiter?.resume()
    }

    /// Ends the current wait, if any, without leaving a signal pending.
    private func interrupt() {
        state.withLock { state in
            let waiter = state.waiter
            state.waiter = nil
            return waiter
        }?.resume()
    }

    /// Waits for a signal, the timeout or cancellation.
    func wait(timeout: Duration) async {
        guard timeout > .zero, !Task.isCancelled else { return }
        let timer = Task { [weak self] in
            try? await Task.sleep(for: timeout)
            self?.interrupt()
        }
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let resumeNow = state.withLock { state -> Bool in
                    if state.pending || Task.isCancelled {
                        state.pending = false
                        return true
                    }
                    state.waiter = continuation
                    return false
                }
                if resumeNow { continuation.resume() }
            }
        } onCancel: {
            interrupt()
        }
        timer.cancel()
    }
}
