import Testing

@testable import TributaryAgentCore

@Suite("Wakeup")
struct WakeupTests {
    @Test("many very short waits all return (a timeout firing before the waiter registers is not lost)")
    func shortTimeouts() async {
        let wakeup = Wakeup()
        for _ in 0..<2000 { await wakeup.wait(timeout: .nanoseconds(1)) }
    }

    @Test("a signal given before the wait ends it at once; cancellation ends it too")
    func signalAndCancel() async {
        let wakeup = Wakeup()
        wakeup.signal()
        let clock = ContinuousClock()
        let began = clock.now
        await wakeup.wait(timeout: .seconds(30))
        #expect(clock.now - began < .seconds(5))
        let waiting = Task { await wakeup.wait(timeout: .seconds(30)) }
        waiting.cancel()
        await waiting.value
        #expect(clock.now - began < .seconds(5))
    }
}
