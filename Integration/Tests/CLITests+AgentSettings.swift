import Foundation
import Testing
import Tributary
import TributaryCollector
import TributaryStore
import TributaryTestSupport

@testable import TributaryAgentCore

// tributary-agent's options, its auth token file, and the group's agent settings (tributary config).
extension CLITests {
    @Test("tributary-agent refuses a duration it cannot hold, a negative count or a bad URL, with exit 64, naming the option", arguments: [
        (["--once", "--deadline", "inf"], "--deadline"),
        (["--server", "ftp://collector.example.com/sa"], "--server must be an http:// or https:// URL"),
        (["--server", "collector.example.com"], "--server must be an http:// or https:// URL"),
        // The HTTP client traps on such a port with an IP address (and wraps it with a host name).
        (["--server", "http://127.0.0.1:65536/sa"], "a port of 1 … 65535"),
        (["--halt-after-dead-letters=-1"], "--halt-after-dead-letters"),
        (["--backoff-cap", "1e300"], "--backoff-cap"),
        (["--max-retry-after=-1"], "--max-retry-after"),
        (["--grace", "nan"], "--grace"),
        (["--stop-timeout", "0"], "--stop-timeout"),
        (["--flush-interval=1e-320"], "--flush-interval must be at least 0.001 seconds"),
        (["--grace=1e-9"], "--grace must be 0, or at least 0.001 seconds"),
        (["--backoff-base", "5", "--backoff-cap", "2"], "--backoff-cap"),
        // A negative number given as the next argument is the option's value, refused as such (it was
        // taken for an option: "Missing value").
        (["--backoff-base", "-1"], "--backoff-base must be at least 0.001 seconds (a millisecond); got -1.0"),
        (["--halt-after-dead-letters", "-1"], "--halt-after-dead-letters must be 0 or more; got -1"),
        (["--batch-size", "-5"], "--batch-size must be positive; got -5"),
        (["--once", "--deadline", "--grace", "1"], "The value '--grace' is invalid for '--deadline"),
    ])
    func agentDurations(extra: [String], flag: String) async throws {
        try await withTemporaryGroup { group in
            let result = try await ChildProcess.run(
                "tributary-agent", ["--group", group, "--server", "http://127.0.0.1:9/sa", "--outbox", group + "-outbox.sqlite"] + extra)
            #expect(result.status == 64, "stderr: \(result.stderr)")
            #expect(result.stderr.contains(flag))
            #expect(!FileManager.default.fileExists(atPath: group + "-outbox.sqlite"), "refused before anything is created")
        }
    }

    @Test("--help right after an option that takes any value shows the help instead of being refused as the value", arguments: [
        ("tributary-agent", ["--deadline", "--help"], "--deadline <deadline>"),
        ("tributary-agent", ["--once", "--batch-size", "-h"], "--batch-size"),
        ("tributary", ["inspect", "--limit", "--help"], "--limit <limit>"),
        ("tributary-collector", ["--port", "--help"], "--port"),
        ("tributary-sim", ["load", "--events", "--help"], "--events"),
    ])
    func helpAfterOption(tool: String, arguments: [String], usage: String) async throws {
        let result = try await ChildProcess.run(tool, arguments)
        #expect(result.status == 0, "stderr: \(result.stderr)")
        #expect(result.stdout.contains("USAGE") && result.stdout.contains(usage), "\(result.stdout)")
    }

