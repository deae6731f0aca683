import Foundation
import Testing
import TributaryCollector
import TributaryStore
import TributaryTestSupport

@testable import TributaryAgentCore

/// The whole agent (real store, outbox, HTTP client and collector) on a ``ManualClock``: the test
/// moves time itself, to the instant the loop waits for each time it parks (``LoopParking``), so
/// flush intervals, backoffs, stop budgets and deadlines of seconds or minutes pass in the time the
/// work takes, and each is checked to the instant instead of against a wall-clock bound.
@Suite("The whole agent on a manual clock", .timeLimit(.minutes(1)))
struct ManualClockAgentTests {
    /// The agent's run, driven: from `park` on (the start, or where an earlier drive stopped), each
    /// park moves the clock to the instant the loop waits for (a park that waits for a signal only,
    /// none: a stop, a flush or the store's change wakes it), until `done` says so (asked at every
    /// park) or the run ends. Returns the last park, whose instant the clock has not reached yet.
    @discardableResult
    static func drive(
        _ agent: Agent, _ clock: ManualClock, from park: LoopParking.Park = .init(number: 0, until: nil),
        until done: (LoopParking.Park) async throws -> Bool = { _ in false }
    ) async throws -> LoopParking.Park {
        var park = park
        while true {
            if let until = park.until { clock.advance(to: until) }
            park = await agent.parking.next(after: park.number)
            if park.ended { return park }
            if try await done(park) { return park }
        }
    }

    /// Asks the agent to stop and drives its run to the end.
    static func stop(_ agent: Agent, _ clock: ManualClock, from park: LoopParking.Park) async throws {
        agent.requestStop()
        #expect(try await drive(agent, clock, from: park).ended)
    }

    static func agent(
        _ group: String, _ collector: RunningCollector, _ clock: ManualClock, _ adjust: (inout AgentConfiguration) -> Void = { _ in }
    ) throws -> Agent {
        try UploadTests.agent(group, collector) {
            $0.clock = clock
            // The store's change notifications wake the loop too; polling must not (no timer of its own here).
            $0.backgroundBudget = .seconds(30)
            adjust(&$0)
        }
    }

    @Test("events below the bulk size go when the flush interval has passed since the first of them waited, not before")
    func flushInterval() async throws {
        try await withTemporaryGroup { group in
            try await UploadTests.produce(group, count: 10)
            try await Collector.withRunning(CollectorConfiguration()) { collector in
                let clock = ManualClock()
                let agent = try Self.agent(group, collector, clock) {
                    $0.bulkSize = 1_000
                    $0.flushInterval = .seconds(30)
                }
                let start = clock.now
                async let run: Void = agent.run()
                var firstDelivery: Duration?
                let park = try await Self.drive(agent, clock) { _ in
                    let unique = try await collector.stats().unique
                    if unique > 0, firstDelivery == nil { firstDelivery = start.duration(to: clock.now) }
                    return unique == 10
                }
                #expect(!park.ended)
                let waited = try #require(firstDelivery)
                #expect(waited >= .seconds(30) && waited < .seconds(31), "delivered after \(waited) on the agent's clock")
                try await UploadTests.expectDelivered(collector, count: 10)
                try await Self.stop(agent, clock, from: park)
                try await run
            }
        }
    }

    @Test("a stop asked for before a --once run starts keeps its budget (2 s of the agent's clock), not --deadline's 90 s")
    func stopBeforeOnce() async throws {
        try await withTemporaryGroup { group in
            try await UploadTests.produce(group, count: 10)
            let faults = FaultConfiguration(failureRate: 1, failureStatus: 503)
            try await Collector.withRunning(CollectorConfiguration(faults: faults)) { collector in
                let clock = ManualClock()
                let agent = try Self.agent(group, collector, clock) {
                    $0.deadline = .seconds(90)
                    $0.stopTimeout = .seconds(2)
                    $0.grace = .milliseconds(500)
                    $0.upload.backoff = Backoff(base: .milliseconds(100), cap: .milliseconds(400))
                }
                // In the outbox already: a stopping agent claims nothing from the store, but uploads what it holds.
                _ = try Drainer(store: agent.store, outbox: agent.outbox, logger: UploadTests.logger).drainAvailable()
                let start = clock.now
                agent.requestStop()
                async let run = agent.runOnce()
                let park = try await Self.drive(agent, clock)
                #expect(park.ended)
                _ = try? await run
                let lasted = start.duration(to: clock.now)
                // The loop stops claiming work at the expiration (the budget less its grace, 1.5 s).
                #expect(lasted <= .milliseconds(1_500), "the run lasted \(lasted) on its clock: the stop's budget was not kept")
                #expect(try await collector.stats().requests > 0, "the stopping run must still try to upload")
                #expect(try agent.outbox.pending().count == 10, "nothing is lost: the refused events stay queued")
            }
        }
    }

