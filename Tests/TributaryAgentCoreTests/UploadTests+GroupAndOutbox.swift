import Foundation
import Testing
import TributaryCollector
import TributaryStore
import TributaryTestSupport

@testable import TributaryAgentCore

// The agent's group and outbox: a store created anew or restored from a copy, the group's lock, the outbox WAL.
extension UploadTests {
    @Test("a group store created anew under the same outbox is drained from its first event, not skipped as drained")
    func storeCreatedAnew() async throws {
        try await withTemporaryGroup { group in
            try await Collector.withRunning(CollectorConfiguration()) { collector in
                try await Self.produce(group, count: 30)
                let first = try SharedStore(groupDirectory: group).storeID
                _ = try await Self.agent(group, collector).runOnce()
                #expect(try await collector.stats().unique == 30)
                // The app reinstalled, or the store removed by hand: the outbox (under $STATE_DIRECTORY) stays.
                try FileManager.default.removeItem(atPath: group)
                try await Self.produce(group, count: 20)
                let second = try SharedStore(groupDirectory: group).storeID
                #expect(second != first && second != 0)
                let agent = try Self.agent(group, collector)
                _ = try await agent.runOnce()
                #expect(try await collector.stats().unique == 50, "the new store's seqs 1…20 are not the old store's")
                #expect(try SharedStore(groupDirectory: group).status().pendingEvents == 0)
                #expect(try agent.outbox.counters().duplicatesSkipped == 0)
                let seqs = try await collector.events(limit: 100).compactMap(\.seq)
                #expect(seqs == Array(1...30) + Array(1...20))
            }
        }
    }

    @Test("a group store restored from an earlier copy of itself is drained again: no new event is skipped as drained, however many chunks were drained since")
    func storeRestoredFromBackup() async throws {
        try await withTemporaryGroup { group in
            try await Collector.withRunning(CollectorConfiguration()) { collector in
                let path = group + "/" + SharedStore.fileName
                try await Self.produce(group, count: 30)
                _ = try await Self.agent(group, collector).runOnce()
                try await Self.produce(group, count: 10)
                // A backup of the group directory: drained through seq 30, seqs 31…40 waiting.
                try FileManager.default.copyItem(atPath: path, toPath: group + "-backup.mdb")
                try await Self.produce(group, count: 10)
                _ = try await Self.agent(group, collector).runOnce()  // 31…50, one chunk
                #expect(try await collector.stats().unique == 50)
                // The backup restored (the outbox, under $STATE_DIRECTORY, is not): the same store id, and new
                // events numbered 41… again, seqs the outbox drained through 50 from the lost copy.
                try FileManager.default.removeItem(atPath: path)
                try FileManager.default.removeItem(atPath: path + "-lock")
                try FileManager.default.copyItem(atPath: group + "-backup.mdb", toPath: path)
                try await Self.produce(group, count: 15)
                _ = try await Self.agent(group, collector).runOnce()
                // Seqs 41…50 of the new events were skipped as drained, and deleted unsent: 55.
                #expect(try await collector.stats().unique == 65)
                #expect(try await collector.stats().duplicates >= 10, "31…40 went again, with their ids")
                #expect(try SharedStore(groupDirectory: group).status().pendingEvents == 0)
            }
        }
    }

    @Test("an idle agent empties and cuts back an outbox WAL over its limit (idleWALBytes)")
    func idleWALTruncated() async throws {
        try await withTemporaryGroup { group in
            try await Self.produce(group, count: 400)
            try await Collector.withRunning(CollectorConfiguration()) { collector in
                let agent = try Self.agent(group, collector) {
                    $0.idleWALBytes = 1
                    $0.bulkSize = 50
                }
                try await GroupSettingsTests.whileRunning(agent) {
                    let delivered = try await Self.eventually { try await collector.stats().unique == 400 }
                    #expect(delivered)
                    // The periodic checkpoint, once a second, finds nothing pending.
                    let cut = try await Self.eventually { agent.outbox.walFileBytes == 0 }
                    #expect(cut, "\(agent.outbox.walFileBytes) bytes")
                }
            }
        }
    }

    @Test("a second agent on the same group refuses to start")
    func secondAgentRefused() async throws {
        try await withTemporaryGroup { group in
            try await Collector.withRunning(CollectorConfiguration()) { collector in
                let first = try Self.agent(group, collector)
                let error = #expect(throws: AgentError.self) {
                    _ = try Self.agent(group, collector) { $0.outboxPath = group + "-other/outbox.sqlite" }
                }
                #expect(error?.code == .alreadyRunning)
                #expect(error?.message.contains("pid \(getpid())") == true)
                _ = try await first.runOnce()
                // The lock is released when a run ends.
                _ = try Self.agent(group, collector) { $0.outboxPath = group + "-other/outbox.sqlite" }
            }
        }
    }
}
