import Dispatch
import Synchronization
import TributaryStore

/// Group commit: concurrent callers of one process share one durable write transaction.
///
/// Callers queue a prepared event and get a ``PendingTrack``. One drain loop on a private serial queue
/// (so the blocking fsync never occupies a Swift concurrency thread) takes everything queued, appends
/// it in one transaction, and only after that transaction has committed completes each pending event
/// with its own receipt. No pending event is ever completed before the transaction holding it is
/// durable. A batch the store has no room for as a whole is split, so that only the events that do not
/// fit get `storeFull` (``commit(_:)``).
///
/// The queue is bounded (`maxQueued` events, and `maxQueuedBytes` of them): ``enqueue(_:)`` suspends
/// while it is full, so callers that queue faster than the disk commits are slowed to the disk's pace
/// rather than growing memory. The byte bound admits an event while the queue holds less than it, so
/// the last one admitted may take the queue past it by its own size: a large event waits no longer for
/// room than a small one (with room only for what fits, small events could keep it out for ever).
///
/// Gathering: callers that wait for each event (`track`) usually come straight back with their next
/// one, but they need a few tens of microseconds to prepare it, while the callers that queued during
/// the commit are ready at once. Starting the next transaction immediately would commit only those,
/// and the callers would settle into two cohorts of half the callers each, one transaction each (with
/// 8 callers, 4 events per fsync). So after a transaction of more than one event, the loop waits until
/// as many events as it just completed have queued again, or `gatherLimit` (a quarter of that
/// commit's duration, at most 1 ms) has passed, whichever comes first. A lone caller never waits, and
/// a full transaction's worth already queued starts at once.
final class GroupCommitter: Sendable {
    private struct State {
        var queued: [PendingTrack] = []
        /// The encoded bytes of the events in `queued`.
        var queuedBytes = 0
        var draining = false
        /// While the drain loop gathers: wake it when `queued` reaches this count.
        var gatherUntil: Int?
        /// Callers of `enqueue` waiting for room in the queue.
        var waitingForRoom: [CheckedContinuation<Void, Never>] = []
        /// The event queued last: while `draining`, what ``appendAfterQueued(_:)`` waits for.
        var lastQueued: PendingTrack?
    }

    private let store: SharedStore
    private let producer: SharedStore.Producer
    private let maxBatch: Int
    private let maxQueued: Int
    private let maxQueuedBytes: Int
    private let state = Mutex(State())
    private let queue = DispatchQueue(label: "tributary.group-commit")
    /// Signalled (once) when `queued` reaches `gatherUntil`.
    private let gathered = DispatchSemaphore(value: 0)

    init(store: SharedStore, producer: SharedStore.Producer, maxBatch: Int, maxQueued: Int, maxQueuedBytes: Int) {
        self.store = store
        self.producer = producer
        self.maxBatch = maxBatch
        self.maxQueued = max(maxQueued, maxBatch)
        self.maxQueuedBytes = maxQueuedBytes
    }

    /// Whether the queue has room for another event: under both bounds.
    private func hasRoom(in state: State) -> Bool {
        state.queued.count < maxQueued && state.queuedBytes < maxQueuedBytes
    }

    /// Queues `event` for the next transaction and resumes once the transaction holding it is durable.
    func commit(_ event: PreparedEvent) async throws -> TrackReceipt {
        try await enqueue(event).receipt()
    }

    /// Queues `event` for a coming transaction; suspends only while the queue is full.
    func enqueue(_ event: PreparedEvent) async -> PendingTrack {
        let pending = PendingTrack(event)
        while !tryEnqueue(pending) {
            await withCheckedContinuation { (room: CheckedContinuation<Void, Never>) in
                let full = state.withLock { state in
                    guard !hasRoom(in: state) else { return false }
                    state.waitingForRoom.append(room)
                    return true
                }
                if !full { room.resume() }
            }
        }
        return pending
    }

    /// Appends `event` in a transaction of its own on the calling thread, once every event queued
    /// before this call has been committed (or has failed): a synchronous `track` after an `enqueue`
    /// keeps the caller's order, as promise 3 wants a producer's events. Blocks the calling thread
    /// until then, and for the commit's fsync.
    /// `changingIdentity` changes the group's identity in the event's transaction (a sign-up, a logout,
    /// an identify); the event is built with the identities after and before the change.
    func appendAfterQueued(
        _ event: PreparedEvent, changingIdentity change: ((inout Identity) -> Void)? = nil
    ) throws -> TrackReceipt {
        waitForQueued()
        var previous: Identity?
        let recordingPrevious = change.map { change in
            { (identity: inout Identity) in
                previous = identity
                change(&identity)
            }
        }
        let appended = try store.append(producer: producer, count: 1, changingIdentity: recordingPrevious) { _, identity in
            event.draft(with: identity, previous: previous)
        }
        var receipt = TrackReceipt(event: event, appended: appended[0])
        if event.identityEvent == .logout, let previous { receipt.distinctID = previous.distinctID }  // the login that ended
        return receipt
    }

    /// Blocks the calling thread until every event queued before this call has been committed (or
    /// has failed). A write of the process's own that must follow them in the store (a synchronous
    /// `track`, `login`, `logout`, `identify`) waits here first.
    func waitForQueued() {
        // Transactions commit in queue order: once the last event queued is done, so is every one before.
        if let last = state.withLock({ $0.draining ? $0.lastQueued : nil }) { last.waitUntilDone() }
    }

