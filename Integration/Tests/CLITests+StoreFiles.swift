import Foundation
import GRDB
import Testing
import TributarySQLite
import TributaryStore
import TributaryTestSupport

@testable import TributaryAgentCore

// Store and outbox files as tools find them: another program's, cut short, newer, on tmpfs; new stores' names synced.
extension CLITests {
    @Test("another program's SQLite database given as an outbox (or an outbox given to the collector as its database) is refused, and left as it was")
    func foreignDatabases() async throws {
        try await withTemporaryGroup { group in
            try FileManager.default.createDirectory(atPath: group, withIntermediateDirectories: true)
            // A collector's database: made by a collector process that ran on it and exited (closed, its WAL
            // checkpointed: an in-process collector's pool could still be closing, and write, meanwhile).
            let collectorDB = group + "/collector.sqlite"
            let maker = try ChildProcess("tributary-collector", ["--db", collectorDB, "--port", "0"])
            #expect(await maker.waitForLine(startingWith: "LISTENING") != nil)
            maker.send(SIGTERM)
            #expect(await maker.finish().status == 0)
            let before = try Data(contentsOf: URL(fileURLWithPath: collectorDB))
            let listing = try await ChildProcess.run("tributary", ["dead-letters", "--outbox", collectorDB])
            #expect(listing.status != 0 && listing.stderr.contains("not a Tributary outbox"), "\(listing)")
            let agent = try await ChildProcess.run("tributary-agent", [
                "--group", group, "--outbox", collectorDB, "--server", "http://127.0.0.1:9/sa", "--once",
            ])
            #expect(agent.status == 78 && agent.stderr.contains("not a Tributary outbox"), "\(agent.stderr)")
            #expect(try Data(contentsOf: URL(fileURLWithPath: collectorDB)) == before, "the collector's database was changed")

            // An outbox given to the collector: it took the outbox's migration v1 for its own, and refused
            // every upload.
            let outbox = group + "/outbox.sqlite"
            _ = try Outbox(path: outbox)
            let process = try ChildProcess("tributary-collector", ["--db", outbox, "--port", "0"])
            // One that took the outbox serves (and fails) uploads until stopped.
            let stopper = Task {
                try await Task.sleep(for: .seconds(20))
                process.send(SIGTERM)
            }
            let collector = await process.finish()
            stopper.cancel()
            #expect(collector.status == 1 && collector.stderr.contains("not a collector's"), "\(collector.stderr)")
        }
    }

    @Test("another program's database that another process keeps locked is checked once the lock goes, or refused as locked (78), and left as it was")
    func foreignDatabaseLocked() async throws {
        try await withTemporaryGroup { group in
            try FileManager.default.createDirectory(atPath: group, withIntermediateDirectories: true)
            // An app's database in rollback-journal mode, whose writer holds its lock (EXCLUSIVE) for a while.
            let foreign = group + "/app.sqlite"
            let app = try DatabaseQueue(path: foreign)
            try await app.write { db in try db.execute(sql: "CREATE TABLE accounts (id INTEGER PRIMARY KEY); INSERT INTO accounts VALUES (1)") }
            let before = try Data(contentsOf: URL(fileURLWithPath: foreign))
            let arguments = ["--group", group, "--outbox", foreign, "--server", "http://127.0.0.1:9/sa", "--once", "--deadline", "2"]
            // Held for 2 s after the agent starts: the read-only look failed at once (busy) and let the
            // file through; the outbox's open then waited for the lock and made the app's database an outbox.
            var holder = await LockHolder.take(app)
            let agent = try ChildProcess("tributary-agent", arguments)
            try await Task.sleep(for: .seconds(2))
            await holder.release()
            let checked = await agent.finish()
            #expect(checked.status == 78 && checked.stderr.contains("not a Tributary outbox"), "\(checked.stderr)")
            // Held until the agent ends: refused as locked once the check's patience is out, not let through.
            holder = await LockHolder.take(app)
            let started = ContinuousClock.now
            let locked = try await ChildProcess.run("tributary-agent", arguments)
            let took = ContinuousClock.now - started
            await holder.release()
            #expect(locked.status == 78 && locked.stderr.contains("is locked by another process"), "\(locked.stderr)")
            #expect(took >= .seconds(ForeignDatabaseCheck.patience), "\(took)")
            #expect(try Data(contentsOf: URL(fileURLWithPath: foreign)) == before, "the app's database was changed")
            #expect(!FileManager.default.fileExists(atPath: foreign + "-wal"))
        }
    }

