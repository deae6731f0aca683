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
        // Alone this takes a few ms; the bound allows for the whole suite sharing two threads.
        #expect(clock.now - began < .seconds(20))
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
}
