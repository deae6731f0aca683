import Dispatch
import Foundation
import Logging
import Metrics
#if canImport(Glibc)
import Glibc
#endif
import Synchronization
import TributaryStore

/// The drain's store deletes, run on a thread of their own and waited for a bounded time.
///
/// A delete is an LMDB write transaction, and LMDB has one writer at a time: a producer holds the
/// writer lock through each of its commits. A producer stopped inside one (SIGSTOP, a debugger, a
/// frozen cgroup: on iOS, the app-group process suspended holding a file lock that 0xdead10cc kills)
/// would hold the agent's loop in `mdb_txn_begin` for as long as it stays stopped, and with it the
/// uploads, the deadline and the stop (promise 5). Here the loop waits at most ``patience``; a delete
/// still waiting then goes on waiting on its own thread, and the drain takes nothing more until it is
/// done. Waiting loses nothing: the chunk is already committed to the outbox, and a delete that never
/// runs (the agent exits first) leaves events the next drain skips as drained and deletes.
///
/// The delete's closure holds the store, so the store's environment is never closed under a
/// transaction still waiting to begin; the process's exit ends that wait.
///
/// A delete holds the writer lock every producer's append needs, for one chunk's records (at most
/// `AgentConfiguration.drainChunk`, 2,000) and its commit's two fsyncs: how long, each time, goes to
/// the `tributary_store_lock_hold_seconds` metric and ``holdTimes()`` (docs/performance.md).
public final class StoreDeletes: Sendable {
    /// How long the drain waits for a delete before leaving it to finish on its own. An ordinary
    /// delete (one commit, one fsync) takes milliseconds; a longer wait is what a deadline can afford
    /// (the agent plans to be done its grace period early, 1 s by default).
    public let patience: Duration
    /// After how long a delete still waiting is logged as a held writer lock.
    public let reportAfter: Duration

    private let state = Mutex(State())
    private let logger: Logger
    private let onFinished: @Sendable () -> Void
    /// The agent's fail-stop latch: once tripped, no delete runs; a delete's I/O error trips it.
    let fatalIO: FatalIO.Latch
    private let holds = Mutex(HoldRecord())
    private let holdMetric = Metrics.Timer(label: "tributary_store_lock_hold_seconds", preferredDisplayUnit: .seconds)

    /// The latest hold times, oldest first, at most ``HoldRecord/capacity`` of them.
    struct HoldRecord {
        static let capacity = 4096
        var times: [Duration] = []
        var next = 0

        mutating func add(_ time: Duration) {
            if times.count < Self.capacity {
                times.append(time)
            } else {
                times[next] = time
                next = (next + 1) % Self.capacity
            }
        }

        var ordered: [Duration] { Array(times[next...] + times[..<next]) }
    }

    private struct State {
        /// The delete in flight: the last seq it deletes through, and when it started.
        var inFlight: (seq: UInt64, since: ContinuousClock.Instant)?
        /// Whether the drain stopped waiting for the delete in flight.
        var leftWaiting = false
        /// Whether the long wait of the delete in flight was logged.
        var reported = false
        /// A delete's failure that arrived after the drain stopped waiting; thrown by the next drain.
        var failure: (any Error)?
    }

    /// `onFinished` is called when a delete the drain stopped waiting for has ended (the agent wakes
    /// its loop with it, which otherwise would find out at its next poll).
    public convenience init(
        patience: Duration = .milliseconds(250), reportAfter: Duration = .seconds(5), logger: Logger,
        onFinished: @escaping @Sendable () -> Void = {}
    ) {
        self.init(patience: patience, reportAfter: reportAfter, logger: logger, fatalIO: FatalIO.Latch(), onFinished: onFinished)
    }

    /// The store deletes of an agent whose fail-stop latch is `fatalIO`.
    init(
        patience: Duration = .milliseconds(250), reportAfter: Duration = .seconds(5), logger: Logger,
        fatalIO: FatalIO.Latch, onFinished: @escaping @Sendable () -> Void = {}
    ) {
        self.fatalIO = fatalIO
        self.patience = patience
        self.reportAfter = reportAfter
        self.logger = logger
        self.onFinished = onFinished
    }

