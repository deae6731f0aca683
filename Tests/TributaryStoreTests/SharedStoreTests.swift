import CLMDB
import Foundation
import Synchronization
import Testing
import TributaryTestSupport

@testable import TributaryStore

@Suite("Shared store")
struct SharedStoreTests {
    static let producer = SharedStore.Producer(kind: .app, id: "app")

    static func draft(_ body: String) -> SharedStore.Draft {
        SharedStore.Draft(wallTimeMillis: BootClock.wallMillis(), bootTimeNanos: BootClock.nowNanos(), body: Array(body.utf8))
    }

    @discardableResult
    static func append(_ store: SharedStore, _ n: Int, producer: SharedStore.Producer = producer, size: Int = 16) throws
        -> [SharedStore.Appended]
    {
        try store.append(producer: producer, count: n) { i, _ in draft(String(repeating: "x", count: max(0, size - 8)) + "\(i)") }
    }

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

    @Test("releasing the mapped pages empties this process's resident view of the map; reads still see every event")
    func releaseMappedPages() throws {
        try withTemporaryGroup { group in
            let store = try SharedStore(groupDirectory: group)
            try Self.append(store, 2000, size: 2000)
            let before = try store.events(limit: 5000)
            #expect(before.count == 2000)
            let file = group + "/" + SharedStore.fileName
            let resident = try Self.residentKB(ofMapping: file)
            #expect(resident > 1000, "\(resident) kB resident")
            store.releaseMappedPages()
            #expect(try Self.residentKB(ofMapping: file) == 0)
            let after = try store.events(limit: 5000)
            #expect(after.map(\.seq) == before.map(\.seq))
            #expect(after.map { try? $0.record.get().body } == before.map { try? $0.record.get().body })
        }
    }

    @Test("releasing the mapped pages still finds the map after this process resized it")
    func releaseMappedPagesAfterGrowth() throws {
        try withTemporaryGroup { group in
            var options = SharedStore.Options()
            options.initialMapSize = 1 << 20
            let store = try SharedStore(groupDirectory: group, options: options)
            let file = group + "/" + SharedStore.fileName
            try Self.append(store, 100, size: 2000)
            _ = try store.events(limit: 5000)
            store.releaseMappedPages()  // the map's place, read once and kept
            #expect(try Self.residentKB(ofMapping: file) == 0)
            let initialMap = try store.status().mapSize
            try Self.append(store, 2000, size: 2000)  // 4 MB: the map grows (and may move)
            #expect(try store.status().mapSize > initialMap)
            #expect(try store.events(limit: 5000).count == 2100)
            #expect(try Self.residentKB(ofMapping: file) > 1000)
            store.releaseMappedPages()
            #expect(try Self.residentKB(ofMapping: file) == 0, "the pages of the map as it is now must be released")
        }
    }

    /// The `Rss:` of this process's mappings of the file at `path` (`/proc/self/smaps`, matched by inode), in kB.
    static func residentKB(ofMapping path: String) throws -> Int {
        var st = stat()
        guard stat(path, &st) == 0 else { return -1 }  // fails the expectations: the file must exist
        // Read with getline: /proc files report size 0, and smaps is long.
        guard let file = fopen("/proc/self/smaps", "r") else { return -1 }
        defer { fclose(file) }
        var lines: [String] = []
        var buffer: UnsafeMutablePointer<CChar>?
        var capacity = 0
        while getline(&buffer, &capacity, file) > 0, let buffer {
            lines.append(String(cString: buffer).trimmingCharacters(in: .newlines))
        }
        free(buffer)
        var inMapping = false
        var total = 0
        for line in lines {
            let fields = line.split(separator: " ", maxSplits: 5, omittingEmptySubsequences: true)
            if fields.count >= 5, fields[0].contains("-"), fields[0].allSatisfy({ $0.isHexDigit || $0 == "-" }) {
                inMapping = UInt(fields[4]) == UInt(st.st_ino)
            } else if inMapping, line.hasPrefix("Rss:"), fields.count >= 2 {
                total += Int(fields[1]) ?? 0
            }
        }
        return total
    }

