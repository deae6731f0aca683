import Foundation
import Testing
import TributaryStore
import TributaryTestSupport

// tributary-sim (its demo, durations and ledger) and tributary-collector: bad options and run-time failures.
extension CLITests {
    @Test("tributary-sim demo (make run) reports a failure at run time with exit 1, not as a usage error")
    func demoRunFailure() async throws {
        // No group directory can be made under /proc.
        let result = try await ChildProcess.run("tributary-sim", ["demo", "--group", "/proc/tributary-none/group"])
        #expect(result.status == 1, "stderr: \(result.stderr)")
        #expect(result.stderr.contains("Cannot create the group directory /proc/tributary-none/group"), "\(result.stderr)")
        #expect(!result.stderr.contains("USAGE") && !result.stderr.contains("Usage"), "a run-time failure printed the usage: \(result.stderr)")
    }

    @Test("tributary-collector names the flag a bad setting came from, and exits 64", arguments: [
        (["--fail-rate", "2"], [String: String](), "--fail-rate"),
        (["--latency-ms", "-5"], [:], "--latency-ms"),
        (["--poison", "("], [:], "--poison"),
        (["--port", "0"], ["TRIBUTARY_COLLECTOR_TOKEN": ""], "TRIBUTARY_COLLECTOR_TOKEN"),
        // Accepted, it answered 401 to every request: a presented token is trimmed, a header is ASCII.
        (["--port", "0"], ["TRIBUTARY_COLLECTOR_TOKEN": "s3cret "], "TRIBUTARY_COLLECTOR_TOKEN"),
        (["--port", "0", "--token", "s3cr\u{E9}t"], [:], "--token"),
    ])
    func collectorUsage(arguments: [String], environment: [String: String], flag: String) async throws {
        let result = try await ChildProcess.run("tributary-collector", arguments, environment: environment)
        #expect(result.status == 64, "stderr: \(result.stderr)")
        #expect(result.stderr.contains(flag), "stderr: \(result.stderr)")
    }

    @Test("tributary-sim refuses a duration it cannot hold with exit 64, naming the option", arguments: [
        (["app", "--session-timeout", "inf"], "--session-timeout"),
        (["app", "--session-timeout", "1e10"], "--session-timeout"),
        (["hybrid", "--timeout", "1e300"], "--timeout"),
    ])
    func simDurations(arguments: [String], flag: String) async throws {
        try await withTemporaryGroup { group in
            let result = try await ChildProcess.run("tributary-sim", arguments + ["--group", group])
            #expect(result.status == 64, "stderr: \(result.stderr)")
            #expect(result.stderr.contains(flag), "stderr: \(result.stderr)")
        }
    }

    @Test("tributary-sim exits 74 when its ledger cannot be opened or written, not by a trap", arguments: [
        (["extension", "--events", "2", "--ledger", "/dev/full"], "Cannot write to the ledger /dev/full"),
        (["app", "--events", "2", "--ledger", "/dev/full"], "Cannot write to the ledger /dev/full"),
        (["load", "--count", "2", "--ledger", "{g}/missing/ledger"], "Cannot open the ledger"),
    ])
    func simLedgerFailure(arguments: [String], message: String) async throws {
        try await withTemporaryGroup { group in
            let result = try await ChildProcess.run(
                "tributary-sim", arguments.map { $0.replacingOccurrences(of: "{g}", with: group) } + ["--group", group])
            #expect(result.status == 74, "stderr: \(result.stderr)")
            #expect(result.stderr.contains(message), "stderr: \(result.stderr)")
        }
    }

