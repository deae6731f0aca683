import Testing
@testable import TributaryAgentCore

@Suite("Upload planner")
struct UploadPlannerTests {
    @Test("with no request measured yet, the batch size; with 20 ms or less left, nothing")
    func beforeMeasurements() {
        let planner = UploadPlanner()
        #expect(planner.maxEvents(within: .seconds(5), limit: 2000) == 2000)
        #expect(planner.maxEvents(within: .milliseconds(20), limit: 2000) == 0)
        #expect(planner.maxEvents(within: .zero, limit: 2000) == 0)
    }

    @Test("a request may take half the time left, at the measured time per event")
    func halfTheTimeLeft() {
        var planner = UploadPlanner()
        planner.record(events: 2000, took: .milliseconds(100))  // 50 µs per event
        #expect(planner.maxEvents(within: .seconds(1), limit: 2000) == 2000, "capped by the batch size")
        #expect(planner.maxEvents(within: .milliseconds(50), limit: 2000) == 500)
        #expect(planner.maxEvents(within: .milliseconds(21), limit: 2000) == 210)
        // A request that delivered nothing (a dead letter) teaches nothing.
        planner.record(events: 0, took: .seconds(30))
        #expect(planner.maxEvents(within: .milliseconds(50), limit: 2000) == 500)
    }

    @Test("slower requests shrink the plan smoothly, 30 % per request")
    func smoothing() {
        var planner = UploadPlanner()
        planner.record(events: 1000, took: .milliseconds(100))  // 100 µs per event
        planner.record(events: 1000, took: .milliseconds(200))  // 200 µs: 0.7 × 100 + 0.3 × 200 = 130 µs
        #expect(planner.maxEvents(within: .milliseconds(300), limit: 2000) == 1153)  // 0.15 s / 130 µs
        for _ in 0..<30 { planner.record(events: 1000, took: .milliseconds(200)) }
        #expect(planner.maxEvents(within: .milliseconds(400), limit: 2000) == 1000, "converged on 200 µs per event")
    }
}
