import AsyncHTTPClient
import Foundation
import Testing
import TributaryCollector

@Suite("Faults: injected failures, resets, lost acknowledgements, hangs, limits")
struct FaultTests {
    @Test("A token is required when configured: 401 without it or with a wrong one, 200 with it")
    func requiresToken() async throws {
        try await Collector.withRunning(CollectorConfiguration(token: "s3cret")) { collector in
            let events = Events.run(2)
            let missing = try await Client(collector).post(events)
            #expect(missing.status == 401)
            #expect(missing.object["code"] as? String == "unauthorized")
            #expect(missing.headers["WWW-Authenticate"] == ["Bearer"])
            #expect(try await Client(collector, token: "s3cre").post(events).status == 401)
            #expect(try await Client(collector, token: "s3cret").post(events).status == 200)
            let stats = try await collector.stats()
            #expect(stats.rejectedBatches == 2 && stats.batches == 1 && stats.unique == 2)
        }
    }

    @Test("A poisoned batch is rejected whole, naming the first offending event", arguments: [400, 422])
    func rejectsPoison(status: Int) async throws {
        let faults = FaultConfiguration(poisonPattern: "^Poison", poisonStatus: status)
        try await Collector.withRunning(CollectorConfiguration(faults: faults)) { collector in
            let batch = [
                Events.track("Fine", seq: 1, producerSeq: 1), Events.track("PoisonPill", seq: 2, producerSeq: 2),
                Events.track("PoisonToo", seq: 3, producerSeq: 3),
            ]
            let reply = try await Client(collector).post(batch)
            #expect(reply.status == status)
            #expect(reply.object["code"] as? String == "poison")
            #expect(reply.object["index"] as? Int == 1)
            #expect((reply.object["error"] as? String)?.contains("event 1") == true)
            let stats = try await collector.stats()
            #expect(stats.unique == 0 && stats.faults.poison == 1)
            #expect(try await collector.events().isEmpty)
            #expect(try await Client(collector).post([batch[0]]).status == 200)
        }
    }

    @Test("More events than maxEventsPerBatch is a 413")
    func limitsEventsPerBatch() async throws {
        let faults = FaultConfiguration(maxEventsPerBatch: 2)
        try await Collector.withRunning(CollectorConfiguration(faults: faults)) { collector in
            let reply = try await Client(collector).post(Events.run(3))
            #expect(reply.status == 413)
            #expect((reply.object["error"] as? String)?.contains("3 events") == true)
            #expect(try await Client(collector).post(Events.run(2)).status == 200)
            let stats = try await collector.stats()
            #expect(stats.faults.tooLarge == 1 && stats.unique == 2)
        }
    }

    @Test("A body over maxBodyBytes is a 413")
    func limitsBodyBytes() async throws {
        try await Collector.withRunning(CollectorConfiguration(maxBodyBytes: 512)) { collector in
            let body = [UInt8](repeating: UInt8(ascii: "a"), count: 4096)
            let reply = try await Client(collector).post(body, headers: [("Content-Type", "application/x-ndjson")])
            #expect(reply.status == 413)
            #expect(try await collector.stats().faults.tooLarge == 1)
        }
    }

    @Test("failureRate 1 answers failureStatus with Retry-After and stores nothing")
    func injectsFailures() async throws {
        let faults = FaultConfiguration(failureRate: 1, retryAfter: "7")
        try await Collector.withRunning(CollectorConfiguration(faults: faults)) { collector in
            let reply = try await Client(collector).post(Events.run(2))
            #expect(reply.status == 503)
            #expect(reply.headers.first(name: "Retry-After") == "7")
            #expect(reply.object["code"] as? String == "injected_failure")
            let stats = try await collector.stats()
            #expect(stats.faults.failure == 1 && stats.unique == 0 && stats.rejectedBatches == 1)
        }
    }