    @Test("a store file cut short is refused as unreadable (74) by every tool, never read into a bus error, and left as it is; the agent moves it aside whole")
    func truncatedStore() async throws {
        try await withTemporaryGroup { group in
            let load = try await ChildProcess.run("tributary-sim", ["load", "--group", group, "--count", "3000"])
            #expect(load.status == 0)
            let file = group + "/" + SharedStore.fileName
            let whole = try Data(contentsOf: URL(fileURLWithPath: file))
            // A copy that stopped after 100,000 bytes: the meta pages are there, most tree pages are not.
            try whole.prefix(100_000).write(to: URL(fileURLWithPath: file))
            // A directory of an earlier release, without the set-group-ID bit: an open refused keeps it so.
            chmod(group, 0o770)
            for (tool, arguments) in [
                ("tributary", ["status", "--group", group]), ("tributary", ["inspect", "--group", group]),
                ("tributary", ["track", "--create", "X", "--group", group]), ("tributary-sim", ["extension", "--events", "1", "--group", group]),
            ] {
                let result = try await ChildProcess.run(tool, arguments)
                #expect(result.status == 74, "\(tool) \(arguments[0]): \(result.stderr)")
                #expect(result.stderr.contains("shorter than the"), "\(tool) \(arguments[0]): \(result.stderr)")
            }
            let after = try Data(contentsOf: URL(fileURLWithPath: file))
            #expect(after == whole.prefix(100_000))
            var st = stat()
            #expect(stat(group, &st) == 0 && st.st_mode & 0o7777 == 0o770, "mode \(String(st.st_mode & 0o7777, radix: 8))")
            // The agent's walk finds it cut short: moved aside whole (it exited 74 at every start, and every
            // producer with it), a new store made, the run goes on.
            let verify = try await ChildProcess.run("tributary", ["verify", "--group", group])
            #expect(verify.status == 65 && verify.stderr.contains("shorter than the"), "\(verify.stderr)")
            let agent = try await ChildProcess.run(
                "tributary-agent", ["--group", group, "--outbox", group + "-outbox.sqlite", "--server", "http://127.0.0.1:9/sa", "--once"])
            #expect(agent.status == 0, "\(agent.stderr)")
            let aside = StoreCheck.setAsideStores(groupDirectory: group)
            #expect(aside.count == 1 && aside.first?.reason.contains("shorter than the") == true, "\(aside)")
            if let directory = aside.first?.directory {
                #expect(try Data(contentsOf: URL(fileURLWithPath: directory + "/" + SharedStore.fileName)) == whole.prefix(100_000))
            }
        }
    }

