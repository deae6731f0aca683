import Foundation
import Testing
import TributaryTestSupport

@testable import TributaryStore

// A store whose files are removed, renamed or created anew while it is open.
extension SharedStoreTests {
    /// Opens the store of `group` and appends 3 events, the last once the directory's times are older
    /// than 20 ms: they are trusted then, and that append remembers them, so that a removal after it is
    /// seen through the directory's change.
    static func openSettled(_ group: String) throws -> SharedStore {
        let store = try SharedStore(groupDirectory: group)
        try append(store, 2)
        usleep(50_000)
        try append(store, 1)
        return store
    }

    @Test("a store deleted and created anew by another process while open: writes refuse (nothing goes to the deleted file), a new SharedStore opens the new one")
    func replacedWhileOpen() async throws {
        try await withTemporaryGroup { group in
            let old = try Self.openSettled(group)
            let path = group + "/" + SharedStore.fileName
            try FileManager.default.removeItem(atPath: path)
            try FileManager.default.removeItem(atPath: path + "-lock")
            // Deleted, not yet created anew: a write would go nowhere too.
            let deleted = #expect(throws: StoreError.self) { try Self.append(old, 1) }
            #expect(deleted?.code == .storeReplaced)
            // Another process creates the store again (an app reinstalled) and writes one event.
            let track = try await ChildProcess.run("tributary", ["track", "--create", "--group", group, "--producer-id", "cli", "Fresh"])
            #expect(track.status == 0, "\(track.stderr)")
            for write in [{ _ = try Self.append(old, 1) }, { _ = try old.login("u") }, { try old.setConfiguration("k", json: "1") }] {
                let error = #expect(throws: StoreError.self) { try write() }
                #expect(error?.code == .storeReplaced)
                #expect(error?.message.contains("Open the store again: a new Tracker or SharedStore") == true)
            }
            #expect(old.isReplaced)
            // This process opens the new store beside the old one (no file shared): it sees the other
            // process's event and nothing of the refused writes, and writes into it.
            let new = try SharedStore(groupDirectory: group)
            #expect(!new.isReplaced)
            #expect(try new.events(limit: 10).compactMap { try? $0.record.get().producerID } == ["cli"])
            #expect(try Self.append(new, 1).map(\.seq) == [2])
            #expect(try new.status().pendingEvents == 2)
        }
    }

    @Test("only the data file removed, renamed or linked away while open: writes refuse, and this process does not open it again beside the old one",
          arguments: ["remove", "rename", "link elsewhere, then remove"])
    func dataFileReplacedWhileOpen(how: String) throws {
        try withTemporaryGroup { group in
            let path = group + "/" + SharedStore.fileName
            do {
                let old = try Self.openSettled(group)
                switch how {
                case "remove": try FileManager.default.removeItem(atPath: path)
                case "rename": try FileManager.default.moveItem(atPath: path, toPath: path + ".bak")
                default:
                    // The file keeps a name (its link count stays 1), just not the store's.
                    #expect(link(path, path + ".bak") == 0)
                    try FileManager.default.removeItem(atPath: path)
                }
                let refused = #expect(throws: StoreError.self) { try Self.append(old, 1) }
                #expect(refused?.code == .storeReplaced)
                #expect(refused?.message.contains("Release every Tracker and SharedStore") == true)
                // A second environment would share the lock file with the first: refused, typed.
                let reopen = #expect(throws: StoreError.self) { try SharedStore(groupDirectory: group) }
                #expect(reopen?.code == .storeReplaced)
                #expect(reopen?.message.contains("lock file") == true)
            }
            // Once the old store is closed, the path opens again (a new, empty store).
            let again = try SharedStore(groupDirectory: group)
            #expect(try again.status().pendingEvents == 0)
            try Self.append(again, 1)
        }
    }

    @Test("only the lock file removed while open, and created anew by another process: the store counts as replaced, no write of this process goes beside the new lock, not even the agent's deletes")
    func lockFileReplacedWhileOpen() async throws {
        try await withTemporaryGroup { group in
            let path = group + "/" + SharedStore.fileName
            do {
                let old = try Self.openSettled(group)
                try FileManager.default.removeItem(atPath: path + "-lock")
                #expect(old.isReplaced, "the lock file is gone: the next process to open the store takes another lock")
                // Another process opens the store: a new lock file, the same data file, and writes to it.
                let track = try await ChildProcess.run("tributary", ["track", "--create", "--group", group, "--producer-id", "cli", "Fresh"])
                #expect(track.status == 0, "\(track.stderr)")
                #expect(old.isReplaced)
                let before = old.lastTransactionID
                let delete = #expect(throws: StoreError.self) { try old.deleteEvents(through: 1) }
                #expect(delete?.code == .storeReplaced)
                #expect(delete?.message.contains("lock file") == true)
                let append = #expect(throws: StoreError.self) { try Self.append(old, 1) }
                #expect(append?.code == .storeReplaced)
                #expect(old.lastTransactionID == before, "a write of this process committed under the old lock")
                // A second environment would share the data file with the first, under another lock: refused.
                let reopen = #expect(throws: StoreError.self) { try SharedStore(groupDirectory: group) }
                #expect(reopen?.code == .storeReplaced)
            }
            // Once the old store is closed, the path opens again, with every event.
            let again = try SharedStore(groupDirectory: group)
            #expect(!again.isReplaced)
            #expect(try again.status().pendingEvents == 4)
            #expect(try again.deleteEvents(through: 1) == 1)
        }
    }
}