    @Test("the map grows on MDB_MAP_FULL up to the quota, then appends fail with storeFull and nothing is touched")
    func mapGrowthThenStoreFull() throws {
        try withTemporaryGroup { group in
            var options = SharedStore.Options()
            options.initialMapSize = 256 << 10
            options.quota = 2 << 20
            let store = try SharedStore(groupDirectory: group, options: options)
            let initialMap = try store.status().mapSize
            var committed = 0
            var failure: StoreError?
            while failure == nil && committed < 100_000 {
                do {
                    try Self.append(store, 10, size: 500)
                    committed += 10
                } catch let error as StoreError {
                    failure = error
                }
            }
            #expect(failure?.code == .storeFull)
            let status = try store.status()
            #expect(status.mapSize > initialMap)
            #expect(status.mapSize <= options.quota)
            #expect(status.pendingEvents == committed)
            #expect(status.lastAssignedSeq == UInt64(committed))
            let stored = try store.events(limit: committed + 10)
            #expect(stored.count == committed)
            #expect(stored.allSatisfy { (try? $0.record.get()) != nil })
            // Draining makes room again without growing past the quota.
            try store.deleteEvents(through: UInt64(committed))
            #expect(try Self.append(store, 10, size: 500).first?.seq == UInt64(committed + 1))
        }
    }

