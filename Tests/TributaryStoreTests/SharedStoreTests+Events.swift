import Foundation
import Testing
import TributaryTestSupport

@testable import TributaryStore

// What a store holds: gap-free sequence numbers, deletes, records, identity, configuration, its id.
extension SharedStoreTests {
    @Test("sequence numbers are gap-free across concurrent writers and batches")
    func gapFreeSequences() async throws {
        try await withTemporaryGroup { group in
            let store = try SharedStore(groupDirectory: group)
            let producers = (0..<4).map { SharedStore.Producer(kind: .app, id: "p\($0)") }
            let results = try await withThrowingTaskGroup(of: [SharedStore.Appended].self) { tasks in
                for p in producers {
                    tasks.addTask {
                        var out: [SharedStore.Appended] = []
                        for batch in [1, 5, 1, 20, 3] { out += try Self.append(store, batch, producer: p) }
                        return out
                    }
                }
                return try await tasks.reduce(into: []) { $0.append($1) }
            }
            let seqs = results.flatMap { $0.map(\.seq) }.sorted()
            #expect(seqs == Array(1...UInt64(4 * 30)))
            for perProducer in results {
                #expect(perProducer.map(\.producerSeq) == Array(1...30))
                #expect(perProducer.map(\.seq) == perProducer.map(\.seq).sorted())
            }
            let stored = try store.events(limit: 1000)
            #expect(stored.map(\.seq) == Array(1...120))
            let status = try store.status()
            #expect(status.pendingEvents == 120 && status.lastAssignedSeq == 120)
            #expect(Set(status.producers.map(\.lastSeq)) == [30])
        }
    }

    @Test("deleting drained events keeps the sequence counter")
    func deleteThrough() throws {
        try withTemporaryGroup { group in
            let store = try SharedStore(groupDirectory: group)
            try Self.append(store, 10)
            #expect(try store.deleteEvents(through: 4) == 4)
            #expect(try store.events(limit: 100).map(\.seq) == Array(5...10))
            #expect(try store.deleteEvents(through: 4) == 0)
            #expect(try Self.append(store, 1).first?.seq == 11)
            #expect(try store.deleteEvents(through: 100) == 7)
            #expect(try store.status().oldestSeq == nil)
        }
    }

    @Test("a store has an id of its own, the same each time it is opened, another once created anew")
    func storeID() throws {
        try withTemporaryGroup { group in
            let id = try SharedStore(groupDirectory: group).storeID
            #expect(id != 0)
            #expect(try SharedStore(groupDirectory: group).storeID == id)
            try FileManager.default.removeItem(atPath: group)
            #expect(try SharedStore(groupDirectory: group).storeID != id)
        }
    }

    @Test("identity: anonymous id created once, login and logout")
    func identity() throws {
        try withTemporaryGroup { group in
            let store = try SharedStore(groupDirectory: group)
            let first = try store.identity()
            #expect(try store.identity() == first)
            #expect(first.loginID == nil && first.distinctID == first.anonymousID)
            let loggedIn = try store.login("user-1")
            #expect(loggedIn.distinctID == "user-1" && loggedIn.anonymousID == first.anonymousID)
            #expect(try store.logout().distinctID == first.anonymousID)
            #expect(try store.identify(anonymousID: "anon-2").anonymousID == "anon-2")
            #expect(try store.identity().deviceID == first.deviceID)
        }
    }

    @Test("configuration values round trip")
    func configuration() throws {
        try withTemporaryGroup { group in
            let store = try SharedStore(groupDirectory: group)
            try store.setConfiguration("server_url", json: #""http://127.0.0.1:8106/sa?project=demo""#)
            try store.setConfiguration("flush_bulk_size", json: "100")
            #expect(try store.configuration() == [
                "server_url": #""http://127.0.0.1:8106/sa?project=demo""#, "flush_bulk_size": "100",
            ])
            #expect(try store.removeConfiguration("flush_bulk_size"))
            #expect(try store.configuration().count == 1)
        }
    }

    @Test("an event whose boot is unknown is stored with a boot time of 0, as the record format says")
    func unknownBootTime() throws {
        try withTemporaryGroup { group in
            let store = try SharedStore(groupDirectory: group)
            let appended = try store.append(producer: Self.producer, count: 2) { index, _ in
                SharedStore.Draft(
                    wallTimeMillis: 1, bootTimeNanos: 123_456, bootID: index == 0 ? .unknown : .current, body: Array("{}".utf8))
            }
            let records = try appended.map { try #require(try store.rawEvent(seq: $0.seq)) }
                .map { bytes in try bytes.withUnsafeBytes { try EventRecord.decode($0) } }
            #expect(records.map(\.bootTimeNanos) == [0, 123_456])
        }
    }

    @Test("producer ids outside 1...255 bytes are refused")
    func producerIDLimits() throws {
        try withTemporaryGroup { group in
            let store = try SharedStore(groupDirectory: group)
            for id in ["", String(repeating: "x", count: 256)] {
                let error = #expect(throws: StoreError.self) {
                    try Self.append(store, 1, producer: .init(kind: .app, id: id))
                }
                #expect(error?.code == .valueTooLarge)
            }
            #expect(try store.status().pendingEvents == 0)
        }
    }
}
