import Foundation
import Testing
import TributaryCollector
import TributaryTestSupport
import TributaryWire

@testable import TributaryAgentCore

// Delivery through the collector's faults (503s, resets, hangs, lost acknowledgements): retries, backoff, a stop.
extension UploadTests {
    @Test("clean delivery in order", arguments: WireFormat.allCases)
    func cleanDelivery(format: WireFormat) async throws {
        try await withTemporaryGroup { group in
            try await Self.produce(group, count: 1200)
            try await Collector.withRunning(CollectorConfiguration()) { collector in
                let agent = try Self.agent(group, collector, format: format)
                let report = try await agent.runOnce()
                #expect(report.drained == 1200 && report.delivered == 1200)
                try await Self.expectDelivered(collector, count: 1200)
                let stats = try await collector.stats()
                // A clean link sends each batch once; on a loaded machine a request can outlive its 5 s timeout
                // and go again under the same key (a make test run beside a virtual machine saw two of the three
                // twice): the collector's dedup drops those, and nothing else may be repeated.
                #expect(stats.duplicates <= stats.repeatedBatches * 500, "\(stats)")
                #expect(stats.batches - stats.repeatedBatches == 3, "\(stats.batches) batches, \(stats.repeatedBatches) repeated")  // 500 + 500 + 200
                #expect(stats.producers == ["app": 600, "share": 600])
                #expect(try agent.outbox.pending().count == 0)
            }
        }
    }

    @Test("30% 503 with Retry-After: everything arrives, retries counted")
    func serviceUnavailable() async throws {
        try await withTemporaryGroup { group in
            try await Self.produce(group, count: 1000)
            let faults = FaultConfiguration(seed: 7, failureRate: 0.3, failureStatus: 503, retryAfter: "0")
            try await Collector.withRunning(CollectorConfiguration(faults: faults)) { collector in
                let agent = try Self.agent(group, collector) { $0.upload.batchSize = 50 }
                _ = try await agent.runOnce()
                try await Self.expectDelivered(collector, count: 1000)
                let stats = try await collector.stats()
                #expect(stats.faults.failure > 0)
                #expect(try agent.outbox.counters().retries == Int64(stats.faults.failure))
            }
        }
    }

    @Test("resets and hangs: everything arrives once after dedup")
    func resetsAndHangs() async throws {
        try await withTemporaryGroup { group in
            try await Self.produce(group, count: 600)
            let faults = FaultConfiguration(seed: 3, hangRate: 0.15, resetRate: 0.25)
            try await Collector.withRunning(CollectorConfiguration(faults: faults)) { collector in
                let agent = try Self.agent(group, collector) {
                    $0.upload.batchSize = 40
                    $0.upload.requestTimeout = .milliseconds(300)
                }
                _ = try await agent.runOnce()
                try await Self.expectDelivered(collector, count: 600)
                let stats = try await collector.stats()
                #expect(stats.faults.hang > 0 && stats.faults.reset > 0)
            }
        }
    }

    @Test("lost acknowledgements: duplicates on the wire, none after dedup")
    func lostAcks() async throws {
        try await withTemporaryGroup { group in
            try await Self.produce(group, count: 600)
            let faults = FaultConfiguration(seed: 11, lostAckRate: 0.3)
            try await Collector.withRunning(CollectorConfiguration(faults: faults)) { collector in
                let agent = try Self.agent(group, collector) { $0.upload.batchSize = 30 }
                _ = try await agent.runOnce()
                try await Self.expectDelivered(collector, count: 600)
                let stats = try await collector.stats()
                #expect(stats.faults.lostAck > 0)
                #expect(stats.duplicates > 0, "a lost ack must cause a resend")
                #expect(stats.received == 600 + stats.duplicates)
            }
        }
    }

    @Test("a refused connection fails its attempt at once, with no connection retries of the HTTP client's own: the agent's backoff decides")
    func refusedConnectionFailsAtOnce() async throws {
        try await withTemporaryGroup { group in
            try await Self.produce(group, count: 5)
            // Nothing listens there: every connection is refused at once (a TCP reset).
            let agent = try Self.agent(group, serverURL: "http://127.0.0.1:\(try freeLoopbackPort())/sa") {
                $0.upload.requestTimeout = .seconds(30)
            }
            _ = try Drainer(store: agent.store, outbox: agent.outbox, logger: Self.logger).drainAvailable()
            let clock = ContinuousClock()
            try await withHTTPClient(readTimeout: agent.configuration.upload.requestTimeout) { client in
                let session = UploadSession(
                    outbox: agent.outbox, client: client, configuration: agent.configuration.upload, logger: Self.logger)
                for attempt in 1...3 {
                    let started = clock.now
                    let step = try await session.step()
                    let took = clock.now - started
                    guard case .wait = step else {
                        Issue.record("attempt \(attempt): a refused connection must lead to a wait, not \(step)")
                        return
                    }
                    // With async-http-client's own connection retries on, each attempt waited out the
                    // client's 5 s connect timeout while its pool retried behind it (measured: 5.0 s each);
                    // refused, an attempt fails in milliseconds.
                    #expect(took < .seconds(2), "attempt \(attempt) took \(took)")
                    #expect(session.attempt == attempt)
                }
            }
            #expect(try agent.outbox.pending().count == 5, "nothing delivered, nothing dead-lettered")
        }
    }

    @Test("backoff delays stay within their bounds against a failing collector")
    func backoffBounds() async throws {
        try await withTemporaryGroup { group in
            try await Self.produce(group, count: 5)
            let faults = FaultConfiguration(failureRate: 1, failureStatus: 500)
            try await Collector.withRunning(CollectorConfiguration(faults: faults)) { collector in
                let agent = try Self.agent(group, collector)
                _ = try Drainer(store: agent.store, outbox: agent.outbox, logger: Self.logger).drainAvailable()
                let backoff = Backoff(base: .milliseconds(100), cap: .seconds(2))
                var upload = agent.configuration.upload
                upload.backoff = backoff
                try await withHTTPClient { client in
                    let session = UploadSession(outbox: agent.outbox, client: client, configuration: upload, logger: Self.logger)
                    var batchIDs: Set<String> = []
                    var laterDelays: [Duration] = []
                    for attempt in 0..<8 {
                        guard case .wait(let delay) = try await session.step() else {
                            Issue.record("a failing collector must lead to a wait")
                            break
                        }
                        #expect(delay >= .zero && delay <= backoff.ceiling(attempt: attempt))
                        // Each failure counts: the next wait's ceiling doubles, and the outbox's retry counter grows.
                        #expect(session.attempt == attempt + 1)
                        #expect(try agent.outbox.counters().retries == Int64(attempt + 1))
                        if attempt >= 4 { laterDelays.append(delay) }
                        batchIDs.formUnion(try agent.outbox.nextBatch(maxCount: 500, maxBytes: .max).compactMap(\.batchID))
                    }
                    #expect(batchIDs.count == 1, "a retried batch keeps its id")
                    // Attempts 4 to 7 draw from [0, 1.6 s] and [0, 2 s]: all four at or below the base (100 ms)
                    // has a chance below 1 in 10,000, and is what a backoff that never grew would give.
                    #expect(laterDelays.count == 4 && laterDelays.max()! > backoff.base, "the backoff must grow: \(laterDelays)")
                }
            }
        }
    }
}
