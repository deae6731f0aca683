import CLMDB
import Foundation
import Synchronization
import Testing
import TributaryTestSupport

@testable import TributaryStore

// The memory map: growth up to the quota, the smallest quota, drains at it, open options, mapped pages released.
extension SharedStoreTests {
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
}
