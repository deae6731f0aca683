import Synchronization

/// Set once when some work has finished, for the work running beside it: the upload steps (the drain
/// stops after its chunk) and the drain (the upload steps stop after the request in flight).
final class DoneFlag: Sendable {
    private let done = Atomic<Bool>(false)
    var isSet: Bool { done.load(ordering: .acquiring) }
    func set() { done.store(true, ordering: .releasing) }
}

/// The agent's run flags, set from other tasks (a signal handler, the flush socket) and read by the loop.
final class RunFlags: Sendable {
    /// A flush was asked for and the loop has not taken it yet.
    let flushRequested = Atomic<Bool>(false)
    /// A stop was asked for.
    let stopping = Atomic<Bool>(false)
    /// The shared store changed (``WakeSources``) and the loop has not read its settings since.
    let storeChanged = Atomic<Bool>(false)
    /// Set by the first run: an agent releases its locks when its run ends, so it runs once.
    let started = Atomic<Bool>(false)
}

/// The agent's current background task, shared by the loop, the stop handler and the request watcher.
final class BudgetSlot: Sendable {
    private let slot = Mutex<BackgroundTask?>(nil)
    /// Signalled on every update: the request watcher sleeps until the expiration it knows, and a stop
    /// that brings it closer wakes it.
    private let changed: Wakeup
    private let clock: any AgentClock
    var current: BackgroundTask? { slot.withLock { $0 } }

    init(clock: any AgentClock) {
        self.clock = clock
        changed = Wakeup(clock: clock)
    }

    func update<R>(_ body: (inout BackgroundTask?) -> R) -> R {
        defer { changed.signal() }
        return slot.withLock { body(&$0) }
    }

    /// Returns once the task's expiration or `limit`, whichever comes first, has passed (true), or when
    /// the waiting task is cancelled (false). No polling: it sleeps until the nearer of the two, and
    /// looks again when ``update(_:)`` changes the task.
    func waitForExpiry(orUntil limit: ContinuousClock.Instant) async -> Bool {
        while !Task.isCancelled {
            let until = current.map { min($0.expiresAt, limit) } ?? limit
            let now = clock.now
            if now >= until { return true }
            await changed.wait(until: until)
        }
        return false
    }
}

/// Resumes a continuation the first time ``resume()`` is called; later calls do nothing.
final class ResumeOnce: Sendable {
    private let continuation: Mutex<CheckedContinuation<Void, Never>?>
    init(_ continuation: CheckedContinuation<Void, Never>) { self.continuation = Mutex(continuation) }
    func resume() { continuation.withLock { c in defer { c = nil }; return c }?.resume() }
}
