import Testing

@testable import TributaryAgentCore

/// The batch size after the collector's 413s (``BatchSizePolicy``), step by step.
@Suite("Batch size after 413s")
struct BatchSizePolicyTests {
    @Test("a 413 halves the refused batch; deliveries double it back, no further than the halved size")
    func halveAndGrowToTheCeiling() {
        var size = BatchSizePolicy(configured: 500)
        size.tooLarge(count: 500)
        #expect(size.limit == 250 && size.ceiling == 250)
        size.tooLarge(count: 250)
        #expect(size.limit == 125 && size.ceiling == 125)
        size.delivered()
        #expect(size.limit == 125, "a collector whose limit lies between 125 and 250 would refuse 250 again")
    }

    @Test("the ceiling lasts 100 deliveries; then the size grows back to the configured one")
    func ceilingForgotten() {
        var size = BatchSizePolicy(configured: 500)
        size.tooLarge(count: 400)
        for _ in 0..<(BatchSizePolicy.ceilingDeliveries - 1) { size.delivered() }
        #expect(size.limit == 200 && size.ceiling == 200)
        size.delivered()
        #expect(size.ceiling == nil && size.limit == 400)
        size.delivered()
        #expect(size.limit == 500, "never over the configured size")
    }

    @Test("one event too large even alone: its 413s say nothing of the others, and the size grows again")
    func singleEventTooLarge() {
        var size = BatchSizePolicy(configured: 8)
        for count in [8, 4, 2] { size.tooLarge(count: count) }
        #expect(size.limit == 1)
        size.tooLarge(count: 1)
        #expect(size.limit == 1, "never below one event")
        size.forgetCeiling()
        size.delivered()
        size.delivered()
        #expect(size.limit == 4)
    }

    @Test("another destination starts from the configured size")
    func reset() {
        var size = BatchSizePolicy(configured: 500)
        size.tooLarge(count: 100)
        size.reset()
        #expect(size == BatchSizePolicy(configured: 500))
    }

    @Test("a configured size near Int.max doubles without overflow")
    func saturates() {
        var size = BatchSizePolicy(configured: .max)
        size.tooLarge(count: .max)
        size.forgetCeiling()
        size.delivered()
        #expect(size.limit == .max - 1)
        size.delivered()
        #expect(size.limit == .max, "the doubling saturates")
    }
}