    @Test("a store whose tree pages are garbage: verify says so (65) without crashing, the agent moves it aside whole, makes a new store and says so in its status and metrics, and producers go on in the new store")
    func garbagePagesSetAside() async throws {
        try await withTemporaryGroup { group in
            let load = try await ChildProcess.run("tributary-sim", ["load", "--group", group, "--count", "2000"])
            #expect(load.status == 0)
            let file = group + "/" + SharedStore.fileName
            // Every page after the two meta pages overwritten with the same garbage (a bad disk, a tool).
            var bytes = [UInt8](try Data(contentsOf: URL(fileURLWithPath: file)))
            let pageSize = Int(getpagesize())
            var state: UInt64 = 0x9E37_79B9_7F4A_7C15
            for index in (2 * pageSize)..<bytes.count {
                state = state &* 6_364_136_223_846_793_005 &+ 1
                bytes[index] = UInt8(truncatingIfNeeded: state >> 33)
            }
            try Data(bytes).write(to: URL(fileURLWithPath: file))
            let verify = try await ChildProcess.run("tributary", ["verify", "--group", group])
            #expect(verify.status == 65 && verify.stderr.contains("DAMAGED"), "\(verify.status): \(verify.stderr)")
            #expect(try Data(contentsOf: URL(fileURLWithPath: file)) == Data(bytes), "verify writes nothing")
            // The agent as a service, its metrics endpoint up: the loss is counted where monitoring looks.
            let metricsPort = try freeLoopbackPort()
            let running = try ChildProcess("tributary-agent", [
                "--group", group, "--outbox", group + "-outbox.sqlite", "--server", "http://127.0.0.1:9/sa",
                "--metrics-address", "127.0.0.1:\(metricsPort)",
            ])
            let limit = running.killAfter(.seconds(60))
            defer { limit.cancel() }
            let url = try #require(URL(string: "http://127.0.0.1:\(metricsPort)/metrics"))
            let metrics = try await FlushAndStatusTests.scrape(url, within: 30) {
                FlushAndStatusTests.sample($0, "tributary_damaged_stores_total") == 1
            }
            #expect(FlushAndStatusTests.sample(metrics, "tributary_damaged_stores_total") == 1, "\(metrics)")
            running.send(SIGTERM)
            let agent = await running.finish()
            #expect(agent.status == 0, "\(agent.stderr)")
            #expect(agent.stderr.contains("the shared store is damaged: moved aside whole"), "\(agent.stderr)")
            let aside = try #require(StoreCheck.setAsideStores(groupDirectory: group).first)
            #expect(try Data(contentsOf: URL(fileURLWithPath: aside.directory + "/" + SharedStore.fileName)) == Data(bytes))
            #expect(FileManager.default.fileExists(atPath: aside.directory + "/" + SharedStore.fileName + "-lock"))
            #expect(AgentChannel.readStatus(groupDirectory: group)?.damagedStore?.hasPrefix(aside.directory) == true)
            // The loss is said by every status until the directory is removed; producers use the new store.
            let track = try await ChildProcess.run("tributary", ["track", "--group", group, "AfterDamage"])
            #expect(track.status == 0, "\(track.stderr)")
            let status = try await ChildProcess.run("tributary", ["status", "--group", group])
            #expect(status.status == 0 && status.stdout.contains("DAMAGED STORE:  set aside in \(aside.directory)"), "\(status.stdout)")
            #expect(status.stdout.contains("pending events: 1"), "\(status.stdout)")
            #expect(try await ChildProcess.run("tributary", ["verify", "--group", group]).status == 0)
        }
    }

    @Test("a new store's names are synced: the group directory once the store's files are in it, and the directory the group was made in")
    func newStoreNamesSynced() async throws {
        let unavailable = await ReliabilityScenarios.DiskFaultScenarios.straceUnavailable()
        try #require(unavailable == nil, "\(unavailable ?? "")")
        try await withTemporaryGroup { group in
            let log = group + "-strace"
            let tributary = productsDirectory.path + "/tributary"
            let result = try await ChildProcess(
                path: ReliabilityScenarios.DiskFaultScenarios.strace,
                ["-f", "-qq", "-y", "-o", log, "-e", "trace=fsync", tributary, "track", "--create", "X", "--group", group]
            ).finish()
            #expect(result.status == 0, "\(result.stderr)")
            let trace = try String(contentsOfFile: log, encoding: .utf8)
            let real = try #require(resolvedPath(group))
            // strace -y prints each descriptor's path: fsync(3</tmp/…/group>) = 0.
            #expect(trace.contains("<\(real)>) = 0"), "\(trace)")
            #expect(trace.contains("<\(parentDirectory(of: real))>) = 0"), "\(trace)")
        }
    }

