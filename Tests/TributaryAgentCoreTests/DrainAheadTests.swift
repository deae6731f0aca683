import Foundation
import Logging
import Synchronization
import Testing
import TributaryCollector
import TributaryStore
import TributaryTestSupport
import TributaryWire

@testable import TributaryAgentCore

/// The drain-ahead bound, the outbox's row-free batch reads and the settings that come with them,
/// against real LMDB, SQLite and the reference collector on loopback.
@Suite("Drain ahead and batch reads")
struct DrainAheadTests {
    /// Runs `body` with an agent (100-event batches and drain chunks, adjusted by `adjust`) on a group
    /// of `events` events, uploading to a collector with `faults`.
    private static func withAgent(
        events: Int, faults: FaultConfiguration, _ adjust: @escaping (inout AgentConfiguration) -> Void,
        _ body: (Agent, RunningCollector) async throws -> Void
    ) async throws {
        try await withTemporaryGroup { group in
            try await UploadTests.produce(group, count: events)
            try await Collector.withRunning(CollectorConfiguration(faults: faults)) { collector in
                try await body(try UploadTests.agent(group, collector) { config in
                    config.upload.batchSize = 100
                    config.drainChunk = 100
                    adjust(&config)
                }, collector)
            }
        }
    }

    @Test("while the collector answers, the outbox holds at most the drain-ahead bound (plus one chunk)")
    func boundedWhileAnswered() async throws {
        try await Self.withAgent(events: 3000, faults: FaultConfiguration(seed: 1, latencyMillis: 20), { $0.drainAhead = 500 }) {
            agent, collector in
            // Sampled on a thread of its own: a task would share the two-thread pool the agent's run keeps busy,
            // and a starved sampler sees neither the peak nor the outbox filling.
            let largest = Largest()
            let done = DoneFlag()
            let stopped = DispatchSemaphore(value: 0)
            let outbox = agent.outbox
            Thread.detachNewThread {
                while !done.isSet {
                    if let pending = try? outbox.pending().count { largest.record(pending) }
                    usleep(2000)
                }
                stopped.signal()
            }
            let report = try await agent.runOnce()
            done.set()
            stopped.wait()
            #expect(report.drained == 3000 && report.delivered == 3000)
            #expect(largest.value <= 500 + 100, "outbox pending peaked at \(largest.value)")
            #expect(largest.value >= 200, "the outbox still holds batches ahead of the uploads")
            try await UploadTests.expectDelivered(collector, count: 3000)
            // Only a batch sent again under its key (a request that outlived its timeout on a loaded
            // machine) may repeat events; the collector's dedup drops those.
            let stats = try await collector.stats()
            #expect(stats.duplicates <= stats.repeatedBatches * 500, "\(stats)")
        }
    }

    @Test("while uploads fail, the drain goes on up to the quota: the outbox absorbs the outage")
    func unboundedWhileFailing() async throws {
        let faults = FaultConfiguration(seed: 2, failureRate: 1.0, failureStatus: 503, retryAfter: "0")
        try await Self.withAgent(events: 1500, faults: faults, { config in
            config.drainAhead = 200
            config.stopTimeout = .seconds(1)
        }) { agent, collector in
            // Until the store is empty, however long a loaded machine takes (about 30 durable chunks).
            let running = Task { try await agent.run() }
            let began = Date()
            while try agent.store.status().pendingEvents > 0, Date().timeIntervalSince(began) < 60 {
                try await Task.sleep(for: .milliseconds(20))
            }
            agent.requestStop()
            try await running.value
            #expect(try await collector.stats().unique == 0)
            #expect(try agent.outbox.pending().count == 1500, "the drain stopped at the drain-ahead bound")
            #expect(try agent.store.status().pendingEvents == 0)
        }
    }

