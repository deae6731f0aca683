import Testing
import TributaryWire

@testable import TributaryAgentCore

/// The agent loop's rules, step by step on a manual clock (``LoopMachine``): each test feeds the
/// machine what a turn would observe and checks what it decides.
@Suite("Agent loop decisions")
struct LoopMachineTests {
    typealias Machine = LoopMachine<TestClock>

    let clock = TestClock()

    /// The machine behind a reference, so that `#expect` can step it.
    @dynamicMemberLookup
    final class Stepped {
        var machine: Machine
        init(_ machine: Machine) { self.machine = machine }
        subscript<T>(dynamicMember path: KeyPath<Machine, T>) -> T { machine[keyPath: path] }

        func decide(_ seen: Machine.Observation) -> Machine.Action { machine.decide(seen) }
        func uploaded(
            _ steps: [(step: UploadSession.Step, took: Duration)], answer: Machine.Answer, at now: TestClock.Instant
        ) -> Machine.UploadVerdict { machine.uploaded(steps, answer: answer, at: now) }
        func endFlushIfBelowBulk(stopping: Bool, waiting: () -> Int) {
            machine.endFlushIfBelowBulk(stopping: stopping, waiting: waiting)
        }
        func sentEverything(drainedThrough: () -> Bool, waiting: () -> Int) -> Bool {
            machine.sentEverything(drainedThrough: drainedThrough, waiting: waiting)
        }
        func adopt(_ settings: EffectiveSettings, at now: TestClock.Instant) -> Bool {
            machine.adopt(settings, at: now)
        }
        func statusWritten(at now: TestClock.Instant, completed: Bool = true) {
            machine.statusWritten(at: now, completed: completed)
        }
        func statusDue(at now: TestClock.Instant) -> Bool { machine.statusDue(at: now) }
        func finish(at now: TestClock.Instant, pending: Int, stopping: Bool) -> Machine.Finish? {
            machine.finish(at: now, pending: pending, stopping: stopping)
        }
        func waitTimeout(
            at now: TestClock.Instant, expiresAt: TestClock.Instant?, mustPoll: Bool = false,
            restUntil: TestClock.Instant? = nil
        ) -> Duration? {
            machine.waitTimeout(at: now, expiresAt: expiresAt, mustPoll: mustPoll, restUntil: restUntil)
        }
        func uploadsFirst(queued: Int, at now: TestClock.Instant) -> Bool {
            machine.uploadsFirst(queued: queued, at: now)
        }
        func deadlineReached(at now: TestClock.Instant, expiresAt: TestClock.Instant?) -> Bool {
            machine.deadlineReached(at: now, expiresAt: expiresAt)
        }
    }

    func machine(
        once: Bool = false, bulkSize: Int = 100, flushInterval: Duration = .seconds(15),
        serverURL: String? = "http://c", batchSize: Int = 500, storeWatched: Bool = true
    ) -> Stepped {
        var limits = Machine.Limits()
        limits.once = once
        limits.batchSize = batchSize
        limits.outboxQuotaBytes = 1000
        let settings = EffectiveSettings(
            serverURL: serverURL, format: .sensors, bulkSize: bulkSize, flushInterval: flushInterval)
        var machine = Machine(limits: limits, settings: settings, now: clock.now)
        machine.storeWatched = storeWatched
        return Stepped(machine)
    }

    func seen(
        pending: Int, heldBytes: Int = 0, stopping: Bool = false, flush: Bool = false,
        expiresAt: TestClock.Instant? = nil, resting: Bool = false
    ) -> Machine.Observation {
        .init(
            now: clock.now, pending: pending, heldBytes: heldBytes, stopping: stopping, flushRequested: flush,
            expiresAt: expiresAt, resting: resting)
    }

    static let fullBatch = Machine.Action.upload(maxEvents: 500, timeout: .seconds(30))

    @Test("below the bulk size nothing goes until the flush interval; at the bulk size it goes at once")
    func bulkSizeAndInterval() {
        let loop = machine()
        #expect(loop.decide(seen(pending: 99)) == .hold)
        #expect(loop.decide(seen(pending: 100)) == Self.fullBatch)
        #expect(loop.activity == .uploading)

        let quiet = machine()
        #expect(quiet.decide(seen(pending: 3)) == .hold)
        clock.advance(by: .seconds(14))
        #expect(quiet.decide(seen(pending: 3)) == .hold)
        clock.advance(by: .seconds(1))
        #expect(quiet.decide(seen(pending: 3)) == Self.fullBatch)
        // The interval starts again from the flush.
        #expect(quiet.nextIntervalFlush == clock.now.advanced(by: .seconds(15)))
    }

