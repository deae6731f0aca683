import Foundation
import Testing
import Tributary
import TributaryCollector
import TributaryStore
import TributaryTestSupport

@testable import TributaryAgentCore

// Batches read ahead while a request is out, and acknowledgements deferred to the next step.
extension UploadTests {
    /// `count` events produced into `group` (``produce(_:count:)``) and drained into its outbox.
    static func drainedOutbox(_ group: String, count: Int) async throws -> Outbox {
        try await produce(group, count: count)
        let tracker = try Tracker(configuration: .init(groupDirectory: group))
        let outbox = try Outbox(path: group + "-state/outbox.sqlite")
        #expect(try Drainer(store: tracker.store, outbox: outbox, logger: logger).drainAvailable() == count)
        return outbox
    }

    @Test("a batch read ahead that waited past its age is built again: _flush_time says when it was sent", arguments: [false, true])
    func staleReadAhead(stale: Bool) async throws {
        try await withTemporaryGroup { group in
            let outbox = try await Self.drainedOutbox(group, count: 20)
            try await Collector.withRunning(CollectorConfiguration()) { collector in
                let resumed = try await withHTTPClient { client in
                    var configuration = UploadConfiguration(serverURL: collector.url + "/sa")
                    configuration.batchSize = 10
                    configuration.readAheadMaxAge = .milliseconds(stale ? 100 : 60_000)
                    let session = UploadSession(outbox: outbox, client: client, configuration: configuration, logger: Self.logger)
                    #expect(try await session.step() == .progressed(delivered: 10))
                    #expect(session.readyBatchCount == 10, "the second batch was read ahead during the first request")
                    try await Task.sleep(for: .milliseconds(300))
                    let resumed = BootClock.wallMillis()
                    #expect(try await session.step() == .progressed(delivered: 10))
                    return resumed
                }
                let flushTimes = try await collector.events().map { event in
                    try #require(try event.jsonObject()["_flush_time"] as? Int64, "every event carries _flush_time")
                }
                #expect(flushTimes.count == 20 && flushTimes.prefix(10).allSatisfy { $0 < resumed })
                if stale {
                    #expect(flushTimes.suffix(10).allSatisfy { $0 >= resumed }, "built again when sent")
                } else {
                    #expect(flushTimes.suffix(10).allSatisfy { $0 < resumed }, "sent as read ahead")
                }
            }
        }
    }

    @Test(
        "deferred acknowledgements: a delivered batch's rows stay until the next batch's step or settle(); off, they go at once; order kept, nothing twice",
        arguments: [true, false])
    func deferredAcknowledgements(deferred: Bool) async throws {
        try await withTemporaryGroup { group in
            let outbox = try await Self.drainedOutbox(group, count: 25)
            try await Collector.withRunning(CollectorConfiguration()) { collector in
                try await withHTTPClient { client in
                    var configuration = UploadConfiguration(serverURL: collector.url + "/sa")
                    configuration.batchSize = 10
                    configuration.readAheadMaxAge = .seconds(600)  // a loaded machine's pause keeps it
                    let session = UploadSession(outbox: outbox, client: client, configuration: configuration, logger: Self.logger)
                    session.defersAcknowledgements = deferred
                    // Deferred, a delivered batch's rows stay until the next request goes (or settle()).
                    let kept = deferred ? 10 : 0
                    #expect(try await session.step() == .progressed(delivered: 10))
                    #expect(session.unsettledCount == kept && session.readyBatchCount == 10)
                    #expect(try outbox.pending().count == 15 + kept)
                    #expect(try await collector.stats().unique == 10)
                    // The second goes as read ahead; the first's rows were deleted while it was out.
                    #expect(try await session.step() == .progressed(delivered: 10))
                    #expect(session.unsettledCount == kept && session.readyBatchCount == 5)
                    #expect(try outbox.pending().count == 5 + kept)
                    try session.settle()
                    #expect(session.unsettledCount == 0 && session.readyBatchCount == 5, "settled, the third batch is the one in flight")
                    #expect(try outbox.pending().count == 5)
                    try session.settle()  // nothing left to settle: no change
                    #expect(try outbox.pending().count == 5)
                    // The last batch has nothing read ahead after it: acknowledged at once.
                    #expect(try await session.step() == .progressed(delivered: 5))
                    #expect(session.unsettledCount == 0)
                    #expect(try outbox.pending().count == 0)
                    #expect(try await session.step() == .empty)
                }
                try await Self.expectDelivered(collector, count: 25)
                let stats = try await collector.stats()
                #expect(stats.duplicates == 0 && stats.requests == 3, "\(stats)")
            }
        }
    }

    @Test("deferred acknowledgements: a batch sent while the outbox changed under it (its predecessor deleted by hand) changes nothing; its events go again, once after dedup")
    func deferredAcknowledgementOutboxChanged() async throws {
        try await withTemporaryGroup { group in
            let outbox = try await Self.drainedOutbox(group, count: 25)
            try await Collector.withRunning(CollectorConfiguration()) { collector in
                let steps = try await withHTTPClient { client in
                    var configuration = UploadConfiguration(serverURL: collector.url + "/sa")
                    configuration.batchSize = 10
                    configuration.readAheadMaxAge = .seconds(600)  // the second step must send the batch read ahead
                    let session = UploadSession(outbox: outbox, client: client, configuration: configuration, logger: Self.logger)
                    session.defersAcknowledgements = true
                    var steps = [try await session.step()]
                    // The delivered batch's rows deleted meanwhile, by another hand: the deferred
                    // acknowledgement then finds it no longer in flight.
                    let inFlight = try outbox.nextBatch(maxCount: 10, maxBytes: 1 << 20)  // the batch delivered
                    try outbox.acknowledge(try #require(inFlight.first?.batchID))
                    while steps.count < 10 {
                        let step = try await session.step()
                        if step == .empty { break }
                        steps.append(step)
                    }
                    return steps
                }
                // The second batch's answer was not applied: its rows went again in a batch built anew.
                #expect(steps == [.progressed(delivered: 10), .progressed(delivered: 0), .progressed(delivered: 10), .progressed(delivered: 5)])
                #expect(try outbox.pending().count == 0)
                try await Self.expectDelivered(collector, count: 25)
                let stats = try await collector.stats()
                #expect(stats.duplicates == 10 && stats.requests == 4, "\(stats)")
            }
        }
    }
}
