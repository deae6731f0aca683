import Testing
import TributaryStore

@testable import TributaryAgentCore

@Suite("Watchdog heartbeat")
struct HeartbeatTests {
    @Test("a request past its timeout counts as progress until the step has cancelled it and applied the outcome")
    func requestAnswerGrace() {
        // Times given, not slept: a loaded machine running the other suites delays a sleep by seconds.
        let heartbeat = Heartbeat()
        let start = BootClock.nowNanos() + 10_000_000_000  // past the beat made at creation
        let ms: UInt64 = 1_000_000
        heartbeat.requestStarted(timeout: .milliseconds(100), at: start)
        // Past the request's timeout, within the second the step still waits for its answer
        // (``Heartbeat/answerGrace``): a watchdog ping skipped now would leave a gap of a whole interval.
        #expect(heartbeat.isAlive(within: .milliseconds(50), at: start + 600 * ms))
        // And the second more for applying its outcome; not after that.
        #expect(heartbeat.isAlive(within: .milliseconds(50), at: start + 2_050 * ms))
        #expect(!heartbeat.isAlive(within: .milliseconds(50), at: start + 2_150 * ms))
        heartbeat.requestEnded()
        #expect(heartbeat.isAlive(within: .milliseconds(500)), "the end of a request is a beat")
    }

    @Test("a loop asleep between turns is alive however long it sleeps; it beats when it wakes")
    func sleepingIsAlive() async {
        let heartbeat = Heartbeat()
        let later = BootClock.nowNanos() + 60_000_000_000  // a minute on: the beat made at creation is stale
        let wakeup = Wakeup()
        let asleep = DoneFlag()
        async let slept: Void = heartbeat.sleeping {
            asleep.set()
            await wakeup.wait(timeout: nil)
        }
        while !asleep.isSet { await Task.yield() }
        #expect(heartbeat.isAlive(within: .milliseconds(100), at: later))
        wakeup.signal()
        await slept
        #expect(!heartbeat.isAlive(within: .milliseconds(100), at: later))
        #expect(heartbeat.isAlive(within: .seconds(5)), "waking is a beat")
    }

    @Test("a loop that neither beats nor has a request out is not alive")
    func stalled() async throws {
        let heartbeat = Heartbeat()
        try await Task.sleep(for: .milliseconds(200))
        #expect(!heartbeat.isAlive(within: .milliseconds(100)))
        heartbeat.beat()
        #expect(heartbeat.isAlive(within: .milliseconds(100)))
    }
}
