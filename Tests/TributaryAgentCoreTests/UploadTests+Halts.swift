import Foundation
import Testing
import Tributary
import TributaryCollector
import TributaryStore
import TributaryTestSupport

@testable import TributaryAgentCore

// Refusals that halt uploads (every event refused, 401, 403, a run of poison) and dead letters that fill the quota.
extension UploadTests {
    @Test(
        "a collector that refuses every event halts the agent after 10 dead letters, not the whole backlog; each later run dead-letters the one held; fixed, the rest goes",
        arguments: [(400, false), (413, false), (400, true)])
    func refusesEverythingHalts(status: Int, urlFromGroupSettings: Bool) async throws {
        try await withTemporaryGroup { group in
            let tracker = try Tracker(configuration: .init(groupDirectory: group))
            for i in 0..<300 { try await tracker.track("Ordinary", properties: ["i": .int(Int64(i))]) }
            // A wrong format, or a proxy answering 400 to everything: every request refused as bad data. Or
            // a body limit below any event: every event too large even alone.
            try await Collector.withRunning(CollectorConfiguration(faults: FaultConfiguration(forcedStatus: status))) { collector in
                // The URL from --server, or from the group's settings (each run then starts with none and
                // takes it from the store: no new destination for all that).
                if urlFromGroupSettings {
                    try SharedStore(groupDirectory: group).setAgentSettings(AgentSettings(serverURL: collector.url + "/sa"))
                }
                func newAgent() throws -> Agent {
                    try Self.agent(group, serverURL: urlFromGroupSettings ? nil : collector.url + "/sa") { $0.upload.batchSize = 50 }
                }
                let agent = try newAgent()
                let halted = await #expect(throws: AgentError.self) { try await agent.runOnce() }
                #expect(halted?.code == .halted, "\(String(describing: halted))")
                #expect(halted?.message.contains("refused the last 10 events one by one") == true, "\(String(describing: halted))")
                let letters = try agent.outbox.deadLetters()
                #expect(letters.map(\.seq) == Array(1...10), "the first 10, each isolated alone, then the halt")
                #expect(letters.allSatisfy { $0.status == status })
                #expect(try agent.outbox.pending().count == 290, "the 11th refused event was kept, and every one after it")
                #expect(try await collector.stats().unique == 0)
                let reported = AgentChannel.readStatus(groupDirectory: group)
                #expect(reported?.haltedAfterDeadLetters == 10, "\(String(describing: reported))")
                // The next runs (a timer's --once, restarts) go on counting: each sends the event held back
                // alone, dead-letters it when it is refused again, and halts at the next one.
                for run in 1...2 {
                    let again = await #expect(throws: AgentError.self) { try await newAgent().runOnce() }
                    #expect(again?.code == .halted, "\(String(describing: again))")
                    #expect(try agent.outbox.deadLetters().map(\.seq) == Array(1...UInt64(10 + run)))
                    #expect(try agent.outbox.deadLettersInARow() == 10 + run)
                }

                try await collector.setFaults(.none)
                _ = try await newAgent().runOnce()
                #expect(try await collector.stats().unique == 288)
                let seqs = try await collector.events(limit: 1000).compactMap(\.seq)
                #expect(seqs == Array(13...300))
                #expect(try agent.outbox.deadLettersInARow() == 0, "a delivery starts the count again")
            }
        }
    }