    @Test("an outbox at its quota flushes whatever it holds: a bulk size it cannot hold is never reached")
    func fullOutboxFlushes() {
        let loop = machine()
        #expect(loop.decide(seen(pending: 5, heldBytes: 999)) == .hold)
        #expect(loop.decide(seen(pending: 5, heldBytes: 1000)) == Self.fullBatch)
    }

    @Test("a flush that delivered ends once fewer than the bulk size wait; with nothing left the loop is idle")
    func flushEnds() {
        let loop = machine()
        #expect(loop.decide(seen(pending: 150)) == Self.fullBatch)
        #expect(
            loop.uploaded([(.progressed(delivered: 100), .milliseconds(10))], answer: .init(), at: clock.now)
                == .progressed)
        loop.endFlushIfBelowBulk(stopping: false) { 50 }
        #expect(!loop.flushing)
        #expect(loop.decide(seen(pending: 50)) == .hold)
        #expect(loop.decide(seen(pending: 0)) == .hold)
        #expect(loop.activity == .idle)
        #expect(loop.delivered == 100)
        #expect(loop.rowsSent == 100)
    }

    @Test("a failed upload backs off: nothing goes until the delay has passed, and the wait is that long")
    func backoff() {
        let loop = machine()
        #expect(loop.decide(seen(pending: 200)) == Self.fullBatch)
        #expect(loop.uploaded([(.wait(.seconds(2)), .milliseconds(5))], answer: .init(), at: clock.now) == .stalled)
        #expect(loop.activity == .backoff)
        #expect(!loop.drainAheadApplies)
        loop.statusWritten(at: clock.now)
        #expect(loop.waitTimeout(at: clock.now, expiresAt: nil) == .seconds(2))
        clock.advance(by: .milliseconds(1900))
        #expect(loop.decide(seen(pending: 200)) == .hold)
        #expect(loop.waitTimeout(at: clock.now, expiresAt: nil) == .milliseconds(100))
        clock.advance(by: .milliseconds(100))
        #expect(loop.decide(seen(pending: 200)) == Self.fullBatch)
        #expect(
            loop.uploaded([(.progressed(delivered: 200), .milliseconds(5))], answer: .init(), at: clock.now)
                == .progressed)
        #expect(loop.drainAheadApplies)
    }

    @Test("a flush request cuts the agent's own backoff but not the wait the collector asked for")
    func flushRequestAndRetryAfter() {
        let own = machine()
        _ = own.decide(seen(pending: 200))
        _ = own.uploaded([(.wait(.seconds(60)), .zero)], answer: .init(), at: clock.now)
        #expect(own.decide(seen(pending: 200)) == .hold)
        #expect(own.decide(seen(pending: 200, flush: true)) == Self.fullBatch)

        let asked = machine()
        _ = asked.decide(seen(pending: 200))
        _ = asked.uploaded(
            [(.wait(.seconds(60)), .zero)], answer: .init(waitAskedByCollector: .seconds(60)), at: clock.now)
        #expect(asked.decide(seen(pending: 200, flush: true)) == .hold)
        clock.advance(by: .seconds(60))
        #expect(asked.decide(seen(pending: 200)) == Self.fullBatch)
    }

    @Test("a flush request keeps the agent flushing below the bulk size for the background budget")
    func flushRequestBudget() {
        let loop = machine(flushInterval: .seconds(60))
        #expect(loop.decide(seen(pending: 3, flush: true)) == Self.fullBatch)
        _ = loop.uploaded([(.progressed(delivered: 2), .zero)], answer: .init(), at: clock.now)
        loop.endFlushIfBelowBulk(stopping: false) { 1 }
        #expect(loop.flushing, "a flush request sends everything")
        clock.advance(by: .seconds(30))
        #expect(loop.decide(seen(pending: 1)) == .hold)
        #expect(!loop.flushing)
    }

    @Test("a halt waits as long as it says, and a flush request does not cut it")
    func halt() {
        let loop = machine()
        _ = loop.decide(seen(pending: 200))
        #expect(
            loop.uploaded([(.wait(.seconds(300)), .zero)], answer: .init(haltReason: "HTTP 401"), at: clock.now)
                == .stalled)
        #expect(loop.activity == .halted)
        #expect(loop.decide(seen(pending: 200, flush: true)) == .hold)
        // Another collector: the old one's refusal says nothing about it.
        let moved = EffectiveSettings(
            serverURL: "http://other", format: .sensors, bulkSize: 100, flushInterval: .seconds(15))
        #expect(loop.adopt(moved, at: clock.now))
        #expect(loop.activity == .idle)
        #expect(loop.decide(seen(pending: 200)) == Self.fullBatch)
    }

    @Test("a one-shot run ends in an error when halted, or when events wait with no collector URL")
    func onceErrors() {
        let loop = machine(once: true)
        #expect(loop.flushing)
        #expect(loop.decide(seen(pending: 1)) == Self.fullBatch)
        #expect(
            loop.uploaded([(.wait(.seconds(300)), .zero)], answer: .init(haltReason: "HTTP 403"), at: clock.now)
                == .haltedOnce(reason: "HTTP 403"))

        let noURL = machine(once: true, serverURL: nil)
        #expect(noURL.decide(seen(pending: 1)) == .failWithoutURL)
        #expect(noURL.decide(seen(pending: 0)) == .hold)
        let stopping = machine(serverURL: nil)
        #expect(stopping.decide(seen(pending: 1, stopping: true)) == .finishWithoutURL)
        let waiting = machine(serverURL: nil)
        #expect(waiting.decide(seen(pending: 1)) == .hold)
        #expect(waiting.activity == .waiting)
    }

    @Test("a one-shot run is over once the rows waiting when the drain reached the start's store are sent")
    func onceCount() {
        let loop = machine(once: true)
        #expect(!loop.sentEverything(drainedThrough: { false }, waiting: { 7 }))
        #expect(!loop.sentEverything(drainedThrough: { true }, waiting: { 7 }))
        _ = loop.decide(seen(pending: 7))
        _ = loop.uploaded([(.progressed(delivered: 5, deadLettered: 1), .zero)], answer: .init(), at: clock.now)
        // The mark was taken once: a later count of what waits (new events) does not move it.
        #expect(!loop.sentEverything(drainedThrough: { true }, waiting: { 100 }))
        _ = loop.uploaded([(.progressed(delivered: 1), .zero)], answer: .init(), at: clock.now)
        #expect(loop.sentEverything(drainedThrough: { true }, waiting: { 100 }))
    }

    @Test("a stop tries once at once, even in a backoff; a failure then, or nothing left, ends the run")
    func stop() {
        let loop = machine()
        _ = loop.decide(seen(pending: 200))
        _ = loop.uploaded([(.wait(.seconds(60)), .zero)], answer: .init(), at: clock.now)
        #expect(loop.finish(at: clock.now, pending: 200, stopping: false) == nil)
        #expect(loop.decide(seen(pending: 200, stopping: true)) == Self.fullBatch)
        #expect(loop.activity == .stopping)
        _ = loop.uploaded([(.wait(.seconds(60)), .zero)], answer: .init(stoppedMeanwhile: true), at: clock.now)
        #expect(loop.finish(at: clock.now, pending: 200, stopping: true) == .stoppedAfterFailure)

        let drained = machine()
        #expect(drained.decide(seen(pending: 0, stopping: true)) == .hold)
        #expect(drained.activity == .stopping)
        #expect(drained.finish(at: clock.now, pending: 0, stopping: true) == .stopped)
    }

    @Test("a stop asked for while a request was out: that request was the stop's one attempt")
    func stopDuringRequest() {
        let loop = machine()
        _ = loop.decide(seen(pending: 200))
        _ = loop.uploaded([(.wait(.seconds(60)), .zero)], answer: .init(stoppedMeanwhile: true), at: clock.now)
        #expect(loop.stopSeen)
        // The backoff is not cut for a second attempt.
        #expect(loop.decide(seen(pending: 200, stopping: true)) == .hold)
        #expect(loop.finish(at: clock.now, pending: 200, stopping: true) == .stoppedAfterFailure)
    }

    @Test("under a deadline, the batch shrinks to what fits and the request ends at the expiration")
    func deadline() {
        let loop = machine(once: true)
        let expiresAt = clock.now.advanced(by: .seconds(10))
        #expect(
            loop.decide(seen(pending: 1000, expiresAt: expiresAt)) == .upload(maxEvents: 500, timeout: .seconds(10)))
        // 500 events took 2 s: 4 ms an event; 8 s left, half of it for the next request: 1,000 events (capped 500).
        clock.advance(by: .seconds(2))
        _ = loop.uploaded([(.progressed(delivered: 500), .seconds(2))], answer: .init(), at: clock.now)
        #expect(loop.decide(seen(pending: 500, expiresAt: expiresAt)) == .upload(maxEvents: 500, timeout: .seconds(8)))
        clock.advance(by: .milliseconds(7990))
        #expect(
            loop.decide(seen(pending: 500, expiresAt: expiresAt))
                == .tooLate(remaining: .milliseconds(10), finish: false))
        #expect(loop.notBefore == expiresAt)
        #expect(!loop.deadlineReached(at: clock.now, expiresAt: expiresAt))
        loop.statusWritten(at: clock.now)
        #expect(loop.waitTimeout(at: clock.now, expiresAt: expiresAt) == .milliseconds(10))
        clock.advance(by: .milliseconds(10))
        #expect(loop.deadlineReached(at: clock.now, expiresAt: expiresAt))
    }

    @Test("too late while stopping ends the run")
    func tooLateStopping() {
        let loop = machine()
        let expiresAt = clock.now.advanced(by: .milliseconds(15))
        #expect(
            loop.decide(seen(pending: 10, stopping: true, expiresAt: expiresAt))
                == .tooLate(remaining: .milliseconds(15), finish: true))
    }

    @Test("an idle loop sleeps until woken: nothing waits, no deadline, nothing owed to the status file")
    func idleSleeps() {
        let loop = machine()
        #expect(loop.decide(seen(pending: 0)) == .hold)
        #expect(loop.statusDue(at: clock.now))
        loop.statusWritten(at: clock.now)
        #expect(loop.waitTimeout(at: clock.now, expiresAt: nil) == nil)
        // A turn that changes nothing (woken by the agent's own store delete) owes the status nothing.
        clock.advance(by: .seconds(5))
        #expect(loop.decide(seen(pending: 0)) == .hold)
        #expect(!loop.statusDue(at: clock.now))
        #expect(loop.waitTimeout(at: clock.now, expiresAt: nil) == nil)
    }

    @Test("a loop resting beside committing producers holds its uploads, and sends once the rest is over")
    func restHoldsUploads() {
        let loop = machine()
        #expect(loop.decide(seen(pending: 600, resting: true)) == .hold)
        #expect(loop.flushing, "the bulk size's flush is due; only the rest holds it")
        #expect(loop.decide(seen(pending: 600)) == Self.fullBatch)
    }

    @Test("a loop resting beside committing producers wakes when its rest ends, and not after")
    func drainRestWakes() {
        let loop = machine()
        #expect(loop.decide(seen(pending: 0)) == .hold)
        loop.statusWritten(at: clock.now)
        let restEnds = clock.now.advanced(by: .milliseconds(380))
        #expect(loop.waitTimeout(at: clock.now, expiresAt: nil, restUntil: restEnds) == .milliseconds(380))
        // An earlier cause still comes first.
        #expect(loop.waitTimeout(at: clock.now, expiresAt: clock.now.advanced(by: .milliseconds(50)), restUntil: restEnds) == .milliseconds(50))
        // A rest that is over is no cause: an idle loop sleeps until woken.
        clock.advance(by: .milliseconds(380))
        #expect(loop.waitTimeout(at: clock.now, expiresAt: nil, restUntil: restEnds) == nil)
    }

    @Test("events waiting below the bulk size: the loop sleeps until the flush interval ends, then uploads")
    func sleepsUntilInterval() {
        let loop = machine(flushInterval: .seconds(15))
        clock.advance(by: .seconds(3))
        #expect(loop.decide(seen(pending: 5)) == .hold)
        loop.statusWritten(at: clock.now)
        #expect(loop.waitTimeout(at: clock.now, expiresAt: nil) == .seconds(12))
        clock.advance(by: .seconds(12))
        #expect(loop.decide(seen(pending: 5)) == Self.fullBatch)
    }

    @Test("a change owed to the status file wakes the loop a second after the last write, once")
    func statusOwedWakes() {
        let loop = machine()
        #expect(loop.decide(seen(pending: 0)) == .hold)
        loop.statusWritten(at: clock.now)
        clock.advance(by: .milliseconds(300))
        _ = loop.adopt(
            EffectiveSettings(serverURL: "http://d", format: .sensors, bulkSize: 100, flushInterval: .seconds(15)),
            at: clock.now)
        #expect(loop.waitTimeout(at: clock.now, expiresAt: nil) == .milliseconds(700))
        clock.advance(by: .milliseconds(700))
        #expect(loop.statusDue(at: clock.now))
        // A checkpoint a reader kept from completing: again a second later.
        loop.statusWritten(at: clock.now, completed: false)
        #expect(loop.waitTimeout(at: clock.now, expiresAt: nil) == .seconds(1))
        clock.advance(by: .seconds(1))
        loop.statusWritten(at: clock.now)
        #expect(loop.waitTimeout(at: clock.now, expiresAt: nil) == nil)
    }

    @Test(
        "the loop polls every poll interval where nothing would wake it: no store watch, a one-shot run, a stop, a full outbox, the driver's say"
    )
    func pollsWhereUnwatched() {
        let unwatched = machine(storeWatched: false)
        _ = unwatched.decide(seen(pending: 0))
        unwatched.statusWritten(at: clock.now)
        #expect(unwatched.waitTimeout(at: clock.now, expiresAt: nil) == .milliseconds(200))
        let once = machine(once: true)
        _ = once.decide(seen(pending: 0))
        once.statusWritten(at: clock.now)
        #expect(once.waitTimeout(at: clock.now, expiresAt: nil) == .milliseconds(200))
        let stopping = machine(serverURL: nil)
        _ = stopping.decide(seen(pending: 0, stopping: true))
        stopping.statusWritten(at: clock.now)
        #expect(stopping.waitTimeout(at: clock.now, expiresAt: nil) == .milliseconds(200))
        let full = machine(serverURL: nil)
        _ = full.decide(seen(pending: 3, heldBytes: 1000))
        full.statusWritten(at: clock.now)
        #expect(full.waitTimeout(at: clock.now, expiresAt: nil) == .milliseconds(200))
        let idle = machine()
        _ = idle.decide(seen(pending: 0))
        idle.statusWritten(at: clock.now)
        #expect(idle.waitTimeout(at: clock.now, expiresAt: nil, mustPoll: true) == .milliseconds(200))
    }

    @Test("a deadline bounds the wait, never under 1 ms; systemd's watchdog does not")
    func waitTimeout() {
        let loop = machine()
        _ = loop.decide(seen(pending: 0))
        loop.statusWritten(at: clock.now)
        #expect(loop.waitTimeout(at: clock.now, expiresAt: clock.now.advanced(by: .seconds(7))) == .seconds(7))
        #expect(loop.waitTimeout(at: clock.now, expiresAt: clock.now) == .milliseconds(1))
    }

    @Test("a full batch waiting uploads before the drain, when an upload may start")
    func uploadsFirst() {
        let loop = machine(bulkSize: 100, batchSize: 500)
        #expect(loop.uploadsFirst(queued: 500, at: clock.now))
        #expect(!loop.uploadsFirst(queued: 499, at: clock.now))
        _ = loop.decide(seen(pending: 600))
        _ = loop.uploaded([(.wait(.seconds(1)), .zero)], answer: .init(), at: clock.now)
        #expect(!loop.uploadsFirst(queued: 600, at: clock.now))
        #expect(!machine(serverURL: nil).uploadsFirst(queued: 600, at: clock.now))
    }

    @Test("a flush request's budget ending in the same turn as the flush interval does not cancel the interval's flush")
    func budgetEndsWithInterval() {
        let loop = machine(flushInterval: .seconds(30))
        #expect(loop.decide(seen(pending: 3, flush: true)) == Self.fullBatch)
        _ = loop.uploaded([(.progressed(delivered: 3), .zero)], answer: .init(), at: clock.now)
        clock.advance(by: .seconds(30))
        #expect(loop.decide(seen(pending: 2)) == Self.fullBatch)
    }

    @Test("a shorter flush interval from the group's settings applies from now")
    func shorterInterval() {
        let loop = machine(flushInterval: .seconds(60))
        let faster = EffectiveSettings(
            serverURL: "http://c", format: .sensors, bulkSize: 100, flushInterval: .seconds(5))
        #expect(!loop.adopt(faster, at: clock.now))
        clock.advance(by: .seconds(5))
        #expect(loop.decide(seen(pending: 1)) == Self.fullBatch)
    }

    @Test("the status file is due when a turn changed what it says, at most once a second")
    func statusDue() {
        let loop = machine()
        #expect(loop.statusDue(at: clock.now))
        loop.statusWritten(at: clock.now)
        #expect(loop.decide(seen(pending: 3)) == .hold)
        clock.advance(by: .milliseconds(999))
        #expect(!loop.statusDue(at: clock.now))
        clock.advance(by: .milliseconds(1))
        #expect(loop.statusDue(at: clock.now))
        loop.statusWritten(at: clock.now)
        clock.advance(by: .seconds(1))
        #expect(loop.decide(seen(pending: 3)) == .hold)
        #expect(!loop.statusDue(at: clock.now))
    }
}
