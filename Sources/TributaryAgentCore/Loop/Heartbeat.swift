import Synchronization
import TributaryStore

/// The main loop's pulse, read by the watchdog pinger.
final class Heartbeat: Sendable {
    private let lastBeat = Atomic<UInt64>(BootClock.nowNanos())
    private let requestDeadline = Atomic<UInt64>(0)
    private let parked = Atomic<Bool>(false)

    func beat() { lastBeat.store(BootClock.nowNanos(), ordering: .releasing) }

    /// Runs `wait`, the loop's sleep between turns, during which the loop counts as alive: it waits for
    /// a signal or a timer, and does nothing that could hang. An idle loop need not come round for the
    /// watchdog's sake (it did, four times a watchdog interval). It beats when the wait ends.
    func sleeping(_ wait: () async -> Void) async {
        parked.store(true, ordering: .releasing)
        await wait()
        parked.store(false, ordering: .releasing)
        beat()
    }

    /// How long after its timeout a request's answer may still be read before the step cancels it.
    static let answerGrace: Duration = .seconds(1)

    /// A request with `timeout` is out: the loop counts as alive until the step ends it, at most
    /// ``answerGrace`` after the timeout, and applies its outcome (a second more for that: a synced
    /// outbox write on a loaded machine). A watchdog ping that found it dead in between would leave a
    /// gap of a whole watchdog interval.
    func requestStarted(timeout: Duration, at now: UInt64 = BootClock.nowNanos()) {
        let until = max(.zero, timeout) + Self.answerGrace + .seconds(1)
        requestDeadline.store(now + UInt64(until.seconds * 1e9), ordering: .releasing)
    }

    func requestEnded() {
        requestDeadline.store(0, ordering: .releasing)
        beat()
    }

    /// The loop is asleep between turns (``sleeping(_:)``), beat within `window` before `now` (boot-clock
    /// nanoseconds), or is awaiting a request that has not yet timed out.
    func isAlive(within window: Duration, at now: UInt64 = BootClock.nowNanos()) -> Bool {
        if parked.load(ordering: .acquiring) { return true }
        let beat = lastBeat.load(ordering: .acquiring)
        return now - min(now, beat) <= UInt64(window.seconds * 1e9) || now < requestDeadline.load(ordering: .acquiring)
    }
}
