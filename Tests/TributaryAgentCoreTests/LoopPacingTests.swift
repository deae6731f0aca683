import Testing

@testable import TributaryAgentCore

/// When the agent's loop rests beside committing producers (``LoopPacing``), step by step with
/// instants moved by hand.
@Suite("Loop pacing")
struct LoopPacingTests {
    let start = ContinuousClock.now

    func at(_ milliseconds: Int) -> ContinuousClock.Instant { start.advanced(by: .milliseconds(milliseconds)) }

    /// A pacing that has looked once, at 0 ms, with the store's newest seq at 1,000,000.
    func looked(share: Double = 0.05) -> LoopPacing {
        var pacing = LoopPacing(share: share, chunk: 2000)
        pacing.turnEnded(worked: .milliseconds(20), newest: 1_000_000, at: at(0))
        return pacing
    }

    @Test("the first turn never rests: nothing is known yet of the producers")
    func firstLook() {
        var pacing = LoopPacing(share: 0.05, chunk: 2000)
        #expect(!pacing.producersCommitting(newest: 10, at: at(0)))
        pacing.turnEnded(worked: .milliseconds(20), newest: 10, at: at(0))
        #expect(pacing.restUntil == nil)
        #expect(pacing.mayWork(at: at(0)))
        #expect(pacing.seenNewest == 10)
        #expect(pacing.appendSeenAt == nil)
    }

    @Test("producers appending: the loop rests (1/share − 1) × what its turn took, then may work again")
    func restsBesideProducers() {
        var pacing = looked()
        #expect(pacing.producersCommitting(newest: 1_000_050, at: at(100)))
        // 50 appended in 100 ms: 200 in the 400 ms of a turn and its rest, under half a chunk.
        pacing.turnEnded(worked: .milliseconds(20), newest: 1_000_050, at: at(100))
        #expect(pacing.restUntil == at(100 + 380))
        #expect(!pacing.mayWork(at: at(479)))
        #expect(pacing.mayWork(at: at(480)))
        #expect(pacing.seenNewest == 1_000_050)
        #expect(pacing.appendSeenAt == at(100))
    }

    @Test("a turn too short to see a commit still rests while producers committed within the last second")
    func recentAppendsCount() {
        var pacing = looked()
        pacing.turnEnded(worked: .milliseconds(20), newest: 1_000_050, at: at(100))
        // The next turn, 1 ms long, sees the same newest seq: the producers are still committing.
        #expect(pacing.producersCommitting(newest: 1_000_050, at: at(481)))
        pacing.turnEnded(worked: .milliseconds(1), newest: 1_000_050, at: at(481))
        #expect(pacing.restUntil == at(481 + 19))
        // A second after the last append seen, they no longer count as committing.
        #expect(pacing.producersCommitting(newest: 1_000_050, at: at(1099)))
        #expect(!pacing.producersCommitting(newest: 1_000_050, at: at(1100)))
        pacing.turnEnded(worked: .milliseconds(20), newest: 1_000_050, at: at(1100))
        #expect(pacing.mayWork(at: at(1100)))
    }

    @Test("no producer appending: no rest")
    func fullSpeedWhenQuiet() {
        var pacing = looked()
        #expect(!pacing.producersCommitting(newest: 1_000_000, at: at(100)))
        pacing.turnEnded(worked: .milliseconds(20), newest: 1_000_000, at: at(100))
        #expect(pacing.restUntil == nil)
        // The agent's own deletes emptied the store: its newest seq is gone, and that is no append either.
        #expect(!pacing.producersCommitting(newest: nil, at: at(200)))
        pacing.turnEnded(worked: .milliseconds(20), newest: nil, at: at(200))
        #expect(pacing.restUntil == nil)
        #expect(pacing.seenNewest == 1_000_000)
        // A producer's next event, after the store was emptied, is.
        #expect(pacing.producersCommitting(newest: 1_000_001, at: at(300)))
    }

    @Test("producers appending over half a chunk in a turn and its rest: no rest")
    func noRestWhenFallingBehind() {
        var pacing = looked()
        // 300 in 100 ms: 3,000 a second, 1,200 in the 400 ms of a turn and its rest: over 1,000.
        pacing.turnEnded(worked: .milliseconds(20), newest: 1_000_300, at: at(100))
        #expect(pacing.restUntil == nil)
        // 250 in 100 ms: 1,000 in 400 ms, half a chunk: it rests.
        pacing.turnEnded(worked: .milliseconds(20), newest: 1_000_550, at: at(200))
        #expect(pacing.restUntil == at(200 + 380))
    }

    @Test("a turn that did no work only looks; work during a rest lengthens it, never shortens it")
    func idleTurnLooks() {
        var pacing = looked()
        pacing.turnEnded(worked: .milliseconds(20), newest: 1_000_010, at: at(100))
        #expect(pacing.restUntil == at(480))
        pacing.turnEnded(worked: nil, newest: 1_000_020, at: at(200))
        #expect(pacing.restUntil == at(480), "no work, no new rest")
        #expect(pacing.seenNewest == 1_000_020)
        #expect(pacing.lookedAt == at(200))
        // A checkpoint of 5 ms during the rest: its own rest (95 ms) ends before the one in force.
        pacing.turnEnded(worked: .milliseconds(5), newest: 1_000_030, at: at(300))
        #expect(pacing.restUntil == at(480))
        // One of 10 ms at 400 ms: 190 ms more, past it.
        pacing.turnEnded(worked: .milliseconds(10), newest: 1_000_040, at: at(400))
        #expect(pacing.restUntil == at(590))
    }

    @Test("share 1 never rests; a store made anew counts as producers appending")
    func shareOneAndStoreMadeAnew() {
        var never = looked(share: 1)
        #expect(!never.producersCommitting(newest: 1_000_050, at: at(100)))
        never.turnEnded(worked: .milliseconds(20), newest: 1_000_050, at: at(100))
        #expect(never.restUntil == nil)

        var pacing = looked(share: 0.5)
        #expect(pacing.producersCommitting(newest: 3, at: at(100)))
        pacing.turnEnded(worked: .milliseconds(20), newest: 3, at: at(100))
        #expect(pacing.restUntil == at(120), "share 0.5: a rest as long as the turn")
    }
}
