import Foundation
import Testing
import Tributary
import TributaryCollector
import TributaryTestSupport

@testable import TributaryAgentCore

// Batches that do not fit: 413 splits, a poison event isolated by bisection, --max-batch-bytes.
extension UploadTests {
    @Test("413 splits the batch until it fits")
    func payloadTooLarge() async throws {
        try await withTemporaryGroup { group in
            try await Self.produce(group, count: 700)
            let faults = FaultConfiguration(maxEventsPerBatch: 60)
            try await Collector.withRunning(CollectorConfiguration(faults: faults)) { collector in
                let agent = try Self.agent(group, collector)
                _ = try await agent.runOnce()
                try await Self.expectDelivered(collector, count: 700)
                #expect(try await collector.stats().faults.tooLarge >= 3)
                #expect(try agent.outbox.deadLetters().isEmpty)
            }
        }
    }

    @Test("an event too large even alone is dead-lettered, and the batch size grows back after it")
    func tooLargeAlone() async throws {
        try await withTemporaryGroup { group in
            let tracker = try Tracker(configuration: .init(groupDirectory: group))
            let padding = Dictionary(uniqueKeysWithValues: (0..<20).map { ("p\($0)", PropertyValue.string(String(repeating: "x", count: 8000))) })
            try await tracker.track("Huge", properties: padding)
            for i in 0..<600 { try await tracker.track("Ordinary", properties: ["i": .int(Int64(i))]) }
            // 64 KiB of body after decompression: the huge event (160 KB) never fits, 500 ordinary ones do.
            try await Collector.withRunning(CollectorConfiguration(maxBodyBytes: 64 << 10)) { collector in
                let agent = try Self.agent(group, collector)
                _ = try await agent.runOnce()
                let letters = try agent.outbox.deadLetters()
                #expect(letters.map(\.seq) == [1] && letters.first?.status == 413)
                let stats = try await collector.stats()
                #expect(stats.unique == 600)
                // 500, 250, … 1 refused (10 requests), then batches of 1, 2, 4, … (about 10), not 100 of one.
                #expect(stats.requests < 40, "\(stats.requests) requests")
            }
        }
    }

    @Test("one poison event in a batch of 500 is isolated in about log2(500) requests")
    func poisonBisect() async throws {
        try await withTemporaryGroup { group in
            let tracker = try Tracker(configuration: .init(groupDirectory: group))
            for i in 0..<500 { try await tracker.track(i == 321 ? "Poison" : "Ordinary", properties: ["i": .int(Int64(i))]) }
            let faults = FaultConfiguration(poisonPattern: "^Poison$", poisonStatus: 422)
            try await Collector.withRunning(CollectorConfiguration(faults: faults)) { collector in
                let agent = try Self.agent(group, collector)
                _ = try await agent.runOnce()
                let stats = try await collector.stats()
                #expect(stats.unique == 499)
                #expect(stats.requests <= 1 + 10, "bisection took \(stats.requests) requests (log2(500) ≈ 9)")
                let letters = try agent.outbox.deadLetters()
                #expect(letters.count == 1)
                #expect(letters.first?.seq == 322 && letters.first?.status == 422)
                #expect(letters.first?.reason.contains("422") == true)
                let seqs = try await collector.events(limit: 1000).compactMap(\.seq)
                #expect(seqs == Array(1...321) + Array(323...500))
            }
        }
    }

    @Test(
        "--max-batch-bytes: each request carries as many whole events as fit (read ahead too), and one event that alone is larger",
        arguments: [5, 0])
    func maxBatchBytes(eventsThatFit: Int) async throws {
        try await withTemporaryGroup { group in
            let tracker = try Tracker(configuration: .init(groupDirectory: group))
            let padding = String(repeating: "p", count: 300)
            for i in 0..<40 { try await tracker.track("Padded", properties: ["i": .int(Int64(i % 10)), "pad": .string(padding)]) }
            let outbox = try Outbox(path: group + "-state/outbox.sqlite")
            #expect(try Drainer(store: tracker.store, outbox: outbox, logger: Self.logger).drainAvailable() == 40)
            // The stored bodies differ by a few bytes at most (their seqs' digits): half an event of room.
            let each = try outbox.pending().bytes / 40
            try await Collector.withRunning(CollectorConfiguration()) { collector in
                let delivered = try await withHTTPClient { client in
                    var configuration = UploadConfiguration(serverURL: collector.url + "/sa")
                    configuration.maxBatchBytes = eventsThatFit == 0 ? each / 2 : eventsThatFit * each + each / 2
                    let session = UploadSession(outbox: outbox, client: client, configuration: configuration, logger: Self.logger)
                    var delivered: [Int] = []
                    while delivered.count < 100, case .progressed(let count, _) = try await session.step() { delivered.append(count) }
                    return delivered
                }
                #expect(delivered == Array(repeating: max(1, eventsThatFit), count: 40 / max(1, eventsThatFit)))
                try await Self.expectDelivered(collector, count: 40)
            }
        }
    }
}
