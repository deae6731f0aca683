import Dispatch
import Synchronization
import TributaryStore

/// Group commit: concurrent async `track` callers of one process share one durable write transaction.
///
/// Callers enqueue a prepared event and suspend. One drain loop on a private serial queue (so the
/// blocking fsync never occupies a Swift concurrency thread) takes everything queued, appends it in
/// one transaction, and only after that transaction has committed resumes each caller with its own
/// receipt. A caller is never resumed before the transaction holding its event is durable.
final class GroupCommitter: Sendable {
    private struct Waiter {
        var event: PreparedEvent
        var continuation: CheckedContinuation<TrackReceipt, any Error>
    }

    private struct State {
        var queued: [Waiter] = []
        var draining = false
    }

    private let store: SharedStore
    private let producer: SharedStore.Producer
    private let maxBatch: Int
    private let state = Mutex(State())
    private let queue = DispatchQueue(label: "tributary.group-commit")

    init(store: SharedStore, producer: SharedStore.Producer, maxBatch: Int) {
        self.store = store
        self.producer = producer
        self.maxBatch = maxBatch
    }

    func commit(_ event: PreparedEvent) async throws -> TrackReceipt {
        try await withCheckedThrowingContinuation { continuation in
            let startDrain = state.withLock { state in
                state.queued.append(Waiter(event: event, continuation: continuation))
                if state.draining { return false }
                state.draining = true
                return true
            }
            if startDrain { queue.async { self.drain() } }
        }
    }

    private func drain() {
        while true {
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
        }
    }
}
