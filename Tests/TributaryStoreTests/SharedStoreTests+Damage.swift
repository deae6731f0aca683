import Foundation
import Testing
import TributaryTestSupport

@testable import TributaryStore

// I/O errors and damaged or foreign files: reported, and nothing written.
extension SharedStoreTests {
    @Test("an I/O error at commit is reported and writes nothing")
    func commitFailure() throws {
        try withTemporaryGroup { group in
            let store = try SharedStore(groupDirectory: group)
            try Self.append(store, 3)
            store.faults.inject(EIO, at: .commit)
            let error = #expect(throws: StoreError.self) { try Self.append(store, 5) }
            #expect(error?.code == .lmdb)
            #expect(error?.lmdbCode == EIO)
            #expect(try store.status().pendingEvents == 3)
            #expect(try Self.append(store, 1).first?.seq == 4)
        }
    }

    // A NUL in a table name read from a damaged page once cut the walker's line (the page-damage fuzz,
    // seed 84188): the next store's verdict was read as this one's.
    @Test("a walker's verdict line escapes control characters: a reason holding a NUL, a tab or a newline stays one verdict")
    func verdictLineEscapesControls() {
        let line = StoreCheck.verdictLine(.damaged, "table \u{0}na\tme\nend")
        #expect(line.last == UInt8(ascii: "\n") && line.filter { $0 == UInt8(ascii: "\n") }.count == 1)
        #expect(!line.contains(0))
        let text = String(decoding: line.dropLast(), as: UTF8.self)
        #expect(StoreCheck.verdict(line: text) == .damaged(#"table \u{0}na\u{9}me\u{a}end"#))
        let intact = String(decoding: StoreCheck.verdictLine(.intact, "").dropLast(), as: UTF8.self)
        #expect(StoreCheck.verdict(line: intact) == .intact)
    }

    @Test("a record whose CRC does not match is reported, never returned as data")
    func corruptRecordReported() throws {
        try withTemporaryGroup { group in
            let store = try SharedStore(groupDirectory: group)
            try Self.append(store, 3)
            var raw = try #require(try store.rawEvent(seq: 2))
            raw[raw.count - 1] ^= 0x01
            try store.overwriteRawEvent(seq: 2, bytes: raw)
            let events = try store.events(limit: 10)
            #expect(events.count == 3)
            #expect((try? events[0].record.get()) != nil)
            guard case .failure(let corruption) = events[1].record else {
                Issue.record("corrupt record was returned as valid data")
                return
            }
            #expect(corruption.reason.contains("CRC mismatch"))
            #expect((try? events[2].record.get()) != nil)
        }
    }

    @Test("a store from a newer schema is refused and left untouched, one with a table fewer too", arguments: [nil, "config"])
    func newerSchema(dropping table: String?) throws {
        try withTemporaryGroup { group in
            do {
                let store = try SharedStore(groupDirectory: group)
                try Self.append(store, 2)
                try store.overwriteSchemaVersion(SharedStore.schemaVersion + 1)
                if let table { try store.dropTable(table) }
            }
            let path = group + "/" + SharedStore.fileName
            let before = try Data(contentsOf: URL(fileURLWithPath: path))
            // The first store is gone, so this opens the environment afresh and reads the schema again.
            let error = #expect(throws: StoreError.self) { try SharedStore(groupDirectory: group) }
            #expect(error?.code == .unsupportedSchema)
            // Nothing written: not the schema version, not a store id, not the events.
            #expect(try Data(contentsOf: URL(fileURLWithPath: path)) == before)
        }
    }

    @Test("a last_seq of the wrong size is refused as damaged metadata, and nothing is written; one behind the newest event is never handed out again")
    func damagedLastSeq() throws {
        try withTemporaryGroup { group in
            let store = try SharedStore(groupDirectory: group)
            try Self.append(store, 3)
            _ = try store.deleteEvents(through: 3)  // drained: an empty store would number from 1 again
            try store.overwriteMeta(MetaKey.lastSeq, bytes: [0, 0, 0, 3])
            let before = store.lastTransactionID
            let error = #expect(throws: StoreError.self) { try Self.append(store, 1) }
            #expect(error?.code == .corruptRecord, "\(String(describing: error))")
            #expect(error?.message.contains("meta/last_seq holds 4 bytes, not 8") == true, "\(String(describing: error))")
            #expect(store.lastTransactionID == before)
            #expect(throws: StoreError.self) { try store.status() }

            // Valid but behind the newest event the store holds (9, after 7 and 8): the next seq follows the newest.
            try store.overwriteMeta(MetaKey.lastSeq, bytes: withUnsafeBytes(of: UInt64(6).bigEndian) { Array($0) })
            try Self.append(store, 3)
            try store.overwriteMeta(MetaKey.lastSeq, bytes: withUnsafeBytes(of: UInt64(2).bigEndian) { Array($0) })
            #expect(try Self.append(store, 2).map(\.seq) == [10, 11])
        }
    }