    @Test("retries wait as the backoff says, on the agent's clock; once the collector takes them, everything arrives in order")
    func backoffThenDelivery() async throws {
        try await withTemporaryGroup { group in
            try await UploadTests.produce(group, count: 20)
            let faults = FaultConfiguration(failureRate: 1, failureStatus: 503)
            try await Collector.withRunning(CollectorConfiguration(faults: faults)) { collector in
                let clock = ManualClock()
                let backoff = Backoff(base: .seconds(1), cap: .seconds(60))
                let agent = try Self.agent(group, collector, clock) {
                    $0.bulkSize = 1
                    $0.upload.backoff = backoff
                }
                async let run: Void = agent.run()
                // Six refused requests. The clock stands still during a turn, so a request first seen at a park
                // went when the clock reached the instant of the park before: the gaps are the backoff's waits.
                var sentAt: [ContinuousClock.Instant] = []
                var park = try await Self.drive(agent, clock) { _ in
                    let requests = try await collector.stats().requests
                    if requests > sentAt.count { sentAt.append(clock.now) }
                    return requests >= 6
                }
                #expect(sentAt.count == 6)
                for (attempt, (before, after)) in zip(sentAt, sentAt.dropFirst()).enumerated() {
                    let wait = before.duration(to: after)
                    #expect(wait >= .zero && wait <= backoff.ceiling(attempt: attempt), "retry \(attempt + 1) waited \(wait)")
                }
                #expect(try agent.outbox.pending().count == 20, "refused batches stay queued")
                try await collector.setFaults(FaultConfiguration())
                park = try await Self.drive(agent, clock, from: park) { _ in try await collector.stats().unique == 20 }
                try await UploadTests.expectDelivered(collector, count: 20)
                try await Self.stop(agent, clock, from: park)
                try await run
            }
        }
    }

    @Test("a --once deadline cancels a request the collector holds, at its expiration on the agent's clock; nothing is lost")
    func deadlineCancelsHeldRequest() async throws {
        try await withTemporaryGroup { group in
            try await UploadTests.produce(group, count: 10)
            try await Collector.withRunning(CollectorConfiguration(faults: FaultConfiguration(hangRate: 1))) { collector in
                let clock = ManualClock()
                let agent = try Self.agent(group, collector, clock) {
                    $0.deadline = .seconds(20)
                    $0.grace = .seconds(1)
                    $0.upload.requestTimeout = .seconds(60)
                }
                let start = clock.now
                async let run = agent.runOnce()
                // The request is out and held, and the loop awaits it: the clock's sleepers are the status
                // file's ticker (once a second) and the request's watcher, which sleeps until the expiration
                // (19 s from the start), the HTTP client's own 60 s timeout far behind it.
                let expiration = start + .seconds(19)
                // The collector holds it (a real request over loopback, so this waits in real time).
                #expect(try await UploadTests.eventually { try await collector.stats().faults.hang == 1 })
                while clock.now < expiration {
                    let next = await clock.nextDeadline()
                    #expect(next <= expiration, "nothing sleeps past the expiration but the loop's own wait")
                    clock.advance(to: min(next, expiration))
                }
                let park = try await Self.drive(agent, clock)
                #expect(park.ended)
                let report = try await run
                #expect(report.delivered == 0)
                #expect(start.duration(to: clock.now) <= .seconds(20), "the run ends by its deadline")
                let stats = try await collector.stats()
                #expect(stats.faults.hang == 1 && stats.unique == 0, "one request, held, and no other: \(stats)")
                #expect(try agent.outbox.pending().count == 10, "the held batch stays in the outbox, for the next run")
            }
        }
    }

    @Test("a new server ends the wait the old one imposed: after a halt and a 60 s backoff, the first request to the new one goes with no time passing")
    func newServerEndsHalt() async throws {
        try await withTemporaryGroup { group in
            try await UploadTests.produce(group, count: 60)
            try await Collector.withRunning(CollectorConfiguration(faults: FaultConfiguration(forcedStatus: 401))) { refusing in
                try await Collector.withRunning(CollectorConfiguration()) { accepting in
                    let store = try SharedStore(groupDirectory: group)
                    try store.setAgentSettings(AgentSettings(serverURL: refusing.url + "/sa", flushBulkSize: 50))
                    let clock = ManualClock()
                    let agent = try GroupSettingsTests.agent(group) {
                        $0.clock = clock
                        $0.upload.backoff = Backoff(base: .seconds(60), cap: .seconds(60))
                        $0.flushInterval = .seconds(60)
                    }
                    async let run: Void = agent.run()
                    var park = try await Self.drive(agent, clock) { _ in try await refusing.stats().requests > 0 }
                    // Halted: the loop waits out the halt's backoff.
                    let halted = clock.now
                    #expect(try halted.duration(to: #require(park.until)) >= .seconds(30))
                    try store.setAgentSettings(AgentSettings(serverURL: accepting.url + "/sa", flushBulkSize: 50))
                    // The settings' change wakes the loop (the store's inotify): no clock moves until all arrived.
                    while try await accepting.stats().unique < 60 {
                        park = await agent.parking.next(after: park.number)
                        #expect(!park.ended)
                        if park.ended { break }
                    }
                    #expect(clock.now == halted, "the new server's first request waited for the old one's backoff")
                    try await UploadTests.expectDelivered(accepting, count: 60)
                    #expect(try await refusing.stats().requests == 1)
                    try await Self.stop(agent, clock, from: park)
                    try await run
                }
            }
        }
    }

    @Test("an agent waiting for a collector URL stops at once when asked (no clock time passes), keeping the events")
    func stopsWithoutServer() async throws {
        try await withTemporaryGroup { group in
            try await UploadTests.produce(group, count: 50)
            let clock = ManualClock()
            let agent = try GroupSettingsTests.agent(group) {
                $0.clock = clock
                $0.stopTimeout = .seconds(20)
            }
            async let run: Void = agent.run()
            // Drained, and waiting: no URL, so nothing but a signal (a setting, a stop) can change that.
            var park = await agent.parking.next(after: 0)
            while try agent.outbox.pending().count < 50 { park = await agent.parking.next(after: park.number) }
            let asked = clock.now
            agent.requestStop()
            // Before, the loop polled for a URL until the stop timeout ran out.
            while !park.ended { park = await agent.parking.next(after: park.number) }
            try await run
            #expect(clock.now == asked, "the stop waited \(asked.duration(to: clock.now)) on the agent's clock")
            #expect(try agent.outbox.pending().count == 50)
        }
    }
}