    @Test("while an upload waits (a Retry-After, no collector URL), events stored meanwhile are drained too",
          arguments: ["Retry-After", "no URL"])
    func drainsWhileUploadsWait(wait: String) async throws {
        try await withTemporaryGroup { group in
            try await UploadTests.produce(group, count: 150)
            let faults = FaultConfiguration(seed: 3, failureRate: 1.0, failureStatus: 503, retryAfter: "30")
            try await Collector.withRunning(CollectorConfiguration(faults: faults)) { collector in
                let url = wait == "no URL" ? nil : collector.url + "/sa"
                let agent = try UploadTests.agent(group, serverURL: url) { config in
                    config.upload.batchSize = 100
                    config.drainChunk = 100
                    config.drainAhead = 200
                    config.upload.backoff = Backoff(
                        base: .milliseconds(5), cap: .milliseconds(40), maxRetryAfter: .seconds(30))
                    config.stopTimeout = .seconds(2)
                }
                try await GroupSettingsTests.whileRunning(agent) {
                    // The first 150 drained: more than a batch, whose upload waits 30 s (or for a URL).
                    #expect(try await UploadTests.eventually { try agent.store.status().pendingEvents == 0 })
                    if wait == "Retry-After" {
                        #expect(try await UploadTests.eventually { try await collector.stats().requests >= 1 })
                    }
                    try await UploadTests.produce(group, count: 300)
                    // The drain skipped every turn for the upload it expected, and the 300 stayed in the store.
                    let drained = try await UploadTests.eventually(within: 20) { try agent.store.status().pendingEvents == 0 }
                    #expect(drained, "\((try? agent.store.status().pendingEvents) ?? -1) events left in the store")
                    #expect(try agent.outbox.pending().count == 450)
                }
                #expect(try await collector.stats().unique == 0)
            }
        }
    }

    @Test("the bound is at least two batches and the bulk size")
    func effectiveBound() {
        var config = AgentConfiguration(groupDirectory: "/tmp/g", serverURL: "http://127.0.0.1:1/sa")
        config.drainAhead = 10
        config.upload.batchSize = 300
        config.bulkSize = 100
        #expect(config.effectiveDrainAhead == 600)
        config.bulkSize = 1000
        #expect(config.effectiveDrainAhead == 1000)
        config.drainAhead = .max
        #expect(config.effectiveDrainAhead == .max)
    }

    @Test("gzip levels outside 1 … 9 are a configuration error", arguments: [Int32(0), 10, -1])
    func gzipLevel(level: Int32) {
        var config = AgentConfiguration(groupDirectory: "/tmp/g", serverURL: "http://127.0.0.1:1/sa")
        config.upload.gzipLevel = level
        #expect(throws: AgentError.self) { try config.validate() }
    }

    @Test("a batch read row-free hands over the rows' bytes, the same batch again while in flight, cut to smaller limits")
    func rowFreeBatch() throws {
        try withTemporaryGroup { dir in
            let outbox = try Outbox(path: dir + "/outbox.sqlite")
            try outbox.insertDrained((1...10).map { .event(OutboxTests.row($0)) })
            func read(maxCount: Int, maxBytes: Int) throws -> (Outbox.BatchInfo?, [[UInt8]]) {
                var bodies: [[UInt8]] = []
                let info = try outbox.nextBatch(maxCount: maxCount, maxBytes: maxBytes) { bodies.append(Array($0.body)) }
                return (info, bodies)
            }
            let (first, bodies) = try read(maxCount: 4, maxBytes: .max)
            let batch = try #require(first)
            #expect(batch.count == 4)
            let rows = try outbox.rows(inBatch: batch.id)
            #expect(rows.map(\.body) == bodies && rows.map(\.seq) == [1, 2, 3, 4])
            // Not acknowledged: the next read is the same batch, same id and bytes.
            let (again, againBodies) = try read(maxCount: 4, maxBytes: .max)
            #expect(again == batch && againBodies == bodies)
            // Under smaller limits (a deadline near) its first rows become a batch of their own, under a
            // new id; the others go back to the pool.
            let (cut, cutBodies) = try read(maxCount: 2, maxBytes: .max)
            #expect(cut?.count == 2 && cut?.id != batch.id && cutBodies == Array(bodies.prefix(2)))
            #expect(try read(maxCount: 4, maxBytes: .max).0 == cut, "the cut batch is now the one in flight")
            try outbox.acknowledge(try #require(cut).id)
            // The byte limit: the first row always goes, then only rows that fit.
            let size = rows[0].body.count
            let (limited, limitedBodies) = try read(maxCount: 100, maxBytes: size * 2 + 1)
            #expect(limited?.count == 2 && limitedBodies.count == 2)
            try outbox.acknowledge(try #require(limited).id)
            try outbox.acknowledge(try #require(try read(maxCount: 100, maxBytes: .max).0).id)
            #expect(try read(maxCount: 100, maxBytes: .max).0 == nil)
        }
    }

    @Test("decimal digits", arguments: [UInt64(0), 7, 10, 1_234_567_890, .max])
    func decimal(value: UInt64) {
        var out: [UInt8] = []
        appendDecimal(value, to: &out)
        #expect(String(decoding: out, as: UTF8.self) == String(value))
    }
}

/// The largest value recorded, from any task.
private final class Largest: Sendable {
    private let largest = Mutex(0)
    var value: Int { largest.withLock { $0 } }
    func record(_ value: Int) { largest.withLock { $0 = max($0, value) } }
}
