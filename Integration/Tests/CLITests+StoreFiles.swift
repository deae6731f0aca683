import Foundation
import Testing
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

    @Test("a store file cut short is refused as unreadable (74) by every tool, never read into a bus error, and left as it is")
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
                ("tributary", ["track", "X", "--group", group]), ("tributary-sim", ["extension", "--events", "1", "--group", group]),
                ("tributary-agent", ["--group", group, "--outbox", group + "-outbox.sqlite", "--server", "http://127.0.0.1:9/sa", "--once"]),
            ] {
                let result = try await ChildProcess.run(tool, arguments)
                #expect(result.status == 74, "\(tool) \(arguments[0]): \(result.stderr)")
                #expect(result.stderr.contains("shorter than the"), "\(tool) \(arguments[0]): \(result.stderr)")
            }
            let after = try Data(contentsOf: URL(fileURLWithPath: file))
            #expect(after == whole.prefix(100_000))
            var st = stat()
            #expect(stat(group, &st) == 0 && st.st_mode & 0o7777 == 0o770, "mode \(String(st.st_mode & 0o7777, radix: 8))")
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
                ["-f", "-qq", "-y", "-o", log, "-e", "trace=fsync", tributary, "track", "X", "--group", group]
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
            #expect(try await ChildProcess.run("tributary", ["track", "--group", group, "X"]).status == 0)
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