    @Test("a run of bad events longer than the halt limit still passes, one held back per halt, in order")
    func poisonRunPassesSlowly() async throws {
        try await withTemporaryGroup { group in
            let tracker = try Tracker(configuration: .init(groupDirectory: group))
            let names = Array(repeating: "Ordinary", count: 5) + Array(repeating: "Poison", count: 4)
                + Array(repeating: "Ordinary", count: 5)
            for (i, name) in names.enumerated() { try await tracker.track(name, properties: ["i": .int(Int64(i))]) }
            let outbox = try Outbox(path: group + "-state/outbox.sqlite")
            #expect(try Drainer(store: tracker.store, outbox: outbox, logger: Self.logger).drainAvailable() == 14)
            try await Collector.withRunning(CollectorConfiguration(faults: FaultConfiguration(poisonPattern: "^Poison$"))) { collector in
                let (steps, halts) = try await withHTTPClient { client in
                    var configuration = UploadConfiguration(serverURL: collector.url + "/sa")
                    configuration.haltAfterDeadLetters = 2
                    configuration.backoff = Backoff(base: .milliseconds(5), cap: .milliseconds(40))
                    let session = UploadSession(outbox: outbox, client: client, configuration: configuration, logger: Self.logger)
                    var steps: [UploadSession.Step] = []
                    var halts: [String] = []
                    var counts: [Int?] = []
                    while steps.count < 200 {
                        let step = try await session.step()
                        if step == .empty { break }
                        steps.append(step)
                        if case .wait = step, let reason = session.haltReason {
                            halts.append(reason)
                            counts.append(session.haltedAfterDeadLetters)
                        }
                    }
                    #expect(counts == [2, 3], "the dead-letter halt is told apart, with its count")
                    #expect(session.haltReason == nil && session.haltedAfterDeadLetters == nil, "delivered since: not halted")
                    return (steps, halts)
                }
                // Poison 1 and 2 are dead-lettered at once; 3 and 4 each wait for one halt, are sent alone
                // again, refused again, and only then dead-lettered.
                #expect(halts.count == 2, "\(steps)")
                #expect(halts.count == 2 && halts[0].contains("refused the last 2 events one by one")
                    && halts[1].contains("refused the last 3 events one by one"), "\(halts)")
                #expect(steps.filter { $0 == .wait(.milliseconds(40)) }.count == 2, "the halt waits for the backoff cap")
                #expect(try outbox.deadLetters().map(\.seq) == [6, 7, 8, 9])
                let seqs = try await collector.events(limit: 100).compactMap(\.seq)
                #expect(seqs == Array(1...5) + Array(10...14))
            }
        }
    }

    @Test("401 keeps everything until fixed, then delivers")
    func unauthorizedUntilFixed() async throws {
        try await withTemporaryGroup { group in
            try await Self.produce(group, count: 300)
            try await Collector.withRunning(CollectorConfiguration(faults: FaultConfiguration(forcedStatus: 401))) { collector in
                let agent = try Self.agent(group, collector) {
                    $0.upload.backoff = Backoff(base: .milliseconds(5), cap: .milliseconds(100))
                    $0.bulkSize = 1
                }
                let running = Task { try await agent.run() }
                defer { running.cancel() }
                var status: AgentStatus?
                _ = try await Self.eventually {
                    status = AgentChannel.readStatus(groupDirectory: group)
                    return status?.state == "halted"
                }
                #expect(status?.state == "halted")
                #expect(status?.haltReason?.contains("401") == true)
                #expect(status?.haltedAfterDeadLetters == nil, "a 401 is not the dead-letter halt")
                #expect(try agent.outbox.pending().count == 300)
                #expect(try await collector.stats().unique == 0)

                // A retryable answer after the refusal: failing, no longer halted.
                try await collector.setFaults(FaultConfiguration(forcedStatus: 503))
                agent.requestFlush()
                _ = try await Self.eventually {
                    status = AgentChannel.readStatus(groupDirectory: group)
                    return status?.haltReason == nil
                }
                #expect(status?.haltReason == nil && status?.state != "halted", "\(String(describing: status))")

                try await collector.setFaults(.none)
                agent.requestFlush()
                _ = try await Self.eventually { try await collector.stats().unique >= 300 }
                try await Self.expectDelivered(collector, count: 300)
                agent.requestStop()
                try await running.value
            }
        }
    }

    @Test("--once ends with a halted error when the collector refuses uploads; nothing is lost")
    func onceHalted() async throws {
        try await withTemporaryGroup { group in
            try await Self.produce(group, count: 10)
            try await Collector.withRunning(CollectorConfiguration(faults: FaultConfiguration(forcedStatus: 403))) { collector in
                let agent = try Self.agent(group, collector)
                let error = await #expect(throws: AgentError.self) { try await agent.runOnce() }
                #expect(error?.code == .halted)
                #expect(try agent.outbox.pending().count == 10)
                // `tributary status` shows the run as failed, with why: it showed "stopped", a clean end.
                let status = try #require(AgentChannel.readStatus(groupDirectory: group))
                #expect(status.state == "failed")
                #expect(status.lastError == error?.message)
            }
        }
    }

    @Test("dead letters count against the outbox quota: at it the drain stops, the rest waits in the store, and --once ends saying so")
    func deadLettersFillQuota() async throws {
        try await withTemporaryGroup { group in
            try await Self.produce(group, count: 400)
            // Every event rejected: each ends a dead letter, once the bisection has sent it alone.
            try await Collector.withRunning(CollectorConfiguration(faults: FaultConfiguration(poisonPattern: "."))) { collector in
                let agent = try Self.agent(group, collector) {
                    $0.upload.haltAfterDeadLetters = 0  // every event dead-lettered, as this test needs
                    $0.outboxQuotaBytes = 20_000
                    $0.drainChunk = 20
                    $0.upload.batchSize = 20
                    $0.deadline = .seconds(60)  // a bound on a hang only: the run ends as soon as nothing can move
                }
                let started = ContinuousClock.now
                let full = await #expect(throws: AgentError.self) { try await agent.runOnce() }
                #expect(full?.code == .outboxFull && full?.message.contains("--discard") == true, "\(String(describing: full))")
                #expect(ContinuousClock.now - started < .seconds(30))
                let again = await #expect(throws: AgentError.self) { try await agent.runOnce() }
                #expect(again?.message.contains("has run already") == true, "an agent runs once: its locks are released")
                let deadBytes = try agent.outbox.deadLetterBytes()
                let dead = try agent.outbox.deadLetters(limit: 10_000).count
                let waiting = try agent.store.status().pendingEvents
                let pending = try agent.outbox.pending()
                let unique = try await collector.stats().unique
                #expect(unique == 0)
                #expect(deadBytes >= 20_000 - pending.bytes, "the dead letters filled the quota")
                #expect(deadBytes + pending.bytes < 20_000 + 20 * 800, "by at most one drain chunk over it")
                #expect(waiting > 0, "the rest stayed in the store")
                #expect(dead + pending.count + waiting == 400, "nothing lost")
            }
        }
    }
}
