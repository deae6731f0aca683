import Testing

@testable import TributaryAgentCore

@Suite("Wakeup")
struct WakeupTests {
    // A lost timeout would leave its wait hanging for good: the time limit turns that into a failure.
    @Test("many very short waits all return (a timeout firing before the waiter registers is not lost)",
          .timeLimit(.minutes(1)))
    func shortTimeouts() async {
        let wakeup = Wakeup()
        let clock = ContinuousClock()
        let began = clock.now
        for _ in 0..<2000 { await wakeup.wait(timeout: .nanoseconds(1)) }
        // Alone this takes a few ms. The bound allows for the whole suite sharing two threads: each of the
        // 2,000 waits is a suspension that waits for one, and in a fresh-clone CI run they took 22 s. A lost
        // timeout is a wait that never ends, which the minute's time limit catches.
        #expect(clock.now - began < .seconds(50))
    }

    @Test("a signal given before the wait ends it at once; cancellation ends it too")
    func signalAndCancel() async {
        // Each wait would last 60 s if the signal or the cancellation were missed. The bound is far below
        // that but far above scheduling: in `make test` every suite runs at once on a cooperative pool of
        // two threads here, and a task can wait seconds for one (alone, this test takes 16 ms).
        let wakeup = Wakeup()
        wakeup.signal()
        let clock = ContinuousClock()
        let began = clock.now
        await wakeup.wait(timeout: .seconds(60))
        #expect(clock.now - began < .seconds(20))
        let waiting = Task { await wakeup.wait(timeout: .seconds(60)) }
        waiting.cancel()
        await waiting.value
        #expect(clock.now - began < .seconds(20))
    }

    /// Parks wait `id` and reports whether it returned within `patience`; a wait still parked then is
    /// cancelled, which ends it, so the test itself never hangs.
    static func returns(_ wakeup: Wakeup, _ id: UInt64, within patience: Duration) async -> Bool {
        await withTaskGroup(of: Bool.self) { group in
            group.addTask { await wakeup.park(id); return true }
            group.addTask { try? await Task.sleep(for: patience); return false }
            let first = await group.next()!
            group.cancelAll()
            return first
        }
    }

    // The order that hung the agent's loop for good: wait 2's timer fires before wait 2 parks, then wait 1's
    // timer, late, fires as well. Driven step by step, since the timers' own timing almost never gives it.
    @Test("a late end of the previous wait does not cancel the early end of the current one")
    func lateEndOfPreviousWait() async {
        let wakeup = Wakeup()
        let first = wakeup.begin()
        wakeup.end(first)
        #expect(await Self.returns(wakeup, first, within: .seconds(30)))
        let second = wakeup.begin()
        wakeup.end(second)  // early: before the wait parks
        wakeup.end(first)  // late: wait 1 is over
        // 30 s: far above scheduling on a loaded machine; without the early end kept, the wait never returns.
        #expect(await Self.returns(wakeup, second, within: .seconds(30)), "wait 2 lost its early end")
    }

    @Test("an end for a wait not yet begun is not kept for it")
    func endOfFutureWaitIgnored() async {
        let wakeup = Wakeup()
        wakeup.end(1)
        let id = wakeup.begin()
        #expect(id == 1)
        // Nothing ended wait 1 after it began: it parks until the test's patience runs out.
        #expect(await Self.returns(wakeup, id, within: .milliseconds(200)) == false)
        wakeup.signal()
        #expect(await Self.returns(wakeup, wakeup.begin(), within: .seconds(30)))
    }
}