    @Test("tributary-agent --auth-token-file: an unreadable file or a refused token exits 78 keeping every event; the right token delivers them")
    func agentTokenFile() async throws {
        try await withTemporaryGroup { group in
            let tracker = try Tracker(configuration: .init(groupDirectory: group))
            for i in 0..<20 { try await tracker.track("Ordinary", properties: ["i": .int(Int64(i))]) }
            let tokenFile = group + "-token"
            try await Collector.withRunning(CollectorConfiguration(token: "s3cret")) { collector in
                let arguments = [
                    "--group", group, "--server", collector.url + "/sa", "--outbox", group + "-state/outbox.sqlite", "--once",
                    "--auth-token-file", tokenFile, "--log-level", "warning",
                ]
                let missing = try await Self.runAgent(arguments)
                #expect(missing.status == 78, "no token file: stderr: \(missing.stderr)")
                #expect(missing.stderr.contains("Cannot read the auth token file \(tokenFile): No such file or directory"), "\(missing.stderr)")

                // docs/wire-formats.md: a --once run (the fetch timer's) that the collector refuses ends with 78.
                try "expired\n".write(toFile: tokenFile, atomically: true, encoding: .utf8)
                let refused = try await Self.runAgent(arguments)
                #expect(refused.status == 78, "wrong token: stderr: \(refused.stderr)")
                #expect(refused.stderr.contains("refuses uploads") && refused.stderr.contains("401"), "\(refused.stderr)")
                #expect(try await collector.stats().unique == 0)
                #expect(try Outbox(path: group + "-state/outbox.sqlite").pending().count == 20, "the refused run must keep every event")

                // The HTTP client refuses such a header on every request: a transport error retried for ever.
                try "s3c\u{1B}ret\n".write(toFile: tokenFile, atomically: true, encoding: .utf8)
                let control = try await Self.runAgent(arguments + ["--deadline", "5"])
                #expect(control.status == 78, "a control character: stderr: \(control.stderr)")
                #expect(control.stderr.contains("control character"), "\(control.stderr)")

                try "s3cret\n".write(toFile: tokenFile, atomically: true, encoding: .utf8)
                // The largest batch size there is: its doubling when a batch is delivered trapped.
                let accepted = try await Self.runAgent(arguments + ["--batch-size", "\(Int.max)"])
                #expect(accepted.status == 0, "right token: stderr: \(accepted.stderr)")
                let stats = try await collector.stats()
                // Once after dedup; only a batch sent again under its key may repeat events.
                #expect(stats.unique == 20 && stats.duplicates <= stats.repeatedBatches * 20, "\(stats)")
                #expect(stats.orderViolations.values.reduce(0, +) == 0 && stats.seqViolations == 0)
            }
        }
    }