    // A write that found the map full grows it only from the size it found full: another thread of the
    // process may have grown it meanwhile (to the quota, even), and the write then simply tries again.
    @Test("two threads of one process appending across the map's growth to its quota: none is refused")
    func concurrentGrowth() throws {
        for _ in 0..<12 {
            try withTemporaryGroup { group in
                var options = SharedStore.Options()
                options.initialMapSize = 512 << 10
                options.quota = 1 << 20  // one doubling: the map grows once, to the quota
                options.durable = false
                let store = try SharedStore(groupDirectory: group, options: options)
                // Events of 1,500 bytes, two to a page: 200 fill most of the first map (448 of its 512 KiB),
                // then two threads append 60 each, side by side, past it (720 KiB in all, within the quota).
                try Self.append(store, 200, size: 1500)
                let refused = Mutex<[String]>([])
                DispatchQueue.concurrentPerform(iterations: 2) { thread in
                    let producer = SharedStore.Producer(kind: .app, id: "t\(thread)")
                    for _ in 0..<60 {
                        do {
                            try Self.append(store, 1, producer: producer, size: 1500)
                        } catch {
                            refused.withLock { $0.append("\(error)") }
                            return
                        }
                    }
                }
                let refusals = refused.withLock { $0 }
                #expect(refusals.isEmpty, "\(refusals)")
                let status = try store.status()
                #expect(status.mapSize == options.quota)
                if refusals.isEmpty { #expect(status.pendingEvents == 320) }
            }
        }
    }

    @Test(
        "a store filled to its quota is drained chunk by chunk: deletes, which need fresh pages too, never hit the quota",
        arguments: [800, 1200, 2000])
    func drainAtQuota(size: Int) throws {
        try withTemporaryGroup { group in
            var options = SharedStore.Options()
            options.initialMapSize = 256 << 10
            options.quota = 2 << 20
            let store = try SharedStore(groupDirectory: group, options: options)
            var committed = 0
            var full = false
            // Batches, then single events, until not even one more fits.
            for batch in [50, 1] {
                full = false
                while !full {
                    do {
                        try Self.append(store, batch, size: size)
                        committed += batch
                    } catch let error as StoreError where error.code == .storeFull {
                        full = true
                    }
                }
            }
            #expect(committed > 100)
            // The agent's drain: the oldest 1,000 at a time (LMDB copies on write: a delete needs pages).
            var deleted = 0
            while deleted < committed {
                let chunk = try store.events(limit: 1000)
                let last = try #require(chunk.last).seq
                deleted += try store.deleteEvents(through: last)
            }
            let pending = try store.status().pendingEvents
            #expect(deleted == committed && pending == 0)
            #expect(try Self.append(store, 50, size: size).count == 50, "drained, the store takes events again")
        }
    }

    @Test("a quota below the minimum, or an initial map size below 1, is refused at open, not a store that holds nothing")
    func minimumQuota() throws {
        try withTemporaryGroup { group in
            var options = SharedStore.Options()
            options.quota = SharedStore.minimumQuota - 1
            let error = #expect(throws: StoreError.self) { try SharedStore(groupDirectory: group, options: options) }
            #expect(error?.code == .invalidOptions)
            options.quota = SharedStore.minimumQuota
            // Not a map of 2^64 - 1 bytes that mdb_env_open cannot allocate ("Cannot allocate memory").
            for size in [0, -1] {
                options.initialMapSize = size
                let refused = #expect(throws: StoreError.self) { try SharedStore(groupDirectory: group, options: options) }
                #expect(refused?.code == .invalidOptions && refused?.message.contains("initial map size") == true)
            }
            options.initialMapSize = options.quota
            let store = try SharedStore(groupDirectory: group, options: options)
            #expect(try Self.append(store, 10, size: 500).count == 10, "the smallest quota holds events")
        }
    }

    @Test("the smallest quota leaves room for an event of the largest size whatever LMDB's page size", arguments: [4096, 16384, 32768])
    func minimumQuotaPages(pageSize: Int) throws {
        let quota = SharedStore.minimumQuota(pageSize: pageSize)
        let limit = quota - Environment.reserve(quota: quota, pageSize: pageSize)
        // A new store's pages (meta, table roots, identity, a registration: about 10), the room check's
        // allowance for the pages an append copies (8), and an event of the default limit with its header.
        let largest = Environment.footprint(ofRecord: (256 << 10) + 600, pageSize: pageSize)  // Tracker's maxEventBytes
        #expect(limit >= (16 + 8) * pageSize + largest, "quota \(quota), append limit \(limit)")
    }

    @Test("one process cannot have a store open with two durabilities or quotas; once closed, it may reopen it")
    func optionsConflict() throws {
        try withTemporaryGroup { group in
            var store: SharedStore? = try SharedStore(groupDirectory: group)
            var lax = SharedStore.Options()
            lax.durable = false
            let error = #expect(throws: StoreError.self) { try SharedStore(groupDirectory: group, options: lax) }
            #expect(error?.code == .optionsConflict)
            var small = SharedStore.Options()
            small.quota = 4 << 20
            #expect(throws: StoreError.self) { try SharedStore(groupDirectory: group, options: small) }
            #expect(try SharedStore(groupDirectory: group).storeID == store?.storeID, "same options: shared")
            store = nil
            #expect(try SharedStore(groupDirectory: group, options: lax).storeID != 0, "closed: opened anew")
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

    @Test("an injected MDB_MAP_FULL is cured by growing the map")
    func injectedMapFull() throws {
        try withTemporaryGroup { group in
            let store = try SharedStore(groupDirectory: group)
            let before = try store.status().mapSize
            store.faults.inject(MDB_MAP_FULL, at: .put)
            #expect(try Self.append(store, 1).first?.seq == 1)
            #expect(try store.status().mapSize == before * 2)
        }
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

    @Test("the group directory is created owner/group-only and set-group-ID; a world-writable one is refused")
    func directoryPermissions() throws {
        try withTemporaryGroup { group in
            _ = try SharedStore(groupDirectory: group + "/nested")
            var st = stat()
            #expect(stat(group + "/nested", &st) == 0)
            // Set-group-ID: what the agent (another user) creates there gets the app group, not its own.
            #expect(st.st_mode & 0o7777 == 0o2770, "mode \(String(st.st_mode & 0o7777, radix: 8))")

            let open = group + "/open"
            try FileManager.default.createDirectory(atPath: open, withIntermediateDirectories: true)
            chmod(open, 0o777)
            let error = #expect(throws: StoreError.self) { try SharedStore(groupDirectory: open) }
            #expect(error?.code == .insecureDirectory)
            #expect(error?.message.contains("writable by every user") == true)
            #expect(!FileManager.default.fileExists(atPath: open + "/" + SharedStore.fileName))
            // Refused, and left as it was: no set-group-ID bit added.
            #expect(stat(open, &st) == 0 && st.st_mode & 0o7777 == 0o777, "mode \(String(st.st_mode & 0o7777, radix: 8))")
        }
    }

    @Test("an existing group directory without the set-group-ID bit gets it when a store is opened there, and only then")
    func setGroupIDAdded() throws {
        try withTemporaryGroup { group in
            try FileManager.default.createDirectory(atPath: group, withIntermediateDirectories: true)
            chmod(group, 0o750)
            func mode() -> mode_t {
                var st = stat()
                return stat(group, &st) == 0 ? st.st_mode & 0o7777 : 0
            }
            // Looking for a store that is not there (tributary status) changes nothing.
            var lookOnly = SharedStore.Options()
            lookOnly.create = false
            #expect(throws: StoreError.self) { try SharedStore(groupDirectory: group, options: lookOnly) }
            #expect(mode() == 0o750, "mode \(String(mode(), radix: 8))")
            _ = try SharedStore(groupDirectory: group)
            #expect(mode() == 0o2750, "mode \(String(mode(), radix: 8))")
        }
    }

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
            let track = try await ChildProcess.run("tributary", ["track", "--group", group, "--producer-id", "cli", "Fresh"])
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
                let track = try await ChildProcess.run("tributary", ["track", "--group", group, "--producer-id", "cli", "Fresh"])
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

    @Test("every reader slot held by a live process: producers still open the store and write, and readers read, in a write transaction")
    func readerTableFull() async throws {
        try await withTemporaryGroup { group in
            let created = try await ChildProcess.run("tributary", ["track", "--group", group, "Before"])
            #expect(created.status == 0, "\(created.stderr)")
            // A lock file of 2 reader slots (LMDB's default is 126; the process that creates the lock file
            // sizes it, the next ones adopt its size): the one the first process made is removed, with no
            // process having the store open, and this process opens the store with 2 slots and holds both.
            let path = group + "/" + SharedStore.fileName
            try FileManager.default.removeItem(atPath: path + "-lock")
            var env: OpaquePointer?
            try #require(mdb_env_create(&env) == MDB_SUCCESS)
            defer { mdb_env_close(env) }
            try #require(mdb_env_set_maxreaders(env, 2) == MDB_SUCCESS)
            try #require(mdb_env_set_maxdbs(env, 8) == MDB_SUCCESS)
            try #require(mdb_env_open(env, path, UInt32(MDB_NOSUBDIR | MDB_NOTLS), 0o660) == MDB_SUCCESS)
            var readers: [OpaquePointer?] = [nil, nil]
            for index in readers.indices {
                try #require(mdb_txn_begin(env, nil, UInt32(MDB_RDONLY), &readers[index]) == MDB_SUCCESS)
            }
            defer { for reader in readers { mdb_txn_abort(reader) } }
            var third: OpaquePointer?
            #expect(mdb_txn_begin(env, nil, UInt32(MDB_RDONLY), &third) == MDB_READERS_FULL)

            // No slot is stale (this process is alive): a producer's open and its reads (its identity) ran
            // into MDB_READERS_FULL, and `track` exited 74 ("All LMDB reader slots ... are in use").
            let track = try await ChildProcess.run("tributary", ["track", "--group", group, "WhileFull"])
            #expect(track.status == 0, "\(track.stderr)")
            let status = try await ChildProcess.run("tributary", ["status", "--group", group, "--json"])
            #expect(status.status == 0, "\(status.stderr)")
            let pending = ["\"pending_events\":2", "\"pending_events\" : 2"]
            #expect(pending.contains { status.stdout.contains($0) }, "\(status.stdout)")
            let inspect = try await ChildProcess.run("tributary", ["inspect", "--group", group])
            #expect(inspect.status == 0, "\(inspect.stderr)")
            #expect(inspect.stdout.contains("Before") && inspect.stdout.contains("WhileFull"), "\(inspect.stdout)")
            // Still full: what ran in write transactions took no slot and left none behind.
            #expect(mdb_txn_begin(env, nil, UInt32(MDB_RDONLY), &third) == MDB_READERS_FULL)
        }
    }

    @Test("a read that must adopt a map another process grew, while a write of this process waits for another process's writer lock, fails as busy within its bound instead of waiting with it")
    func mapAdoptionWaitIsBounded() async throws {
        try await withTemporaryGroup { group in
            let store = try SharedStore(groupDirectory: group)
            try Self.append(store, 3)
            // Another process takes the writer lock and keeps it (a producer stopped in its transaction).
            let holder = try ChildProcess(
                "tributary", ["track", "--group", group, "Held"], environment: ["TRIBUTARY_TEST_PAUSE_AT": "store.append"])
            defer { holder.send(SIGKILL) }
            #expect(await holder.waitForLine(startingWith: "PAUSED") == "PAUSED store.append")
            // This process's delete waits for it (as the agent's delete thread does), holding the resize lock shared.
            let deleted = Mutex<Result<Int, any Error>?>(nil)
            let deleterTID = Atomic<Int32>(0)
            let deleter = Thread {
                // "/proc/thread-self" links to "PID/task/TID" (glibc's gettid is not visible to Swift).
                let link = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/thread-self")) ?? ""
                deleterTID.store(link.split(separator: "/").last.flatMap { Int32($0) } ?? 0, ordering: .releasing)
                let result = Result { try store.deleteEvents(through: 1) }
                deleted.withLock { $0 = result }
            }
            deleter.start()
            // Asleep (state S in /proc) only once it waits in mdb_txn_begin: it has nothing else to wait for.
            let began = ContinuousClock.now
            func asleep() -> Bool {
                let tid = deleterTID.load(ordering: .acquiring)
                guard tid != 0, let stat = try? String(contentsOfFile: "/proc/self/task/\(tid)/stat", encoding: .utf8) else {
                    return false
                }
                return stat.split(separator: ")").last?.split(separator: " ").first == "S"
            }
            var settled = false  // asleep at two looks 50 ms apart: not a moment's wait on a lock of malloc's
            while !settled && ContinuousClock.now - began < .seconds(10) {
                let first = asleep()
                try await Task.sleep(for: .milliseconds(50))
                settled = first && asleep()
            }
            try #require(settled && deleted.withLock { $0 == nil }, "the delete did not wait for the writer lock")

            // A read finds the map grown (MDB_MAP_RESIZED, forced: the growth's moment cannot be chosen). It
            // waited to adopt the size until the other process let go: for ever, were that process stopped.
            store.faults.inject(MDB_MAP_RESIZED, at: .readBegin)
            let read = Mutex<Result<SharedStore.Status, any Error>?>(nil)
            let started = ContinuousClock.now
            Thread {
                let result = Result { try store.status() }
                read.withLock { $0 = result }
            }.start()
            while read.withLock({ $0 == nil }) && ContinuousClock.now - started < .seconds(10) {
                try await Task.sleep(for: .milliseconds(10))
            }
            let took = ContinuousClock.now - started
            let outcome = try #require(read.withLock { $0 }, "the read still waits after \(took)")
            #expect(took >= Environment.adoptionWait && took < .seconds(5), "\(took)")
            #expect(throws: StoreError.self) { try outcome.get() }
            if case .failure(let error as StoreError) = outcome {
                #expect(error.code == .busy)
                #expect(error.message.contains("writer lock") && error.message.contains("try again"), "\(error.message)")
            }

            // Once the other process is gone (killed: its transaction aborted), the delete and the reads go on.
            holder.send(SIGKILL)
            _ = await holder.finish()
            while deleted.withLock({ $0 == nil }) && ContinuousClock.now - started < .seconds(20) {
                try await Task.sleep(for: .milliseconds(10))
            }
            #expect(try deleted.withLock { $0 }?.get() == 1)
            #expect(try store.status().pendingEvents == 2)
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

    @Test("the directory a path is in, as the permission messages name it", arguments: [
        ("/var/lib/app/group", "/var/lib/app"), ("/group", "/"), ("group", "."), ("app/group", "app"),
    ])
    func parentDirectories(path: String, parent: String) {
        #expect(parentDirectory(of: path) == parent)
    }

    @Test("a permission refusal tells the owner that its own mode refuses it, and anyone else to join the group")
    func permissionAdvice() throws {
        try withTemporaryGroup { group in
            try FileManager.default.createDirectory(atPath: group, withIntermediateDirectories: true)
            let own = StoreError.permissionDenied("the store \(group)/tributary.mdb", directory: group)
            #expect(own.message.contains("Its mode refuses its own owner"), "\(own.message)")
            #expect(!own.message.contains("Join the group"), "\(own.message)")
            // Owned by another user (as root, chown; as anyone else, a directory of root's).
            let other = getuid() == 0 ? group : "/"
            if getuid() == 0 { chown(group, 65534, 65534) }
            let foreign = StoreError.permissionDenied("the group directory \(other)", directory: other)
            #expect(foreign.message.contains("Join the group that owns it"), "\(foreign.message)")
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
