import Synchronization
import Testing

@testable import TributaryAgentCore

/// The clock the whole-agent tests move themselves (``ManualClock``), and the loop's wait on it.
@Suite("ManualClock", .timeLimit(.minutes(1)))
struct ManualClockTests {
    @Test("sleepers wake when the clock reaches their instant, not before; nextDeadline names the earliest")
    func advanceWakesDue() async throws {
        let clock = ManualClock()
        let start = clock.now
        let woke = Flags()
        let sleepers = (1...3).map { seconds in
            Task {
                try await clock.sleep(until: start + .seconds(seconds))
                woke.set(seconds)
            }
        }
        while clock.sleeperCount < 3 { await Task.yield() }
        #expect(await clock.nextDeadline() == start + .seconds(1))
        clock.advance(by: .milliseconds(1_500))
        try await sleepers[0].value
        #expect(woke.values == [1])
        #expect(await clock.nextDeadline() == start + .seconds(2))
        clock.advance(to: start + .seconds(3))
        for sleeper in sleepers { try await sleeper.value }
        #expect(woke.values == [1, 2, 3])
        #expect(clock.now == start + .seconds(3))
        // An instant already passed returns at once.
        try await clock.sleep(until: start)
    }

    @Test("a cancelled sleeper throws CancellationError and leaves the clock's sleepers")
    func cancellation() async {
        let clock = ManualClock()
        let sleeper = Task { try await clock.sleep(until: clock.now + .seconds(60)) }
        while clock.sleeperCount < 1 { await Task.yield() }
        sleeper.cancel()
        await #expect(throws: CancellationError.self) { try await sleeper.value }
        #expect(clock.sleeperCount == 0)
        // Cancelled before it sleeps: it never registers.
        let early = Task {
            withUnsafeCurrentTask { $0?.cancel() }
            try await clock.sleep(until: clock.now + .seconds(60))
        }
        await #expect(throws: CancellationError.self) { try await early.value }
        #expect(clock.sleeperCount == 0)
    }

    @Test("a wait that starts after the clock moved still ends at its instant, not a whole timeout later")
    func waitUntilInstant() async {
        let clock = ManualClock()
        let wakeup = Wakeup(clock: clock)
        let deadline = clock.now + .seconds(10)
        clock.advance(by: .seconds(4))  // the loop decided, then the clock moved before it began to wait
        let waiting = Task { await wakeup.wait(until: deadline) }
        #expect(await clock.nextDeadline() == deadline)
        clock.advance(to: deadline)
        await waiting.value
        // Past its instant, it does not wait at all.
        await wakeup.wait(until: deadline)
    }
}

/// Which sleepers woke, in order.
private final class Flags: Sendable {
    private let woke = Mutex<[Int]>([])
    func set(_ value: Int) { woke.withLock { $0.append(value) } }
    var values: [Int] { woke.withLock { $0 } }
}