    /// Waits up to `limit` for a delete still waiting; returns whether none is waiting any more.
    public func awaitPending(upTo limit: Duration) -> Bool {
        let clock = ContinuousClock()
        let end = clock.now + limit
        while state.withLock({ $0.inFlight != nil }) {
            guard clock.now < end else { return false }
            usleep(5_000)
        }
        return true
    }

    /// Whether a delete is still waiting for the store's writer lock. Logs, once per wait, a wait
    /// longer than ``reportAfter``.
    public var isWaiting: Bool {
        let (waiting, report) = state.withLock { state -> (Bool, Duration?) in
            guard let inFlight = state.inFlight else { return (false, nil) }
            let waited = ContinuousClock.now - inFlight.since
            guard !state.reported, waited >= reportAfter else { return (true, nil) }
            state.reported = true
            return (true, waited)
        }
        if let report {
            logger.warning(
                "another process has held the shared store's write lock for \(report.seconds) s (stopped or frozen inside a transaction?); draining is paused, uploads go on, nothing is lost",
                metadata: ["tributary.waited_s": "\(report.seconds)"])
        }
        return waiting
    }

    /// How long the latest deletes (up to 4,096) held the store's writer lock, oldest first.
    public func holdTimes() -> [Duration] { holds.withLock { $0.ordered } }

    /// Throws the failure of a delete that ended after the drain stopped waiting for it, once.
    public func rethrowLateFailure() throws {
        if let failure = state.withLock({ state in
            defer { state.failure = nil }; return state.failure
        }) {
            throw failure
        }
    }

    /// Deletes `store`'s events through `seq`. Returns true once the delete is done, false if it still
    /// waits after ``patience`` (it then goes on by itself: see ``isWaiting``); throws its failure if it
    /// failed within that time.
    public func delete(through seq: UInt64, in store: SharedStore) throws -> Bool {
        state.withLock { state in
            precondition(state.inFlight == nil, "a delete is already in flight: check isWaiting first")
            // A late failure not yet taken stays for rethrowLateFailure().
            state.inFlight = (seq, .now)
            state.leftWaiting = false
            state.reported = false
        }
        let outcome = Mutex<Result<Int, any Error>?>(nil)
        let done = DispatchSemaphore(value: 0)
        // A thread for each delete (at most one is in flight: the precondition above): one chunk's delete
        // costs two fsyncs, beside which starting a thread is nothing; a dispatch queue would start
        // libdispatch's pool and its once-a-second monitor (EventLoopSleep).
        Thread.detachNewThread { [self] in
            let result = Result { () throws -> Int in
                try fatalIO.check()
                do {
                    return try store.deleteEvents(through: seq) { held in
                        self.holds.withLock { $0.add(held) }
                        self.holdMetric.recordNanoseconds(Int64(held.seconds * 1e9))
                    }
                } catch where FatalIO.matches(error) {
                    throw fatalIO.trip(error, keeping: store)
                }
            }
            let (leftWaiting, waited) = state.withLock { state -> (Bool, Duration) in
                let waited = state.inFlight.map { ContinuousClock.now - $0.since } ?? .zero
                let left = state.leftWaiting
                if left, case .failure(let error) = result { state.failure = error }
                state.inFlight = nil
                state.leftWaiting = false
                state.reported = false
                return (left, waited)
            }
            if leftWaiting, case .success = result {
                logger.notice(
                    "the shared store's write lock is free again: drained events deleted from the store, draining goes on",
                    metadata: ["tributary.waited_s": "\(waited.seconds)"])
            }
            outcome.withLock { $0 = result }
            done.signal()
            if leftWaiting { onFinished() }
        }
        let nanos = Int(min(patience.seconds, 3600) * 1e9)
        if done.wait(timeout: .now() + .nanoseconds(nanos)) == .timedOut {
            // Finished between the timeout and here? Then it is done after all, and its outcome is ours.
            let stillWaiting = state.withLock { state -> Bool in
                guard state.inFlight != nil else { return false }
                state.leftWaiting = true
                return true
            }
            if stillWaiting { return false }
            done.wait()
        }
        switch outcome.withLock({ $0 }) {
        case .failure(let error): throw error
        default: return true
        }
    }
}