    /// Appends `pending` unless the queue is full; starts the drain loop or ends its gathering.
    private func tryEnqueue(_ pending: PendingTrack) -> Bool {
        let (admitted, startDrain, wake) = state.withLock { state in
            guard hasRoom(in: state) else { return (false, false, false) }
            state.queued.append(pending)
            state.queuedBytes += pending.event.byteCount
            state.lastQueued = pending
            if let target = state.gatherUntil, state.queued.count >= target {
                state.gatherUntil = nil
                return (true, false, true)
            }
            if state.draining { return (true, false, false) }
            state.draining = true
            return (true, true, false)
        }
        if wake { gathered.signal() }
        if startDrain { queue.async { self.drain() } }
        return admitted
    }

    private func drain() {
        var previous = (events: 0, nanos: UInt64(0))
        while true {
            if previous.events > 1 { gather(previous.events, limitNanos: min(previous.nanos / 4, 1_000_000)) }
            let (batch, room): ([PendingTrack], [CheckedContinuation<Void, Never>]) = state.withLock { state in
                guard !state.queued.isEmpty else {
                    state.draining = false
                    return ([], [])
                }
                let take = min(state.queued.count, maxBatch)
                let batch = Array(state.queued.prefix(take))
                state.queued.removeFirst(take)
                state.queuedBytes -= batch.reduce(0) { $0 + $1.event.byteCount }
                defer { state.waitingForRoom.removeAll() }
                return (batch, state.waitingForRoom)
            }
            // Every caller waiting for room tries again (each re-checks; the queue just shrank).
            for waiter in room { waiter.resume() }
            if batch.isEmpty { return }
            let started = DispatchTime.now().uptimeNanoseconds
            commit(batch[...])
            previous = (batch.count, DispatchTime.now().uptimeNanoseconds - started)
        }
    }

    /// Appends `batch` in one transaction and, once it has committed, completes each of its events.
    ///
    /// A batch the store has no room for as a whole (`storeFull`) is split in two halves, committed (or
    /// split again) one after the other: an event is refused `storeFull` only when it does not fit
    /// after every event queued before it was stored or refused, as when each is tracked on its own (a
    /// refused `track` stores nothing, and the next one is stored if it fits). The events that fit
    /// still commit in queue order, each half's after the one before it. Any other failure fails the
    /// whole batch.
    private func commit(_ batch: ArraySlice<PendingTrack>) {
        do {
            let appended = try store.append(producer: producer, count: batch.count) { index, identity in
                batch[batch.startIndex + index].event.draft(with: identity)
            }
            for (pending, where_) in zip(batch, appended) {
                pending.complete(.success(TrackReceipt(event: pending.event, appended: where_)))
            }
        } catch let error as StoreError where error.code == .storeFull && batch.count > 1 {
            let middle = batch.startIndex + batch.count / 2
            commit(batch[..<middle])
            commit(batch[middle...])
        } catch {
            for pending in batch { pending.complete(.failure(error)) }
        }
    }

    /// Waits until `count` more events than are queued now have been queued, or `limitNanos` passed.
    private func gather(_ count: Int, limitNanos: UInt64) {
        let waiting = state.withLock { state in
            let target = min(state.queued.count + count, maxBatch)
            // A full queue (callers waiting for room) gets no more events until this loop takes some.
            guard state.queued.count < target, limitNanos > 0, hasRoom(in: state) else { return false }
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

/// An event queued for a group commit (``Tracker/enqueue(_:properties:)``): not durable until
/// ``receipt()`` returns.
///
/// If the process ends before the transaction holding the event commits, the event is lost, exactly
/// as an event whose `track` call had not returned yet would be. ``receipt()`` may be awaited any
/// number of times, from any task.
public final class PendingTrack: Sendable {
    private enum Outcome {
        /// The tasks awaiting ``receipt()`` and the threads blocked in ``waitUntilDone()``.
        case waiting([CheckedContinuation<TrackReceipt, any Error>], [DispatchSemaphore])
        case done(Result<TrackReceipt, any Error>)
    }

    let event: PreparedEvent
    private let outcome = Mutex(Outcome.waiting([], []))

    /// The event's unique id (`event_id`), known before it is durable.
    public var eventID: String { event.eventID }

    init(_ event: PreparedEvent) { self.event = event }

    /// Resumes once the event is durable in the shared store, with its receipt; throws the store's
    /// error if the transaction holding it failed (the event is then not stored).
    public func receipt() async throws -> TrackReceipt {
        if case .done(let result) = outcome.withLock({ $0 }) { return try result.get() }
        return try await withCheckedThrowingContinuation { continuation in
            let result: Result<TrackReceipt, any Error>? = outcome.withLock { outcome in
                switch outcome {
                case .done(let result): return result
                case .waiting(var waiters, let blocked):
                    waiters.append(continuation)
                    outcome = .waiting(waiters, blocked)
                    return nil
                }
            }
            if let result { continuation.resume(with: result) }
        }
    }

    /// Blocks the calling thread until the transaction holding the event has committed or failed.
    func waitUntilDone() {
        let semaphore = DispatchSemaphore(value: 0)
        let waiting = outcome.withLock { outcome in
            guard case .waiting(let waiters, var blocked) = outcome else { return false }
            blocked.append(semaphore)
            outcome = .waiting(waiters, blocked)
            return true
        }
        if waiting { semaphore.wait() }
    }

    func complete(_ result: Result<TrackReceipt, any Error>) {
        let (waiters, blocked) = outcome.withLock { outcome in
            guard case .waiting(let waiters, let blocked) = outcome else {
                return ([CheckedContinuation<TrackReceipt, any Error>](), [DispatchSemaphore]())
            }
            outcome = .done(result)
            return (waiters, blocked)
        }
        for waiter in waiters { waiter.resume(with: result) }
        for thread in blocked { thread.signal() }
    }
}
