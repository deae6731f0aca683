import Testing

@testable import TributaryAgentCore

@Suite("Watchdog heartbeat")
struct HeartbeatTests {
    @Test("a request past its timeout counts as progress until the step has cancelled it and applied the outcome")
    func requestAnswerGrace() async throws {
        let heartbeat = Heartbeat()
        heartbeat.requestStarted(timeout: .milliseconds(100))
        // Past the request's timeout, within the second the step still waits for its answer
        // (``Heartbeat/answerGrace``): a watchdog ping skipped now would leave a gap of a whole interval.
        try await Task.sleep(for: .milliseconds(600))
        #expect(heartbeat.isAlive(within: .milliseconds(50)))
        heartbeat.requestEnded()
        #expect(heartbeat.isAlive(within: .milliseconds(500)), "the end of a request is a beat")
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