    @Test("tributary config sets, shows and removes the agent settings; a refused change leaves them; the agent uses them")
    func agentSettings() async throws {
        try await withTemporaryGroup { group in
            #expect(try await ChildProcess.run("tributary", ["track", "--create", "--group", group, "Ordinary"]).status == 0)
            #expect(try await ChildProcess.run("tributary", ["config", "--group", group]).stdout == "none\n")
            try await Collector.withRunning(CollectorConfiguration()) { collector in
                let set = try await ChildProcess.run(
                    "tributary", ["config", "set", "--group", group, "server_url=\(collector.url)/ingest", "format=ndjson"])
                #expect(set.status == 0, "\(set.stderr)")
                #expect(set.stdout == "server_url=\(collector.url)/ingest\nformat=ndjson\n")
                let refused = try await ChildProcess.run(
                    "tributary", ["config", "set", "--group", group, "flush_bulk_size=60", "flush_interval_seconds=1"])
                #expect(refused.status == 65 && refused.stderr.contains("flush_interval_seconds"), "\(refused.stderr)")
                let shown = try await ChildProcess.run("tributary", ["config", "show", "--group", group, "--json"])
                #expect(shown.stdout == #"{"format":"ndjson","server_url":"\#(collector.url)/ingest"}"# + "\n")
                let status = try await ChildProcess.run("tributary", ["status", "--group", group])
                #expect(status.stdout.contains("agent settings: server_url=\(collector.url)/ingest, format=ndjson"), "\(status.stdout)")

                // No --server and no --format: the group's. The run says where it sent them.
                let run = try await Self.runAgent(["--group", group, "--outbox", group + "-state/outbox.sqlite", "--once"])
                #expect(run.status == 0, "\(run.stderr)")
                #expect(try await collector.stats().unique == 1)
                #expect(try await collector.stats().requests == 1)

                // The systemd units' environment files: TRIBUTARY_SERVER and TRIBUTARY_FORMAT win over the group's.
                try await Collector.withRunning(CollectorConfiguration()) { operators in
                    #expect(try await ChildProcess.run("tributary", ["track", "--create", "--group", group, "Ordinary"]).status == 0)
                    let arguments = ["--group", group, "--outbox", group + "-state/outbox.sqlite", "--once"]
                    let badFormat = try await ChildProcess.run("tributary-agent", arguments, environment: ["TRIBUTARY_FORMAT": "xml"])
                    #expect(badFormat.status == 64 && badFormat.stderr.contains("TRIBUTARY_FORMAT must be sensors or ndjson"), "\(badFormat.stderr)")
                    let badServer = try await ChildProcess.run("tributary-agent", arguments, environment: ["TRIBUTARY_SERVER": "collector:8106"])
                    #expect(badServer.status == 64 && badServer.stderr.contains("TRIBUTARY_SERVER must be an http://"), "\(badServer.stderr)")
                    let run = try await ChildProcess.run(
                        "tributary-agent", arguments, environment: ["TRIBUTARY_SERVER": operators.url + "/sa", "TRIBUTARY_FORMAT": "sensors"])
                    #expect(run.status == 0, "\(run.stderr)")
                    #expect(try await operators.stats().unique == 1)
                    #expect(try await collector.stats().unique == 1)
                }
            }

            // Settings another program stored that are not valid: shown as stored, exit 65; --all removes them.
            try openExistingStore(group).setConfiguration(AgentSettings.configurationKey, json: #"{"server":"x"}"#)
            let invalid = try await ChildProcess.run("tributary", ["config", "--group", group])
            #expect(invalid.status == 65 && invalid.stdout.contains(#"{"server":"x"}"#), "\(invalid.stderr)")
            #expect(invalid.stderr.contains("unset --all"), "\(invalid.stderr)")
            let status = try await ChildProcess.run("tributary", ["status", "--group", group])
            #expect(status.stdout.contains("agent settings: NOT VALID"), "\(status.stdout)")
            let cannotMerge = try await ChildProcess.run("tributary", ["config", "set", "--group", group, "format=sensors"])
            #expect(cannotMerge.status == 65 && cannotMerge.stderr.contains("unset --all"), "\(cannotMerge.stderr)")
            #expect(try openExistingStore(group).configuration()[AgentSettings.configurationKey] == #"{"server":"x"}"#)
            #expect(try await ChildProcess.run("tributary", ["config", "unset", "--group", group, "--all"]).status == 0)
            #expect(try openExistingStore(group).configuration()[AgentSettings.configurationKey] == nil)

            // No collector URL anywhere: with nothing to send a --once run (a fetch timer's) is fine; with
            // events it has nowhere to send them.
            let arguments = ["--group", group, "--outbox", group + "-state/outbox.sqlite", "--once"]
            let nothing = try await Self.runAgent(arguments)
            #expect(nothing.status == 0, "\(nothing.stderr)")
            #expect(try await ChildProcess.run("tributary", ["track", "--create", "--group", group, "Ordinary"]).status == 0)
            let nowhere = try await Self.runAgent(arguments)
            #expect(nowhere.status == 78, "\(nowhere.stderr)")
            #expect(nowhere.stderr.contains("No collector URL: give --server"), "\(nowhere.stderr)")
        }
    }

    @Test("tributary-agent exits 78 (a configuration error) when its --metrics-address is taken")
    func metricsAddressTaken() async throws {
        // A listening socket holds the port for the whole test.
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { generic in
                bind(fd, generic, length) == 0 && listen(fd, 1) == 0 && getsockname(fd, generic, &length) == 0
            }
        }
        try #require(bound)
        let port = UInt16(bigEndian: address.sin_port)
        try await withTemporaryGroup { group in
            let result = try await ChildProcess.run("tributary-agent", [
                "--group", group, "--server", "http://127.0.0.1:9/sa", "--outbox", group + "-outbox.sqlite",
                "--metrics-address", "127.0.0.1:\(port)",
            ])
            #expect(result.status == 78, "stderr: \(result.stderr)")
            #expect(result.stderr.contains("--metrics-address"))
        }
    }
}
