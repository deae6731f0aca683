import Testing
import TributaryCollector
import TributaryTestSupport

@testable import TributaryAgentCore

/// A model-based property test of the agent loop's decisions (``LoopMachine``): seeded random runs of
/// inputs (time passing, events arriving, flush requests, a stop, collector answers, settings changes)
/// on a manual clock, with no sleeps, checked after every turn against the rules a reference model
/// keeps: no upload without a collector URL or within a wait the collector asked for, none within the
/// agent's own backoff unless a flush request or the stop cut it, an upload as soon as a flush is
/// due, request plans within the batch size and the deadline, and a stop that ends after its attempt.
@Suite("Agent loop decisions against a reference model")
struct LoopMachineModelTests {
    typealias Machine = LoopMachine<TestClock>

    /// Seeds that once failed, or cover a path worth keeping; replayed on every run with fresh ones.
    /// 457121: a flush request's budget ending in the turn the flush interval ended cancelled the
    /// interval's flush.
    static let regressionSeeds: [UInt64] = [1, 2, 3, 7, 42, 457121]

    /// What the rules need to remember, kept apart from the machine's own state.
    struct Model {
        var pending = 0
        var serverURL: String? = "http://collector"
        var bulkSize = 50
        var flushInterval: Duration = .seconds(15)
        var stopping = false
        /// The collector asked for no request before this (a `Retry-After`, a halt).
        var collectorsWaitUntil: TestClock.Instant?
        /// The agent's own backoff after a failure: no request before this unless cut.
        var ownBackoffUntil: TestClock.Instant?
        /// A flush request, or the first turn that saw the stop, since the last failure: either may cut
        /// the agent's own backoff.
        var backoffCut = false
        /// When the flush interval next ends: it starts again whenever it has ended, events or not.
        var nextIntervalFlush: TestClock.Instant
        var delivered = 0
        var failedWhileStopping = false
    }

    @Test("random runs keep every rule", arguments: regressionSeeds + [Reliability.seed()])
    func randomRuns(seed: UInt64) {
        var rng = SplitMix64(seed: seed)
        for run in 0..<(20 * Reliability.soak) {
            let replay = Reliability.replay("LoopMachineModelTests", seed: seed)
            check(run: run, rng: &rng, comment: "seed \(seed), run \(run): \(replay)")
        }
    }

