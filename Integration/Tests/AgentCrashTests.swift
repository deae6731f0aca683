import Foundation
import Testing
import TributaryCollector
import TributaryStore
import TributaryTestSupport

/// The real `tributary-agent` process, killed at named crash points and at random moments, against
/// the real collector on loopback: nothing acknowledged is lost, nothing duplicated after dedup.
@Suite("Agent crashes", .serialized)
struct AgentCrashTests {
    static func agentArguments(_ group: String, _ url: String, once: Bool = true) -> [String] {
        ["--group", group, "--server", url + "/sa", "--outbox", group + "-state/outbox.sqlite", "--batch-size", "50",
         "--backoff-base", "0.01", "--backoff-cap", "0.05", "--flush-interval", "0.05", "--bulk-size", "1",
         "--log-level", "warning"] + (once ? ["--once"] : [])
    }

    static func ledgerIDs(_ paths: [String]) throws -> [String: [String]] {
        var out: [String: [String]] = [:]
        for path in paths {
            let text = (try? String(contentsOfFile: path, encoding: .utf8)) ?? ""
            out[path] = text.split(separator: "\n").compactMap { $0.split(separator: " ").last.map(String.init) }
        }
        return out
    }

    /// Every acknowledged event arrived exactly once after dedup, in order per producer and by seq.
    static func expectExactlyOnce(
        _ collector: RunningCollector, ledgers: [String], poisoned: Int = 0,
        sourceLocation: SourceLocation = #_sourceLocation
    ) async throws {
        let acknowledged = try ledgerIDs(ledgers).values.flatMap { $0 }
        let events = try await collector.events(limit: 1_000_000)
        let received = Set(events.map(\.eventID))
        #expect(received.count == events.count, "unique events listed twice", sourceLocation: sourceLocation)
        let missing = acknowledged.filter { !received.contains($0) }
        #expect(missing.count == poisoned, "lost \(missing.count - poisoned) acknowledged events", sourceLocation: sourceLocation)
        let stats = try await collector.stats()
        #expect(stats.orderViolations.values.reduce(0, +) == 0, "\(stats.orderViolations)", sourceLocation: sourceLocation)
        #expect(stats.seqViolations == 0, sourceLocation: sourceLocation)
        var lastByProducer: [String: UInt64] = [:]
        for event in events {
            guard let producer = event.producer, let seq = event.producerSeq else { continue }
            #expect(seq > lastByProducer[producer, default: 0], sourceLocation: sourceLocation)
            lastByProducer[producer] = seq
        }
    }

    @Test("SIGKILL at each named crash point, then restart: nothing lost or duplicated after dedup",
          arguments: ["drain.before-outbox-commit", "drain.after-outbox-commit", "upload.after-send",
                      "upload.after-ack", "deadletter.before-commit"])
    func crashPoint(point: String) async throws {
        try await withTemporaryGroup { group in
            let ledger = group + "-ledger"
            let producer = try await ChildProcess.run(
                "tributary-sim", ["load", "--group", group, "--count", "400", "--concurrency", "4", "--ledger", ledger])
            #expect(producer.status == 0, "\(producer.stderr)")
            // Event 123 is poison for the dead-letter point, so that point is reached.
            if point.hasPrefix("deadletter") {
                _ = try await ChildProcess.run("tributary", ["track", "--group", group, "Poison"])
            }
            let faults = FaultConfiguration(poisonPattern: "^Poison$")
            try await Collector.withRunning(CollectorConfiguration(faults: faults)) { collector in
                // Twice in a row at the same point: the restart must survive a crash in its own recovery.
                for _ in 0..<2 {
                    let crashed = try ChildProcess(
                        "tributary-agent", Self.agentArguments(group, collector.url),
                        environment: ["TRIBUTARY_CRASH_AT": point])
                    let result = await crashed.finish()
                    #expect(crashed.process.terminationReason == .uncaughtSignal && result.status == SIGKILL,
                            "agent did not reach \(point) (status \(result.status)): \(result.stderr)")
                }
                let restarted = try await ChildProcess.run("tributary-agent", Self.agentArguments(group, collector.url))
                #expect(restarted.status == 0, "\(restarted.stderr)")
                try await Self.expectExactlyOnce(collector, ledgers: [ledger])
                let stats = try await collector.stats()
                #expect(stats.unique == 400)
                let store = try SharedStore(groupDirectory: group)
                #expect(try store.status().pendingEvents == 0)
                let letters = try await ChildProcess.run("tributary", ["dead-letters", "--outbox", group + "-state/outbox.sqlite", "--json"])
                let expectedLetters = point.hasPrefix("deadletter") ? 1 : 0
                #expect(letters.stdout.components(separatedBy: "\"event_id\"").count - 1 == expectedLetters, "\(letters.stdout)")
            }
        }
    }

    @Test("the agent killed with SIGKILL at random moments 50 times while 2 producers write")
    func killLoop() async throws {
        try await withTemporaryGroup { group in
            let ledgers = [group + "-ledger-a", group + "-ledger-b"]
            let producers = try [
                ChildProcess("tributary-sim", ["load", "--group", group, "--producer-id", "app", "--count", "1500",
                                               "--interval-ms", "2", "--ledger", ledgers[0]]),
                ChildProcess("tributary-sim", ["load", "--kind", "extension", "--group", group, "--producer-id", "share", "--count", "1500",
                                               "--interval-ms", "2", "--concurrency", "2", "--ledger", ledgers[1]]),
            ]
            var rng = SystemRandomNumberGenerator()
            try await Collector.withRunning(CollectorConfiguration(faults: FaultConfiguration(latencyMillis: 2))) { collector in
                var kills = 0
                for _ in 0..<50 {
                    let agent = try ChildProcess("tributary-agent", Self.agentArguments(group, collector.url, once: false))
                    try await Task.sleep(for: .milliseconds(Int.random(in: 30...150, using: &rng)))
                    agent.send(SIGKILL)
                    await agent.finish()
                    if agent.process.terminationReason == .uncaughtSignal { kills += 1 }
                }
                #expect(kills == 50)
                for producer in producers {
                    let result = await producer.finish()
                    #expect(result.status == 0, "\(result.stderr)")
                }
                let final = try await ChildProcess.run("tributary-agent", Self.agentArguments(group, collector.url))
                #expect(final.status == 0, "\(final.stderr)")
                try await Self.expectExactlyOnce(collector, ledgers: ledgers)
                #expect(try await collector.stats().unique == 3000)
            }
        }
    }
}
