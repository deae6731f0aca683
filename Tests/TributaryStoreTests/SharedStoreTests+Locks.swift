import CLMDB
import Foundation
import Synchronization
import Testing
import TributaryTestSupport

@testable import TributaryStore

// LMDB's locks held by other processes: every reader slot taken, the writer lock held during a map adoption.
extension SharedStoreTests {
    @Test("every reader slot held by a live process: producers still open the store and write, and readers read, in a write transaction")
    func readerTableFull() async throws {
        try await withTemporaryGroup { group in
            let created = try await ChildProcess.run("tributary", ["track", "--create", "--group", group, "Before"])
            #expect(created.status == 0, "\(created.stderr)")
            let table = try FullReaderTable(group)
            defer { table.close() }
            #expect(table.isFull)

            // No slot is stale (this process is alive): a producer's open and its reads (its identity) ran
            // into MDB_READERS_FULL, and `track` exited 74 ("All LMDB reader slots ... are in use").
            let track = try await ChildProcess.run("tributary", ["track", "--create", "--group", group, "WhileFull"])
            #expect(track.status == 0, "\(track.stderr)")
            let status = try await ChildProcess.run("tributary", ["status", "--group", group, "--json"])
            #expect(status.status == 0, "\(status.stderr)")
            let pending = ["\"pending_events\":2", "\"pending_events\" : 2"]
            #expect(pending.contains { status.stdout.contains($0) }, "\(status.stdout)")
            let inspect = try await ChildProcess.run("tributary", ["inspect", "--group", group])
            #expect(inspect.status == 0, "\(inspect.stderr)")
            #expect(inspect.stdout.contains("Before") && inspect.stdout.contains("WhileFull"), "\(inspect.stdout)")
            // Still full: what ran in write transactions took no slot and left none behind.
            #expect(table.isFull)
        }
    }

    @Test("every reader slot held by a live process and the writer lock by a stopped one: a read fails as busy (75) within its bound instead of waiting for ever")
    func readerTableFullWriterStopped() async throws {
        try await withTemporaryGroup { group in
            let created = try await ChildProcess.run("tributary", ["track", "--create", "--group", group, "Before"])
            #expect(created.status == 0, "\(created.stderr)")
            let table = try FullReaderTable(group)
            defer { table.close() }
            // A producer takes the writer lock and is stopped in its transaction.
            let holder = try ChildProcess(
                "tributary", ["track", "--group", group, "Held"], environment: ["TRIBUTARY_TEST_PAUSE_AT": "store.append"])
            defer { holder.send(SIGKILL) }
            #expect(await holder.waitForLine(startingWith: "PAUSED") == "PAUSED store.append")
            holder.send(SIGSTOP)
            // The read's write transaction waited for that lock with no end: `status` hung.
            let started = ContinuousClock.now
            let status = try ChildProcess("tributary", ["status", "--group", group])
            while status.process.isRunning && ContinuousClock.now - started < .seconds(20) {
                try await Task.sleep(for: .milliseconds(20))
            }
            let took = ContinuousClock.now - started
            if status.process.isRunning { status.send(SIGKILL) }
            let result = await status.finish()
            #expect(took < .seconds(15), "status still waited after \(took)")
            #expect(result.status == 75, "\(result.stderr)")
            #expect(result.stderr.contains("reader slot") && result.stderr.contains("try again"), "\(result.stderr)")
            // Once the writer is gone (its transaction aborted), reads go on in write transactions again.
            holder.send(SIGKILL)
            _ = await holder.finish()
            let after = try await ChildProcess.run("tributary", ["inspect", "--group", group])
            #expect(after.status == 0 && after.stdout.contains("Before") && !after.stdout.contains("Held"), "\(after)")
        }
    }

    @Test("a read that must adopt a map another process grew, while a write of this process waits for another process's writer lock, fails as busy within its bound instead of waiting with it")
    func mapAdoptionWaitIsBounded() async throws {
        try await withTemporaryGroup { group in
            let store = try SharedStore(groupDirectory: group)
            try Self.append(store, 3)
            // Another process takes the writer lock and keeps it (a producer stopped in its transaction).
            let holder = try ChildProcess(
                "tributary", ["track", "--create", "--group", group, "Held"], environment: ["TRIBUTARY_TEST_PAUSE_AT": "store.append"])
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
}

/// A lock file of 2 reader slots, both held by this process (LMDB's default is 126; the process that
/// creates the lock file sizes it, the next ones adopt its size): the one the store's first process made
/// is removed, with no process having the store open, and this process opens the store with 2 slots.
/// ``close()`` it, even when the test fails.
final class FullReaderTable {
    private var env: OpaquePointer?
    private var readers: [OpaquePointer?] = [nil, nil]

    init(_ group: String) throws {
        let path = group + "/" + SharedStore.fileName
        try FileManager.default.removeItem(atPath: path + "-lock")
        try #require(mdb_env_create(&env) == MDB_SUCCESS)
        try #require(mdb_env_set_maxreaders(env, 2) == MDB_SUCCESS)
        try #require(mdb_env_set_maxdbs(env, 8) == MDB_SUCCESS)
        try #require(mdb_env_open(env, path, UInt32(MDB_NOSUBDIR | MDB_NOTLS), 0o660) == MDB_SUCCESS)
        for index in readers.indices {
            try #require(mdb_txn_begin(env, nil, UInt32(MDB_RDONLY), &readers[index]) == MDB_SUCCESS)
        }
    }

    /// Whether a third read finds no slot.
    var isFull: Bool {
        var third: OpaquePointer?
        let rc = mdb_txn_begin(env, nil, UInt32(MDB_RDONLY), &third)
        if rc == MDB_SUCCESS { mdb_txn_abort(third) }
        return rc == MDB_READERS_FULL
    }

    func close() {
        for reader in readers { mdb_txn_abort(reader) }
        readers = []
        mdb_env_close(env)
        env = nil
    }
}
