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
    @Test("a wrong token halts uploads on 401, keeping every event; the corrected file is read again and all arrive in order, once")
    func bearerTokenCorrected() async throws {
        try await withTemporaryGroup { group in
            try await Self.produce(group, count: 300)
            let tokenFile = group + "-token"
            try "expired\n".write(toFile: tokenFile, atomically: true, encoding: .utf8)
            try await Collector.withRunning(CollectorConfiguration(token: "s3cret")) { collector in
                let agent = try Self.agent(group, collector) {
                    $0.authTokenFile = tokenFile
                    // Halted, the agent retries at the cap: 2 s leaves the test, on a loaded machine, time to fix
                    // the file between two refusals.
                    $0.upload.backoff = Backoff(base: .milliseconds(5), cap: .seconds(2))
                    // A failed test stops at once rather than retrying through the default 80 s stop timeout.
                    $0.stopTimeout = .seconds(2)
                }
                let running = Task { try await agent.run() }
                defer { running.cancel() }
                let clock = ContinuousClock()
                // Several refusals, each followed by a re-read of the still wrong file: the halt holds. The
                // status file is written about once a second, so it is polled with the collector's counts.
                var waitedFrom = clock.now
                var status: AgentStatus?
                var refused = 0
                while clock.now - waitedFrom < .seconds(30) {
                    status = AgentChannel.readStatus(groupDirectory: group)
                    refused = try await collector.stats().rejectedBatches
                    if status?.state == "halted" && refused >= 2 { break }
                    try await Task.sleep(for: .milliseconds(20))
                }
                #expect(status?.state == "halted", "the agent never reported itself halted: \(String(describing: status))")
                #expect(status?.haltReason?.contains("401") == true, "halt reason: \(String(describing: status?.haltReason))")
                #expect(refused >= 2, "only \(refused) requests refused in 30 s: a halted agent retries at the cap")
                #expect(try await collector.stats().unique == 0, "the collector accepted events with a wrong token")
                #expect(try agent.outbox.pending().count == 300, "a refused upload must keep every event in the outbox")
                #expect(try agent.outbox.deadLetters().isEmpty, "a 401 dead-letters nothing")

                // Fixed as an operator would, right after a refusal (the agent then waits the cap): the file
                // replaced; no restart, no flush request. The retry must send the new token: an agent that
                // re-read the file only after a refusal sent the old one once more, and waited the cap again.
                let seen = try await collector.stats().rejectedBatches
                while try await collector.stats().rejectedBatches == seen, clock.now - waitedFrom < .seconds(30) {
                    try await Task.sleep(for: .milliseconds(5))
                }
                let refusedAtFix = try await collector.stats().rejectedBatches
                try "s3cret\n".write(toFile: tokenFile, atomically: true, encoding: .utf8)
                waitedFrom = clock.now
                var delivered = 0
                while clock.now - waitedFrom < .seconds(30) {
                    delivered = try await collector.stats().unique
                    if delivered >= 300 { break }
                    try await Task.sleep(for: .milliseconds(20))
                }
                #expect(delivered == 300, "\(delivered) of 300 delivered 30 s after the token file was corrected")
                #expect(try await collector.stats().rejectedBatches == refusedAtFix, "a retry after the fix sent the old token")
                try await Self.expectDelivered(collector, count: 300)
                // Once after dedup, the promise: a request that outlived its timeout on a loaded machine is sent
                // again, and the collector's dedup drops the copy (a fresh-clone CI run saw each batch three times).
                let stats = try await collector.stats()
                #expect(stats.unique == 300 && stats.received - stats.duplicates == 300,
                        "\(stats.unique) unique, \(stats.received) received, \(stats.duplicates) duplicates")
                // The collector counts an event once it stored it; the agent's acknowledgement commits after.
                #expect(try await Self.eventually { try agent.outbox.pending().count == 0 }, "the outbox kept acknowledged events")
                agent.requestStop()
                try await running.value
            }
        }
    }
}