    @Test("tributary-sim demo refuses to remove a group whose store holds undelivered events; run from PATH, it finds the other tools and runs again over its own group")
    func demoKeepsRealGroup() async throws {
        try await withTemporaryGroup { group in
            // An app's group: the same file names as a demo's, and an event waiting for the agent.
            #expect(try await ChildProcess.run("tributary", ["track", "--create", "Real", "--group", group]).status == 0)
            let refused = try await ChildProcess.run("tributary-sim", ["demo", "--group", group])
            #expect(refused.status == 64, "stderr: \(refused.stderr)")
            #expect(refused.stderr.contains("holds a Tributary store with 1 events not yet delivered"), "\(refused.stderr)")
            let status = try await ChildProcess.run("tributary", ["status", "--group", group])
            #expect(status.stdout.contains("pending events: 1"), "\(status.stdout)")
            // Its store delivered, but an outbox at <group>-state holding what an agent drained and did not send:
            // the demo removed it unchecked.
            let delivered = try await ChildProcess.run(
                "tributary-agent", ["--group", group, "--outbox", group + "-state/outbox.sqlite", "--server", "http://127.0.0.1:9/sa",
                                    "--once", "--deadline", "3"])
            #expect(delivered.status == 0, "\(delivered.stderr)")
            try? FileManager.default.removeItem(atPath: group + "/" + AgentChannel.socketFile)
            let kept = try await ChildProcess.run("tributary-sim", ["demo", "--group", group])
            #expect(kept.status == 64 && kept.stderr.contains("outbox.sqlite holds 1 events not yet delivered"), "\(kept.stderr)")
            #expect(FileManager.default.fileExists(atPath: group + "-state/outbox.sqlite"))
            try FileManager.default.removeItem(atPath: group + "-state")

            // Started by name from PATH, in another directory (it looked for its siblings there).
            let demo = group + "-demo"
            let script = "cd \(group)-state-dir && PATH=\(productsDirectory.path):$PATH exec tributary-sim demo "
                + "--group \(demo) --app-events 30 --extension-events 3 --hybrid-events 3 --session-events 10"
            try FileManager.default.createDirectory(atPath: group + "-state-dir", withIntermediateDirectories: true)
            for run in 1...2 {
                let result = try await ChildProcess(path: "/bin/sh", ["-c", script]).finish()
                #expect(result.status == 0, "run \(run): \(result.stderr)")
                #expect(result.stdout.contains("lost                         0"), "run \(run): \(result.stdout)")
                // The whole design card: the hybrid page's records and refusals, the session's crash reported.
                for expected in ["hybrid bridge                {\"accepted\":", "\"foreign_origin\":4", "profile_set_once", "$AppCrashed"] {
                    #expect(result.stdout.contains(expected), "run \(run): no \(expected) in \(result.stdout)")
                }
            }
            try? FileManager.default.removeItem(atPath: group + "-state-dir")
            try? FileManager.default.removeItem(atPath: demo)
            try? FileManager.default.removeItem(atPath: demo + "-state")
        }
    }

    @Test("tributary-sim demo refuses bad options before it starts or removes anything", arguments: [
        (["--format", "xml"], "--format"),
        (["--timeout", "0"], "--timeout"),
        (["--app-events=-5"], "--app-events"),
        (["--session-events=-1"], "--session-events"),
        (["--group", "{g}/kept"], "holds notes.txt, which no demo put there"),
        (["--group", "{g}/kept/notes.txt"], "is not a directory the demo may remove"),
    ])
    func demoOptions(arguments: [String], message: String) async throws {
        try await withTemporaryGroup { group in
            try FileManager.default.createDirectory(atPath: group + "/kept", withIntermediateDirectories: true)
            let notes = group + "/kept/notes.txt"
            _ = FileManager.default.createFile(atPath: notes, contents: Data("mine".utf8))
            let result = try await ChildProcess.run(
                "tributary-sim", ["demo", "--group", group + "/demo"] + arguments.map { $0.replacingOccurrences(of: "{g}", with: group) })
            #expect(result.status == 64, "stderr: \(result.stderr)")
            #expect(result.stderr.contains(message), "stderr: \(result.stderr)")
            #expect(FileManager.default.fileExists(atPath: notes))
            #expect(!FileManager.default.fileExists(atPath: group + "/demo"))
        }
    }
}
