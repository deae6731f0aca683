import Foundation
import Testing
import TributaryCollector
import TributaryStore
import TributaryTestSupport

@testable import TributaryAgentCore

// The bearer token of --auth-token-file: sent with every request, read again once corrected.
extension UploadTests {
    @Test("the bearer token of the auth token file (its newline trimmed) opens a collector that requires one")
    func bearerTokenFromFile() async throws {
        try await withTemporaryGroup { group in
            try await Self.produce(group, count: 300)
            let tokenFile = group + "-token"
            // As `echo s3cret > token` writes it: the newline is not part of the token.
            try "s3cret\n".write(toFile: tokenFile, atomically: true, encoding: .utf8)
            try await Collector.withRunning(CollectorConfiguration(token: "s3cret")) { collector in
                let agent = try Self.agent(group, collector) {
                    $0.authTokenFile = tokenFile
                    // A bound on a hang only: a header the client refuses to send is retried until then.
                    $0.deadline = .seconds(30)
                }
                // Without the token the collector answers 401, and the run ends halted.
                let report = try await agent.runOnce()
                #expect(report.delivered == 300)
                try await Self.expectDelivered(collector, count: 300)
                let refused = try await collector.stats().rejectedBatches
                #expect(refused == 0, "\(refused) requests refused: every request must carry the token")
            }
        }
    }

    // docs/wire-formats.md: on 401 everything is kept, uploads halt, and the agent retries at the backoff
    // cap, reading --auth-token-file before each retry, so a token fixed on disk takes effect without a restart.
    // On a manual clock: the halt's waits at the cap pass in the time the work takes, however loaded the machine.
    // Bounded: `drive` steps the clock until its condition holds, so an agent that never halted or never read the
    // file again would otherwise keep the test running.
    @Test("a wrong token halts uploads on 401, keeping every event; the corrected file is read again and all arrive in order, once",
          .timeLimit(.minutes(2)))
    func bearerTokenCorrected() async throws {
        try await withTemporaryGroup { group in
            try await Self.produce(group, count: 300)
            let tokenFile = group + "-token"
            try "expired\n".write(toFile: tokenFile, atomically: true, encoding: .utf8)
            try await Collector.withRunning(CollectorConfiguration(token: "s3cret")) { collector in
                let clock = ManualClock()
                let cap = Duration.seconds(60)
                let agent = try ManualClockAgentTests.agent(group, collector, clock) {
                    $0.authTokenFile = tokenFile
                    $0.upload.backoff = Backoff(base: .milliseconds(5), cap: cap)
                }
                async let run: Void = agent.run()
                // Several refusals, each followed by a re-read of the still wrong file: the halt holds, and the
                // agent says so in its status file.
                var status: AgentStatus?
                var park = try await ManualClockAgentTests.drive(agent, clock) { _ in
                    status = AgentChannel.readStatus(groupDirectory: group)
                    return try await collector.stats().rejectedBatches >= 2 && status?.state == "halted"
                }
                #expect(status?.state == "halted", "the agent never reported itself halted: \(String(describing: status))")
                #expect(status?.haltReason?.contains("401") == true, "halt reason: \(String(describing: status?.haltReason))")
                #expect(try await collector.stats().unique == 0, "the collector accepted events with a wrong token")
                #expect(try agent.outbox.pending().count == 300, "a refused upload must keep every event in the outbox")
                #expect(try agent.outbox.deadLetters().isEmpty, "a 401 dead-letters nothing")
                // Halted, the loop waits out the cap before it tries again.
                #expect(try clock.now.duration(to: #require(park.until)) >= cap / 2, "a halted agent retries at the cap")

                // Fixed as an operator would, while the agent waits the cap: the file replaced; no restart, no
                // flush request. The retry must send the new token: an agent that re-read the file only after a
                // refusal sent the old one once more, and waited the cap again.
                let refusedAtFix = try await collector.stats().rejectedBatches
                try "s3cret\n".write(toFile: tokenFile, atomically: true, encoding: .utf8)
                park = try await ManualClockAgentTests.drive(agent, clock, from: park) { _ in
                    try await collector.stats().unique >= 300
                }
                #expect(try await collector.stats().rejectedBatches == refusedAtFix, "a retry after the fix sent the old token")
                try await Self.expectDelivered(collector, count: 300)
                // Once after dedup, the promise: a request that outlived the HTTP client's own timeout (real time)
                // on a loaded machine is sent again under its key, and the collector's dedup drops the copy; no
                // event may come again in another batch.
                let stats = try await collector.stats()
                #expect(stats.duplicates <= stats.repeatedBatches * agent.configuration.upload.batchSize, "\(stats)")
                // The collector counts an event once it stored it; the agent's acknowledgement commits after.
                park = try await ManualClockAgentTests.drive(agent, clock, from: park) { _ in
                    try agent.outbox.pending().count == 0
                }
                #expect(try agent.outbox.pending().count == 0, "the outbox kept acknowledged events")
                try await ManualClockAgentTests.stop(agent, clock, from: park)
                try await run
            }
        }
    }
}