    // A table name read from a damaged page that is not valid UTF-8 was opened as U+FFFD in its place,
    // which LMDB did not find: "no verdict" where it is damage (the page-damage fuzz, seed 568148).
    @Test("a table name in the main database that cannot be opened by its bytes is damage, not a walk left undone")
    func damagedTableName() throws {
        try withTemporaryGroup { group in
            do { _ = try SharedStore(groupDirectory: group) }  // a new store, closed again
            var bytes = [UInt8](try Data(contentsOf: URL(fileURLWithPath: group + "/" + SharedStore.fileName)))
            let name = Array("producers".utf8)
            // Every copy of it (pages of earlier transactions hold some): one of them is the live page's.
            let found = (0...(bytes.count - name.count)).filter { Array(bytes[$0..<$0 + name.count]) == name }
            try #require(!found.isEmpty, "the table's name is in the main database's page")
            for at in found { bytes[at] = 0xFF }  // no longer UTF-8
            let copy = group + "/damaged"
            try FileManager.default.createDirectory(atPath: copy, withIntermediateDirectories: false)
            try Data(bytes).write(to: URL(fileURLWithPath: copy + "/" + SharedStore.fileName))
            let (outcome, reason) = PageWalk.walk(path: copy + "/" + SharedStore.fileName)
            #expect(outcome == .damaged, "\(reason)")
            #expect(reason.contains("cannot be opened by that name"), "\(reason)")
        }
    }

    @Test("a data file that is not an LMDB environment is refused as unreadable (not as a newer schema) and left untouched")
    func unreadableDataFile() throws {
        try withTemporaryGroup { group in
            _ = try SharedStore(groupDirectory: group)  // the directory, as a producer makes it
            let path = group + "/" + SharedStore.fileName
            try FileManager.default.removeItem(atPath: path)
            var generator = SystemRandomNumberGenerator()
            let garbage = Data((0..<8192).map { _ in UInt8.random(in: 0...255, using: &generator) })
            try garbage.write(to: URL(fileURLWithPath: path))
            let error = #expect(throws: StoreError.self) { try SharedStore(groupDirectory: group) }
            #expect(error?.code == .unreadableStore, "\(String(describing: error))")
            #expect(error?.message.contains("no LMDB header") == true, "\(String(describing: error))")
            #expect(try Data(contentsOf: URL(fileURLWithPath: path)) == garbage)
        }
    }

    @Test("a damaged producer registration is reported, and the producer's numbers go on above every seq handed out, never again from 1", arguments: [
        "short", "crc", "legacy",
    ])
    func damagedRegistration(damage: String) throws {
        try withTemporaryGroup { group in
            let store = try SharedStore(groupDirectory: group)
            let p = SharedStore.Producer(kind: .app, id: "p")
            _ = try Self.append(store, 5, producer: p)
            _ = try Self.append(store, 3, producer: SharedStore.Producer(kind: .extension, id: "q"))
            // The 29 bytes of the fields, as releases before the CRC wrote them: lastSeq 5.
            var legacy = [UInt8](repeating: 0, count: 29)
            legacy[7] = 5
            switch damage {
            case "short": try store.overwriteRegistration(producerID: "p", bytes: [1, 2, 3])
            case "crc":  // lastSeq's high byte changed under the CRC (a bad page)
                var bytes = legacy + [0, 0, 0, 0]
                bytes[0] = 0x40
                try store.overwriteRegistration(producerID: "p", bytes: bytes)
            default: try store.overwriteRegistration(producerID: "p", bytes: legacy)
            }
            let next = try Self.append(store, 1, producer: p)
            if damage == "legacy" {
                #expect(try store.damagedProducers().isEmpty)
                #expect(next.map(\.producerSeq) == [6], "a registration of an earlier release is read as it is")
            } else {
                // The numbers restarted at 1, repeating those the first events carry.
                #expect(next.map(\.producerSeq) == [9], "above the 8 seqs handed out")
            }
            #expect(try store.damagedProducers().isEmpty, "the append wrote the registration anew")
            #expect(try store.producers().first { $0.id == "p" }?.lastSeq == next.first?.producerSeq)
        }
    }

    @Test("a damaged producer registration is listed by status until that producer's next append")
    func damagedRegistrationListed() throws {
        try withTemporaryGroup { group in
            let store = try SharedStore(groupDirectory: group)
            _ = try Self.append(store, 2, producer: SharedStore.Producer(kind: .app, id: "p"))
            try store.overwriteRegistration(producerID: "p", bytes: Array(repeating: 0xFF, count: 33))
            let status = try store.status()
            #expect(status.damagedProducers == ["p"] && status.producers.isEmpty)
        }
    }
}