    @Test("A lost acknowledgement commits the batch, the client sees an error, and the retry is a duplicate")
    func losesAcknowledgements() async throws {
        let faults = FaultConfiguration(lostAckRate: 1)
        try await Collector.withRunning(CollectorConfiguration(faults: faults)) { collector in
            let client = Client(collector)
            let events = Events.run(3)
            await #expect(throws: (any Error).self) { try await client.post(events, batchID: "b-lost") }
            var stats = try await collector.stats()
            #expect(stats.batches == 1 && stats.unique == 3 && stats.faults.lostAck == 1)

            try await collector.setFaults(.none)
            let retry = try await client.post(events, batchID: "b-lost")
            #expect(retry.status == 200)
            #expect(retry.object["accepted"] as? Int == 0)
            #expect(retry.object["duplicates"] as? Int == 3)
            stats = try await collector.stats()
            #expect(stats.unique == 3 && stats.duplicates == 3 && stats.repeatedBatches == 1)
        }
    }

    @Test("A reset drops the connection before any answer and stores nothing")
    func resetsConnections() async throws {
        let faults = FaultConfiguration(resetRate: 1)
        try await Collector.withRunning(CollectorConfiguration(faults: faults)) { collector in
            await #expect(throws: (any Error).self) { try await Client(collector).post(Events.run(2)) }
            let stats = try await collector.stats()
            #expect(stats.unique == 0 && stats.faults.reset == 1 && stats.rejectedBatches == 1)
        }
    }

    @Test(
        "A hang holds the request until the client gives up, and does not block shutdown",
        .timeLimit(.minutes(1))
    )
    func hangs() async throws {
        let faults = FaultConfiguration(hangRate: 1)
        let inFlight = try await Collector.withRunning(CollectorConfiguration(faults: faults)) { collector in
            let client = Client(collector)
            await #expect(throws: HTTPClientError.deadlineExceeded) {
                try await client.post(Events.run(1), timeout: .milliseconds(200))
            }
            let pending = Task { try await client.post(Events.run(1), timeout: .seconds(60)) }
            while try await collector.stats().faults.hang < 2 { try await Task.sleep(for: .milliseconds(5)) }
            #expect(try await collector.stats().unique == 0)
            return pending  // still hanging when the collector shuts down
        }
        await #expect(throws: (any Error).self) { try await inFlight.value }
    }

    @Test("latencyMillis delays every ingest answer")
    func addsLatency() async throws {
        let faults = FaultConfiguration(latencyMillis: 150)
        try await Collector.withRunning(CollectorConfiguration(faults: faults)) { collector in
            let started = ContinuousClock.now
            let reply = try await Client(collector).post(Events.run(1))
            #expect(reply.status == 200)
            #expect(ContinuousClock.now - started >= .milliseconds(150))
        }
    }

    @Test("The same seed gives the same sequence of fault decisions")
    func seedsAreReproducible() async throws {
        let faults = FaultConfiguration(seed: 42, failureRate: 0.3, resetRate: 0.15, lostAckRate: 0.15)
        let first = try await outcomes(of: 30, faults: faults)
        let second = try await outcomes(of: 30, faults: faults)
        #expect(first == second)
        #expect(Set(first) == ["200", "503", "dropped"])
        var reseeded = faults
        reseeded.seed = 43
        #expect(try await outcomes(of: 30, faults: reseeded) != first)

        // Replacing the faults restarts the generator from the seed.
        try await Collector.withRunning(CollectorConfiguration(faults: faults)) { collector in
            let before = try await send(10, to: collector)
            try await collector.setFaults(faults)
            #expect(try await send(10, to: collector) == before)
            #expect(before == Array(first.prefix(10)))
        }
    }

    /// The outcome of `count` sequential batches on a fresh collector: the status, or "dropped".
    private func outcomes(of count: Int, faults: FaultConfiguration) async throws -> [String] {
        try await Collector.withRunning(CollectorConfiguration(faults: faults)) { collector in
            try await send(count, to: collector)
        }
    }

    private func send(_ count: Int, to collector: RunningCollector) async throws -> [String] {
        var outcomes: [String] = []
        for _ in 0..<count {
            do {
                outcomes.append(String(try await Client(collector).post(Events.run(1)).status))
            } catch {
                outcomes.append("dropped")
            }
        }
        return outcomes
    }
}