    func check(run: Int, rng: inout SplitMix64, comment: String) {
        let clock = TestClock()
        var limits = Machine.Limits()
        limits.batchSize = 100
        limits.requestTimeout = .seconds(5)
        limits.outboxQuotaBytes = .max
        limits.once = run % 5 == 4
        var model = Model(nextIntervalFlush: clock.now.advanced(by: .seconds(15)))
        let expiresAt = run % 3 == 2 ? clock.now.advanced(by: .seconds(40)) : nil
        let settings = EffectiveSettings(
            serverURL: model.serverURL, format: .sensors, bulkSize: model.bulkSize, flushInterval: model.flushInterval)
        var loop = Machine(limits: limits, settings: settings, now: clock.now)
        loop.storeWatched = true

        for _ in 0..<200 {
            // Inputs between turns.
            clock.advance(by: .milliseconds(Int64(rng.next() % 4_000)))
            if rng.next() % 3 == 0 { model.pending += Int(rng.next() % 60) }
            if !model.stopping && rng.next() % 60 == 0 { model.stopping = true }
            if rng.next() % 40 == 0 {
                model.serverURL = rng.next() % 4 == 0 ? nil : "http://collector/\(rng.next() % 3)"
                model.bulkSize = [10, 50, 200][Int(rng.next() % 3)]
                let changed = loop.adopt(
                    EffectiveSettings(
                        serverURL: model.serverURL, format: .sensors, bulkSize: model.bulkSize,
                        flushInterval: model.flushInterval),
                    at: clock.now)
                if changed {
                    // Another destination: the old one's waits say nothing about it.
                    model.collectorsWaitUntil = nil
                    model.ownBackoffUntil = nil
                }
            }
            let flushRequested = rng.next() % 15 == 0
            let now = clock.now
            if loop.deadlineReached(at: now, expiresAt: expiresAt) { return }
            let firstStopTurn = model.stopping && !loop.stopSeen
            if flushRequested || firstStopTurn { model.backoffCut = true }

            let action = loop.decide(
                .init(
                    now: now, pending: model.pending, heldBytes: 0, stopping: model.stopping,
                    flushRequested: flushRequested, expiresAt: expiresAt))

            // The rules, whatever the machine decided.
            let collectorWaits = model.collectorsWaitUntil.map { now < $0 } ?? false
            let ownWaits = (model.ownBackoffUntil.map { now < $0 } ?? false) && !model.backoffCut
            let intervalEnded = now >= model.nextIntervalFlush
            if intervalEnded { model.nextIntervalFlush = now.advanced(by: model.flushInterval) }
            let due =
                model.pending >= model.bulkSize || intervalEnded || flushRequested || model.stopping || limits.once
            let mayGo = model.serverURL != nil && !collectorWaits && !ownWaits
            switch action {
            case .upload(let maxEvents, let timeout):
                #expect(model.serverURL != nil, "an upload with no collector URL (\(comment))")
                #expect(!collectorWaits, "an upload within the collector's wait (\(comment))")
                #expect(!ownWaits, "an upload within the agent's own backoff, not cut (\(comment))")
                #expect(model.pending > 0, "an upload of nothing (\(comment))")
                #expect(maxEvents >= 1 && maxEvents <= limits.batchSize, "a batch over the batch size (\(comment))")
                #expect(timeout <= limits.requestTimeout, "a timeout over the request timeout (\(comment))")
                if let expiresAt {
                    #expect(timeout <= now.duration(to: expiresAt), "a request past the deadline (\(comment))")
                }
                if !answer(&loop, &model, rng: &rng, maxEvents: maxEvents, now: now) { return }
            case .hold:
                // A flush that is due, with somewhere to send and nothing in the way, goes at once.
                #expect(
                    !(mayGo && model.pending > 0 && due && expiresAt == nil),
                    """
                    a due flush held (\(comment)): \(model.pending) events of a bulk size of \(model.bulkSize), \
                    interval ended \(intervalEnded), flush request \(flushRequested), stopping \(model.stopping), \
                    at \(now.offset), machine's notBefore \(String(describing: loop.notBefore?.offset))
                    """)
            case .tooLate(_, let finish):
                #expect(expiresAt != nil, "too late with no deadline (\(comment))")
                if finish { return }
            case .finishWithoutURL:
                #expect(model.stopping && model.serverURL == nil && model.pending > 0, "\(comment)")
                return
            case .failWithoutURL:
                #expect(limits.once && model.serverURL == nil && model.pending > 0, "\(comment)")
                return
            }
            #expect(loop.delivered == model.delivered, "the delivered count (\(comment))")
            switch loop.finish(at: now, pending: model.pending, stopping: model.stopping) {
            case .stopped:
                #expect(model.pending == 0, "\(comment)")
                return
            case .stoppedAfterFailure:
                #expect(model.failedWhileStopping || loop.stopSeen, "\(comment)")
                return
            case nil:
                #expect(!(model.stopping && model.pending == 0), "a stop with nothing left goes on (\(comment))")
            }
            // The driver writes the status when it is due; then the loop sleeps, never past a timed trigger.
            if loop.statusDue(at: now) { loop.statusWritten(at: now) }
            checkWait(loop, model, action: action, now: now, expiresAt: expiresAt, comment: comment)
        }
    }

    /// How long the loop sleeps after a turn: at most the poll interval in a one-shot run or a stop; not
    /// past the deadline; with events waiting and somewhere to send them, not past the flush interval's
    /// end or the end of the waits in the way (whichever is later); with nothing waiting after a turn
    /// that sent nothing, until woken, or at most a second for a change owed to the status file.
    func checkWait(
        _ loop: Machine, _ model: Model, action: Machine.Action, now: TestClock.Instant, expiresAt: TestClock.Instant?,
        comment: String
    ) {
        let wait = loop.waitTimeout(at: now, expiresAt: expiresAt)
        let wakeAt = wait.map { now.advanced(by: $0) }
        let soon = now.advanced(by: .milliseconds(1))
        if model.stopping || loop.limits.once {
            #expect(wait.map { $0 <= loop.limits.pollInterval } ?? false, "a stop or a one-shot run polls (\(comment))")
        }
        if let expiresAt {
            #expect(wakeAt.map { $0 <= max(expiresAt, soon) } ?? false, "a sleep past the deadline (\(comment))")
        }
        guard case .hold = action else { return }
        if model.pending > 0 && model.serverURL != nil {
            let waitsEnd = [model.ownBackoffUntil, model.collectorsWaitUntil].compactMap { $0 }.max() ?? now
            let by = max(model.nextIntervalFlush, waitsEnd, soon)
            #expect(wakeAt.map { $0 <= by } ?? false, "a sleep past the next flush (\(comment))")
        }
        if model.pending == 0 && !model.stopping && !loop.limits.once && expiresAt == nil {
            #expect(wait.map { $0 <= .seconds(1) } ?? true, "an idle loop woke for nothing (\(comment))")
        }
    }

    /// A collector's answer to an upload of at most `maxEvents`: delivered, a failure, a `Retry-After`,
    /// or a halt; fed to the machine and the model alike. False when the run is over (a one-shot run
    /// halted).
    func answer(
        _ loop: inout Machine, _ model: inout Model, rng: inout SplitMix64, maxEvents: Int, now: TestClock.Instant
    ) -> Bool {
        let stoppedMeanwhile = model.stopping || rng.next() % 50 == 0
        if stoppedMeanwhile && !model.stopping { model.stopping = true }
        switch rng.next() % 10 {
        case 0..<6:
            let count = min(model.pending, maxEvents)
            model.pending -= count
            model.delivered += count
            model.ownBackoffUntil = nil
            model.collectorsWaitUntil = nil
            _ = loop.uploaded(
                [(.progressed(delivered: count), .milliseconds(50))], answer: .init(stoppedMeanwhile: stoppedMeanwhile),
                at: now)
            loop.endFlushIfBelowBulk(stopping: model.stopping) { model.pending }
        case 6..<8:
            let delay = Duration.milliseconds(Int64(1 + rng.next() % 8_000))
            model.ownBackoffUntil = now.advanced(by: delay)
            model.backoffCut = false
            model.failedWhileStopping = model.failedWhileStopping || stoppedMeanwhile
            _ = loop.uploaded(
                [(.wait(delay), .milliseconds(50))], answer: .init(stoppedMeanwhile: stoppedMeanwhile), at: now)
        case 8:
            let delay = Duration.milliseconds(Int64(1 + rng.next() % 8_000))
            model.ownBackoffUntil = now.advanced(by: delay)
            model.collectorsWaitUntil = now.advanced(by: delay)
            model.backoffCut = false
            model.failedWhileStopping = model.failedWhileStopping || stoppedMeanwhile
            _ = loop.uploaded(
                [(.wait(delay), .milliseconds(50))],
                answer: .init(waitAskedByCollector: delay, stoppedMeanwhile: stoppedMeanwhile), at: now)
        default:
            let delay = Duration.seconds(30)
            model.ownBackoffUntil = now.advanced(by: delay)
            model.collectorsWaitUntil = now.advanced(by: delay)
            model.backoffCut = false
            model.failedWhileStopping = model.failedWhileStopping || stoppedMeanwhile
            let verdict = loop.uploaded(
                [(.wait(delay), .milliseconds(50))],
                answer: .init(haltReason: "HTTP 401", stoppedMeanwhile: stoppedMeanwhile),
                at: now)
            if loop.limits.once {
                #expect(verdict == .haltedOnce(reason: "HTTP 401"))
                return false
            }
        }
        return true
    }
}