    @Test("a store on tmpfs is used, but tributary status and the agent warn that its events do not survive a reboot",
          .enabled(if: FileManager.default.fileExists(atPath: "/dev/shm"), "no /dev/shm (tmpfs) here"))
    func memoryBackedStore() async throws {
        // /dev/shm is tmpfs on Linux; the build directory is on the disk the checkout is on.
        let onDisk = productsDirectory.deletingLastPathComponent().appendingPathComponent("memory-test-\(UUID().uuidString.prefix(8))").path
        let inMemory = "/dev/shm/tributary-test-\(UUID().uuidString.prefix(8))"
        defer {
            try? FileManager.default.removeItem(atPath: onDisk)
            try? FileManager.default.removeItem(atPath: inMemory)
        }
        for (root, memory) in [(inMemory, true), (onDisk, false)] {
            let group = root + "/group"
            #expect(try await ChildProcess.run("tributary", ["track", "--create", "--group", group, "X"]).status == 0)
            let text = try await ChildProcess.run("tributary", ["status", "--group", group])
            #expect(text.stdout.contains("is on tmpfs (memory)") == memory, "\(root): \(text.stdout)")
            let json = try await ChildProcess.run("tributary", ["status", "--group", group, "--json"])
            let object = try #require(try JSONSerialization.jsonObject(with: Data(json.stdout.utf8)) as? [String: Any])
            #expect(object["memory_backed"] as? Bool == memory, "\(root): \(json.stdout)")
            let agent = try await Self.runAgent([
                "--group", group, "--server", "http://127.0.0.1:9/sa", "--outbox", root + "/outbox.sqlite", "--once",
                "--deadline", "1", "--log-level", "warning",
            ])
            #expect(agent.status == 0, "\(agent.stderr)")
            #expect(agent.stderr.contains("is on tmpfs (memory)") == memory, "\(root): \(agent.stderr)")
        }
    }

    @Test("a store written by a newer Tributary: the agent exits 78, which its unit does not restart, and leaves the store as it was")
    func newerStoreSchema() async throws {
        try await withTemporaryGroup { group in
            do {
                let store = try SharedStore(groupDirectory: group)
                try store.overwriteSchemaVersion(SharedStore.schemaVersion + 1)
            }
            let path = group + "/" + SharedStore.fileName
            let before = try Data(contentsOf: URL(fileURLWithPath: path))
            let agent = try await ChildProcess.run(
                "tributary-agent", ["--group", group, "--server", "http://127.0.0.1:9/sa", "--outbox", group + "-outbox.sqlite", "--once"])
            #expect(agent.status == 78, "\(agent.stderr)")
            #expect(agent.stderr.contains("Upgrade Tributary"), "\(agent.stderr)")
            #expect(try Data(contentsOf: URL(fileURLWithPath: path)) == before)
        }
    }
}

/// A database's write lock (`BEGIN EXCLUSIVE`), held by a thread of its own until released.
final class LockHolder: Sendable {
    private let released = DispatchSemaphore(value: 0)
    private let ended = DispatchSemaphore(value: 0)

    /// Takes `database`'s lock; returns once it is held.
    static func take(_ database: DatabaseQueue) async -> LockHolder {
        let holder = LockHolder()
        let taken = DispatchSemaphore(value: 0)
        Thread {
            try? database.inTransaction(.exclusive) { _ in
                taken.signal()
                holder.released.wait()
                return .commit
            }
            taken.signal()  // (had the lock not been taken)
            holder.ended.signal()
        }.start()
        await withCheckedContinuation { (done: CheckedContinuation<Void, Never>) in
            Thread {
                taken.wait()
                done.resume()
            }.start()
        }
        return holder
    }

    /// Lets the lock go; returns once it is.
    func release() async {
        released.signal()
        await withCheckedContinuation { (done: CheckedContinuation<Void, Never>) in
            Thread { [ended] in
                ended.wait()
                done.resume()
            }.start()
        }
    }
}
