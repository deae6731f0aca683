import Dispatch
import Synchronization
import TributaryStore

/// Group commit: concurrent async `track` callers of one process share one durable write transaction.
///
/// Callers enqueue a prepared event and suspend. One drain loop on a private serial queue (so the
/// blocking fsync never occupies a Swift concurrency thread) takes everything queued, appends it in
/// one transaction, and only after that transaction has committed resumes each caller with its own
/// receipt. A caller is never resumed before the transaction holding its event is durable.
///
/// Gathering: the callers just resumed usually come straight back with their next event, but they
/// need a few tens of microseconds to prepare it, while the callers that queued during the commit are
/// ready at once. Starting the next transaction immediately would commit only those, and the callers
/// would settle into two cohorts of half the callers each, one transaction each (with 8 callers, 4
/// events per fsync). So after a transaction of more than one event, the loop waits until as many
/// events as it just acknowledged have queued again, or `gatherLimit` (a quarter of that commit's
/// duration, at most 1 ms) has passed, whichever comes first. A lone caller never waits.
final class GroupCommitter: Sendable {
    private struct Waiter {
        var event: PreparedEvent
        var continuation: CheckedContinuation<TrackReceipt, any Error>
    }

    private struct State {
        var queued: [Waiter] = []
        var draining = false
        /// While the drain loop gathers: wake it when `queued` reaches this count.
        var gatherUntil: Int?
    }

    private let store: SharedStore
    private let producer: SharedStore.Producer
    private let maxBatch: Int
    private let state = Mutex(State())
    private let queue = DispatchQueue(label: "tributary.group-commit")
    /// Signalled (once) when `queued` reaches `gatherUntil`.
    private let gathered = DispatchSemaphore(value: 0)

    init(store: SharedStore, producer: SharedStore.Producer, maxBatch: Int) {
        self.store = store
        self.producer = producer
        self.maxBatch = maxBatch
    }

    func commit(_ event: PreparedEvent) async throws -> TrackReceipt {
        try await withCheckedThrowingContinuation { continuation in
            let (startDrain, wake) = state.withLock { state in
                state.queued.append(Waiter(event: event, continuation: continuation))
                if let target = state.gatherUntil, state.queued.count >= target {
                    state.gatherUntil = nil
                    return (false, true)
                }
                if state.draining { return (false, false) }
                state.draining = true
                return (true, false)
            }
            if wake { gathered.signal() }
            if startDrain { queue.async { self.drain() } }
        }
    }

    private func drain() {
        var previous = (events: 0, nanos: UInt64(0))
        while true {
            if previous.events > 1 { gather(previous.events, limitNanos: min(previous.nanos / 4, 1_000_000)) }
            let batch: [Waiter] = state.withLock { state in
                guard !state.queued.isEmpty else {
                    state.draining = false
                    return []
                }
                let take = min(state.queued.count, maxBatch)
                let batch = Array(state.queued.prefix(take))
                state.queued.removeFirst(take)
                return batch
            }
            if batch.isEmpty { return }
            let started = DispatchTime.now().uptimeNanoseconds
            do {
                let appended = try store.append(producer: producer, count: batch.count) { index, identity in
                    batch[index].event.draft(with: identity)
                }
                for (waiter, where_) in zip(batch, appended) {
                    waiter.continuation.resume(returning: TrackReceipt(event: waiter.event, appended: where_))
                }
            } catch {
                for waiter in batch { waiter.continuation.resume(throwing: error) }
            }
            previous = (batch.count, DispatchTime.now().uptimeNanoseconds - started)
        }
    }

    /// Waits until `count` more events than are queued now have been queued, or `limitNanos` passed.
    private func gather(_ count: Int, limitNanos: UInt64) {
        let waiting = state.withLock { state in
            let target = min(state.queued.count + count, maxBatch)
            guard state.queued.count < target, limitNanos > 0 else { return false }
            state.gatherUntil = target
            return true
        }
        guard waiting else { return }
        if gathered.wait(timeout: .now() + .nanoseconds(Int(limitNanos))) == .timedOut {
            // A caller may have reached the target (and signalled) after the timeout: consume that signal.
            let signalled = state.withLock { state in
                defer { state.gatherUntil = nil }
                return state.gatherUntil == nil
            }
            if signalled { gathered.wait() }
        }
    }
}
