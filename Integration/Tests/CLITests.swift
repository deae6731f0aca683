import Foundation
import Testing
import Tributary
@testable import TributaryAgentCore
import TributaryCollector
import TributaryStore
import TributaryTestSupport

@Suite("tributary CLI")
struct CLITests {
    @Test("track prints the event id; status and inspect show it")
    func trackStatusInspect() async throws {
        try await withTemporaryGroup { group in
            let track = try await ChildProcess.run(
                "tributary", ["track", "--group", group, "BuyProduct", "--properties", #"{"price": 9.99}"#,
                              "--producer", "extension", "--producer-id", "share"])
            #expect(track.status == 0, "\(track.stderr)")
            let eventID = track.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
            #expect(eventID.count == 36)
            let status = try await ChildProcess.run("tributary", ["status", "--group", group, "--json"])
            let json = try #require(try JSONSerialization.jsonObject(with: Data(status.stdout.utf8)) as? [String: Any])
            #expect(json["pending_events"] as? Int == 1)
            #expect(json["quota"] as? Int == 1 << 30)
            let inspect = try await ChildProcess.run("tributary", ["inspect", "--group", group, "--json"])
            #expect(inspect.stdout.contains(eventID))
            #expect(inspect.stdout.contains(#""producer":"share""#))
            #expect(inspect.stdout.contains(#""producer_kind":"extension""#))
        }
    }

    @Test("exit codes", arguments: [
        (["track", "--group", "{g}", "bad name"], Int32(65), "character"),
        (["track", "--group", "{g}", "X", "--properties", "{\"a\": null}"], 65, "null"),
        (["track", "--group", "{g}", "X", "--producer", "robot"], 64, "--producer"),
        (["status", "--group", "{g}/missing"], 66, "cannot be used"),
        (["login", "--group", "{g}", ""], 65, "login id"),
        (["login", "--group", "{g}/missing", "user-1"], 66, "missing"),
        (["logout", "--group", "{g}/missing"], 66, "missing"),
        (["track", "--group", "{g}", "X", "--properties", #"{"p": 1e400}"#], 65, "not finite as a Double"),
        // JSONDecoder takes a trailing comma for JSON; the collector's scanner, which checks typed JSON, does not.
        (["track", "--group", "{g}", "X", "--properties", #"{"p": 1,}"#], 65, "a ',' before the end of the container at byte 8"),
        (["track", "--group", "{g}", "X", "--properties", #"{"p": "\ud800"}"#], 65, "a high surrogate escape"),
        (["track", "--group", "{g}", "X", "--properties", #"{"p": 18446744073709551615}"#], 65, "send it as a string"),
        (["inspect", "--group", "{g}", "--limit", "0"], 64, "--limit"),
        (["dead-letters", "--group", "{g}", "--id", "3"], 64, "--replay"),
        (["dead-letters", "--outbox", "{g}-junk"], 74, "cannot be read"),
        (["dead-letters", "--outbox", "{g}-empty"], 66, "no outbox"),
        (["dead-letters", "--group", "{g}-junk"], 64, "is not a directory"),
        (["dead-letters", "--group", "{g}/missing"], 66, "cannot be used"),
        (["flush", "--group", "{g}/missing"], 66, "cannot be used"),
        (["status", "--group", "{g}-junk"], 64, "is not a directory"),
        (["track", "--group", "{g}-junk", "X"], 64, "is not a directory"),
        (["flush", "--group", "{g}-junk"], 64, "is not a directory"),
        (["status", "--group", "{g}-junk/group"], 64, "is not a directory"),
        (["track", "--group", "", "X"], 64, "--group must name"),
        (["status", "--group", ""], 64, "--group must name"),
        (["dead-letters", "--group", ""], 64, "must not be empty"),
        (["dead-letters", "--group", "{g}", "--limit", "0"], 64, "--limit"),
        (["track", "--group", "{g}", "X", "--app-version", ""], 64, "--app-version"),
        (["track", "--group", "{g}", "X", "--app-version", "1.0\t2"], 64, "--app-version"),
        (["track", "--group", "{g}", "X", "--app-version", String(repeating: "9", count: 9000)], 64, "--app-version"),
        (["config", "set", "--group", "{g}", "retries=3"], 64, #"Unknown setting "retries""#),
        (["config", "set", "--group", "{g}", "server_url"], 64, "is not KEY=VALUE"),
        (["config", "set", "--group", "{g}", "flush_bulk_size=5"], 65, "from 50 to 1000000"),
        (["config", "set", "--group", "{g}", "server_url=collector.example.com"], 65, "http:// or https://"),
        (["config", "set", "--group", "{g}"], 64, "at least one KEY=VALUE"),
        (["config", "set", "--group", "{g}/missing", "format=ndjson"], 66, "missing"),
        (["config", "unset", "--group", "{g}"], 64, "--all"),
        (["config", "unset", "--group", "{g}", "retries"], 64, #"Unknown setting "retries""#),
        (["config", "--group", "{g}/missing"], 66, "missing"),
    ])
    func exitCodes(arguments: [String], code: Int32, message: String) async throws {
        try await withTemporaryGroup { group in
            _ = FileManager.default.createFile(atPath: group + "-junk", contents: Data("not a database".utf8))
            _ = FileManager.default.createFile(atPath: group + "-empty", contents: Data())
            let result = try await ChildProcess.run("tributary", arguments.map { $0.replacingOccurrences(of: "{g}", with: group) })
            #expect(result.status == code, "stderr: \(result.stderr)")
            #expect(result.stderr.contains(message))
        }
    }

    @Test("a refused event leaves the app's published presets as they were; the next extension event carries the version before")
    func refusedEventPublishesNothing() async throws {
        try await withTemporaryGroup { group in
            #expect(try await ChildProcess.run("tributary", ["track", "--group", group, "Ok", "--app-version", "1.0.0"]).status == 0)
            let refused = try await ChildProcess.run("tributary", ["track", "--group", group, "bad name", "--app-version", "9.9.9"])
            #expect(refused.status == 65, "\(refused.stderr)")
            let badProperty = try await ChildProcess.run(
                "tributary", ["track", "--group", group, "Ok", "--app-version", "9.9.9", "--properties", #"{"a": null}"#])
            #expect(badProperty.status == 65, "\(badProperty.stderr)")
            let presets = try #require(try openExistingStore(group).configuration()[ConfigurationKey.appPresets])
            #expect(presets.contains(#""$app_version":"1.0.0""#), "\(presets)")
        }
    }

    @Test("a stdout that cannot be written to: track says the event is stored and exits 74; a reader gone ends a listing quietly")
    func unwritableStdout() async throws {
        try await withTemporaryGroup { group in
            let tributary = productsDirectory.appendingPathComponent("tributary").path
            // FileHandle.write trapped here (exit 132) after the event was stored: a script retrying on the
            // failure stored it twice, under two event ids.
            let full = try await ChildProcess(path: "/bin/sh", ["-c", #""$0" track --group "$1" Paid > /dev/full"#, tributary, group]).finish()
            #expect(full.status == 74, "\(full.stderr)")
            #expect(full.stderr.contains("is stored: do not do it again"), "\(full.stderr)")
            #expect(try openExistingStore(group).status().pendingEvents == 1)
            // A reader that went away (a pipe whose read end is closed): a listing changed nothing, and ends
            // quietly, whether the caller ignores SIGPIPE (systemd's units do by default) or not (a shell
            // pipeline: the signal ended it, 141; the CLI ignores it itself).
            var ends: [Int32] = [0, 0]
            #expect(pipe(&ends) == 0)
            close(ends[0])
            let output = FileHandle(fileDescriptor: ends[1], closeOnDealloc: true)
            for script in [#"trap '' PIPE; exec "$0" inspect --group "$1""#, #"trap - PIPE; exec "$0" inspect --group "$1""#] {
                let listing = Process()
                listing.executableURL = URL(fileURLWithPath: "/bin/sh")
                listing.arguments = ["-c", script, tributary, group]
                listing.standardOutput = output
                let errors = Pipe()
                listing.standardError = errors
                try listing.run()
                let stderr = errors.fileHandleForReading.readDataToEndOfFile()
                listing.waitUntilExit()
                #expect(
                    listing.terminationReason == .exit && listing.terminationStatus == 0,
                    "\(script): \(listing.terminationReason == .exit ? "exit" : "signal") \(listing.terminationStatus) \(String(decoding: stderr, as: UTF8.self))")
                #expect(stderr.isEmpty, "\(String(decoding: stderr, as: UTF8.self))")
            }
        }
    }

    @Test("tributary-sim demo (make run) reports a failure at run time with exit 1, not as a usage error")
    func demoRunFailure() async throws {
        // No group directory can be made under /proc.
        let result = try await ChildProcess.run("tributary-sim", ["demo", "--group", "/proc/tributary-none/group"])
        #expect(result.status == 1, "stderr: \(result.stderr)")
        #expect(result.stderr.contains("Cannot create the group directory /proc/tributary-none/group"), "\(result.stderr)")
        #expect(!result.stderr.contains("USAGE") && !result.stderr.contains("Usage"), "a run-time failure printed the usage: \(result.stderr)")
    }

    /// An outbox at `path` holding `count` dead letters (events e1, e2, … refused with 422, `reason`).
    static func outboxWithDeadLetters(_ path: String, count: Int, reason: String = "HTTP 422") throws -> Outbox {
        let outbox = try Outbox(path: path)
        try outbox.insertDrained((1...count).map { n in
            .event(Outbox.Row(
                id: 0, seq: UInt64(n), eventID: "e\(n)", producer: "app", producerKind: .app, producerSeq: UInt64(n),
                wallMillis: 1, bootNanos: 2, bootID: .current, body: Array(#"{"event_id":"e\#(n)"}"#.utf8), batchID: nil))
        })
        for row in try outbox.nextBatch(maxCount: count, maxBytes: 1 << 20) {
            try outbox.deadLetter(row, status: 422, reason: reason)
        }
        return outbox
    }

    @Test("dead-letters prints each dead letter on one line, whatever the collector's reason held (line breaks, tabs, escapes)")
    func deadLetterReasonOneLine() async throws {
        try await withTemporaryGroup { group in
            let path = group + "-outbox.sqlite"
            // As an outbox written before the agent made its reasons one line holds a proxy's answer.
            let reason = "HTTP 422: <html>\r\n<body>\tbad\u{1B}[31m event</body>\r\n"
            _ = try Self.outboxWithDeadLetters(path, count: 2, reason: reason)
            let listed = try await ChildProcess.run("tributary", ["dead-letters", "--outbox", path])
            #expect(listed.status == 0, "\(listed.stderr)")
            let lines = listed.stdout.split(separator: "\n", omittingEmptySubsequences: false).dropLast()
            #expect(lines.count == 2, "\(listed.stdout)")
            for line in lines {
                let fields = line.split(separator: "\t", omittingEmptySubsequences: false)
                #expect(fields.count == 6, "\(line)")
                #expect(fields.last == #"HTTP 422: <html> <body> bad\u{1b}[31m event</body>"#)
            }
            // --json keeps the reason as it was stored.
            let json = try await ChildProcess.run("tributary", ["dead-letters", "--outbox", path, "--json"])
            let array = try #require(try JSONSerialization.jsonObject(with: Data(json.stdout.utf8)) as? [[String: Any]])
            #expect(array.first?["reason"] as? String == reason)
        }
    }

    @Test("dead-letters lists at most --limit, oldest first, and says on stderr how many more there are")
    func deadLettersLimit() async throws {
        try await withTemporaryGroup { group in
            let path = group + "-outbox.sqlite"
            _ = try Self.outboxWithDeadLetters(path, count: 5)
            let listed = try await ChildProcess.run("tributary", ["dead-letters", "--outbox", path, "--limit", "2"])
            #expect(listed.status == 0, "\(listed.stderr)")
            #expect(listed.stdout.split(separator: "\n").map { $0.split(separator: "\t")[2] } == ["e1", "e2"])
            #expect(listed.stderr.contains("3 more dead letter(s) not listed (5 in all)"), "\(listed.stderr)")
            let json = try await ChildProcess.run("tributary", ["dead-letters", "--outbox", path, "--limit", "4", "--json"])
            let array = try #require(try JSONSerialization.jsonObject(with: Data(json.stdout.utf8)) as? [[String: Any]])
            #expect(array.count == 4 && json.stderr.contains("1 more"))
            let all = try await ChildProcess.run("tributary", ["dead-letters", "--outbox", path])
            #expect(all.stdout.split(separator: "\n").count == 5 && all.stderr.isEmpty, "\(all.stderr)")
        }
    }

    @Test("dead-letters --replay --id refuses an id that names no dead letter, and replays nothing")
    func replayUnknownID() async throws {
        try await withTemporaryGroup { group in
            let path = group + "-outbox.sqlite"
            let outbox = try Self.outboxWithDeadLetters(path, count: 1)
            let letter = try #require(outbox.deadLetters().first)
            let refused = try await ChildProcess.run(
                "tributary", ["dead-letters", "--outbox", path, "--replay", "--id", "\(letter.id)", "--id", "999"])
            #expect(refused.status == 65, "stderr: \(refused.stderr)")
            #expect(refused.stderr.contains("id 999") && refused.stderr.contains("nothing was replayed"))
            #expect(try outbox.deadLetters().count == 1 && outbox.pending().count == 0)
            let replayed = try await ChildProcess.run("tributary", ["dead-letters", "--outbox", path, "--replay", "--id", "\(letter.id)"])
            #expect(replayed.status == 0 && replayed.stdout.contains("replayed 1"), "stderr: \(replayed.stderr)")
            #expect(try outbox.deadLetters().isEmpty && outbox.pending().count == 1)
        }
    }

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

    @Test("a second agent, of another group, is refused the outbox the first one uses (exit 78), by its path or through a symbolic link, and gets it once that one stopped",
          arguments: ["the same path", "a link to the file", "a link to its directory", "a link to a file not there yet"])
    func sharedOutboxRefused(via: String) async throws {
        try await withTemporaryGroup { group in
            let other = group + "-other"
            defer {
                for path in [other, group + "-link.sqlite", group + "-link-dir"] { try? FileManager.default.removeItem(atPath: path) }
            }
            let outbox = group + "-state/outbox.sqlite"
            let server = ["--server", "http://127.0.0.1:9/sa", "--log-level", "warning"]
            let common = server + ["--outbox", outbox]
            // A link made before the outbox exists, given to the first agent (the second names the file).
            var firstNamed = outbox
            if via == "a link to a file not there yet" {
                try FileManager.default.createDirectory(atPath: group + "-state", withIntermediateDirectories: true)
                firstNamed = group + "-link.sqlite"
                try FileManager.default.createSymbolicLink(atPath: firstNamed, withDestinationPath: outbox)
            }
            let first = try ChildProcess("tributary-agent", ["--group", group] + server + ["--outbox", firstNamed])
            // The first agent holds the outbox once it has written its status.
            let started = ContinuousClock.now
            while AgentChannel.readStatus(groupDirectory: group) == nil && ContinuousClock.now - started < .seconds(30) {
                try await Task.sleep(for: .milliseconds(20))
            }
            // Its lock was named after the path given: through a link, another agent took the outbox too,
            // and rewound the first one's drain position.
            var named = outbox
            if via == "a link to the file" {
                named = group + "-link.sqlite"
                try FileManager.default.createSymbolicLink(atPath: named, withDestinationPath: outbox)
            } else if via == "a link to its directory" {
                try FileManager.default.createSymbolicLink(atPath: group + "-link-dir", withDestinationPath: group + "-state")
                named = group + "-link-dir/outbox.sqlite"
            }
            let refused = try await ChildProcess.run("tributary-agent", ["--group", other, "--once", "--outbox", named] + server)
            #expect(refused.status == 78, "stderr: \(refused.stderr)")
            #expect(refused.stderr.contains("is in use by another tributary-agent") && refused.stderr.contains(group))
            first.send(SIGTERM)
            #expect(await first.finish().status == 0)
            let alone = try await ChildProcess.run("tributary-agent", ["--group", other, "--once", "--deadline", "1"] + common)
            #expect(alone.status == 0, "stderr: \(alone.stderr)")
        }
    }

    @Test("--group and --outbox may be relative to the working directory, the outbox a bare file name")
    func relativePaths() async throws {
        try await withTemporaryGroup { group in
            let directory = (group as NSString).deletingLastPathComponent
            let relative = (group as NSString).lastPathComponent
            for index in 0..<3 {
                let track = try await ChildProcess.run(
                    "tributary", ["track", "--group", relative, "Relative\(index)"], directory: directory)
                #expect(track.status == 0, "\(track.stderr)")
            }
            try await Collector.withRunning(CollectorConfiguration()) { collector in
                // A bare name has no directory to create: it was refused as "Cannot open the outbox" (exit 74).
                let agent = try await ChildProcess.run(
                    "tributary-agent",
                    ["--group", relative, "--outbox", "outbox.sqlite", "--server", collector.url + "/sa", "--once"],
                    directory: directory)
                #expect(agent.status == 0, "\(agent.stderr)")
                #expect(try await collector.stats().unique == 3)
            }
            #expect(FileManager.default.fileExists(atPath: directory + "/outbox.sqlite"))
            let listed = try await ChildProcess.run(
                "tributary", ["dead-letters", "--outbox", "outbox.sqlite"], directory: directory)
            #expect(listed.status == 0, "\(listed.stderr)")
            // The agent's status names the outbox by its absolute path: found from any working directory.
            #expect(AgentChannel.readStatus(groupDirectory: group)?.outboxPath == directory + "/outbox.sqlite")
            let elsewhere = try await ChildProcess.run("tributary", ["dead-letters", "--group", group], directory: "/")
            #expect(elsewhere.status == 0, "\(elsewhere.stderr)")
            #expect(elsewhere.stdout.contains(directory + "/outbox.sqlite"), "\(elsewhere.stdout)")
        }
    }

    @Test("an agent whose outbox is not the one that last drained the group names that one, and how to send what waits in it")
    func otherOutboxNamed() async throws {
        try await withTemporaryGroup { group in
            for index in 0..<20 {
                let track = try await ChildProcess.run("tributary", ["track", "--group", group, "Event\(index)"])
                #expect(track.status == 0, "\(track.stderr)")
            }
            let manual = group + "-manual/outbox.sqlite"
            let service = group + "-service/outbox.sqlite"
            // A manual run with the collector unreachable: the events move to its outbox and wait there.
            let first = try await ChildProcess.run(
                "tributary-agent",
                ["--group", group, "--outbox", manual, "--server", "http://127.0.0.1:9/sa", "--once", "--deadline", "5"])
            #expect(first.status == 0, "\(first.stderr)")
            try #require(try Outbox(path: manual).pending().count == 20)
            #expect(try SharedStore(groupDirectory: group).status().pendingEvents == 0)
            try await Collector.withRunning(CollectorConfiguration()) { collector in
                let second = try await ChildProcess.run(
                    "tributary-agent", ["--group", group, "--outbox", service, "--server", collector.url + "/sa", "--once"])
                #expect(second.status == 0, "\(second.stderr)")
                #expect(second.stderr.contains("the last agent to drain this group used another outbox"), "\(second.stderr)")
                #expect(second.stderr.contains("--outbox \(manual) --once` sends them"), "\(second.stderr)")
                #expect(try await collector.stats().unique == 0)
                // As the warning says: the manual outbox's events go, and the service's outbox goes on.
                let sent = try await ChildProcess.run(
                    "tributary-agent", ["--group", group, "--outbox", manual, "--server", collector.url + "/sa", "--once"])
                #expect(sent.status == 0, "\(sent.stderr)")
                #expect(try await collector.stats().unique == 20)
            }
        }
    }

    @Test("an agent started on a group with no store says it created one (a mistyped --group looks the same); on an existing one it does not")
    func agentCreatesStore() async throws {
        try await withTemporaryGroup { group in
            let arguments = ["--group", group + "/typo", "--outbox", group + "-state/outbox.sqlite", "--server", "http://127.0.0.1:9/sa", "--once"]
            let first = try await Self.runAgent(arguments)
            #expect(first.status == 0, "\(first.stderr)")
            #expect(first.stderr.contains("created an empty one"), "\(first.stderr)")
            let second = try await Self.runAgent(arguments)
            #expect(second.status == 0 && !second.stderr.contains("created an empty one"), "\(second.stderr)")
        }
    }

    /// Runs `tributary-agent` to its end, killed after `limit`: an agent that should have refused to start
    /// and did not would otherwise run on as a daemon (and its status then tells: 9, SIGKILL).
    static func runAgent(_ arguments: [String], killedAfter limit: Duration = .seconds(30))
        async throws -> (status: Int32, stdout: String, stderr: String)
    {
        let agent = try ChildProcess("tributary-agent", arguments)
        let limiter = agent.killAfter(limit)
        defer { limiter.cancel() }
        return await agent.finish()
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
                #expect(stats.unique == 20 && stats.duplicates == 0, "\(stats.unique) delivered, \(stats.duplicates) duplicates")
                #expect(stats.orderViolations.values.reduce(0, +) == 0 && stats.seqViolations == 0)
            }
        }
    }

    @Test("tributary config sets, shows and removes the agent settings; a refused change leaves them; the agent uses them")
    func agentSettings() async throws {
        try await withTemporaryGroup { group in
            #expect(try await ChildProcess.run("tributary", ["track", "--group", group, "Ordinary"]).status == 0)
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
                    #expect(try await ChildProcess.run("tributary", ["track", "--group", group, "Ordinary"]).status == 0)
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
            #expect(try await ChildProcess.run("tributary", ["track", "--group", group, "Ordinary"]).status == 0)
            let nowhere = try await Self.runAgent(arguments)
            #expect(nowhere.status == 78, "\(nowhere.stderr)")
            #expect(nowhere.stderr.contains("No collector URL: give --server"), "\(nowhere.stderr)")
        }
    }

    // The agent unit has RestartPreventExitStatus=69: a second agent started by hand must exit with exactly
    // that, not a code systemd would restart, and say which process holds the group.
    @Test("a second tributary-agent on a group the first one drains exits 69 naming the first one's pid, and leaves it running")
    func secondAgentExits69() async throws {
        try await withTemporaryGroup { group in
            let server = ["--server", "http://127.0.0.1:9/sa", "--log-level", "warning"]
            let notify = try NotifySocket(path: group + "-notify")
            let first = try ChildProcess(
                "tributary-agent", ["--group", group, "--outbox", group + "-state/outbox.sqlite"] + server,
                environment: ["NOTIFY_SOCKET": notify.path])
            #expect(await notify.wait(for: "READY=1", timeout: 30) != nil, "the first agent never sent READY=1")
            // An outbox of its own: the group alone is what the two share.
            let second = try await Self.runAgent(["--group", group, "--outbox", group + "-state2/outbox.sqlite"] + server)
            #expect(second.status == 69, "stderr: \(second.stderr)")
            #expect(second.stderr.contains("(pid \(first.pid))"), "the refusal must name pid \(first.pid): \(second.stderr)")
            #expect(first.process.isRunning, "the first agent must run on")
            // The refused agent must not have taken the first one's flush socket.
            let flush = try await ChildProcess.run("tributary", ["flush", "--group", group])
            #expect(flush.status == 0, "the first agent no longer listens: \(flush.stderr)")
            first.send(SIGTERM)
            let stopped = await first.finish()
            #expect(stopped.status == 0, "\(stopped.stderr)")
        }
    }

    @Test("tributary flush never waits for a stopped agent: requests it has not read are enough, each exits 0 at once")
    func flushBesideStoppedAgent() async throws {
        try await withTemporaryGroup { group in
            let notify = try NotifySocket(path: group + "-notify")
            let agent = try ChildProcess(
                "tributary-agent",
                ["--group", group, "--outbox", group + "-state/outbox.sqlite", "--server", "http://127.0.0.1:9/sa", "--log-level", "warning"],
                environment: ["NOTIFY_SOCKET": notify.path])
            #expect(await notify.wait(for: "READY=1", timeout: 30) != nil, "the agent never sent READY=1")
            agent.send(SIGSTOP)
            try #require(await MultiProcessTests.waitUntilStopped(agent.pid), "the agent never stopped")
            // The socket's queue holds 10 datagrams (net.unix.max_dgram_qlen); the 11th send blocked until
            // the agent read, which a stopped agent never does (an app's UI thread waited with it).
            var outputs: [String] = []
            for _ in 0..<15 {
                let flush = try ChildProcess("tributary", ["flush", "--group", group])
                let result = try await MultiProcessTests.finish(flush, orRecord: "tributary flush waits for the stopped agent")
                #expect(result.status == 0, "\(result.stderr)")
                outputs.append(result.stdout)
            }
            #expect(outputs.last?.contains("has not read") == true, "\(outputs)")
            agent.send(SIGCONT)
            agent.send(SIGTERM)
            #expect(await agent.finish().status == 0)
        }
    }

    /// A group directory under `root` whose `agent.sock` path is `length` bytes long.
    static func groupDirectory(under root: String, socketPathLength length: Int) -> String {
        let socket = "/" + AgentChannel.socketFile
        var directory = root
        while directory.utf8.count + socket.utf8.count < length {
            let room = length - directory.utf8.count - socket.utf8.count
            // Components of at most 40 bytes, "/" included; never a last one of "/" alone.
            let take = room <= 40 ? room : (room == 41 ? 39 : 40)
            directory += "/" + String(repeating: "d", count: take - 1)
        }
        return directory
    }

    // A sockaddr_un holds 108 bytes of path, its NUL included: an agent.sock path of 107 bytes is the
    // longest that can be bound. A longer one is a configuration error the agent names (exit 78, which
    // systemd does not restart), not a path cut short or a failure to bind reported as something else.
    @Test("tributary-agent serves an agent.sock path of 107 bytes, and exits 78 naming the path at 108", arguments: [107, 108])
    func socketPathLength(length: Int) async throws {
        try await withTemporaryGroup { group in
            let directory = Self.groupDirectory(under: group, socketPathLength: length)
            let socket = directory + "/" + AgentChannel.socketFile
            try #require(socket.utf8.count == length, "\(socket) is \(socket.utf8.count) bytes, not \(length)")
            let arguments = [
                "--group", directory, "--server", "http://127.0.0.1:9/sa", "--outbox", group + "-state/outbox.sqlite",
                "--log-level", "warning",
            ]
            if length >= 108 {
                let result = try await Self.runAgent(arguments)
                #expect(result.status == 78, "stderr: \(result.stderr)")
                #expect(result.stderr.contains("too long for the agent's Unix socket") && result.stderr.contains(socket),
                        "the message must say the path is too long, and name it: \(result.stderr)")
                #expect(!FileManager.default.fileExists(atPath: socket))
            } else {
                let notify = try NotifySocket(path: group + "-notify")
                let agent = try ChildProcess("tributary-agent", arguments, environment: ["NOTIFY_SOCKET": notify.path])
                #expect(await notify.wait(for: "READY=1", timeout: 30) != nil, "no READY=1 with a \(length)-byte socket path")
                let flush = try await ChildProcess.run("tributary", ["flush", "--group", directory])
                #expect(flush.status == 0, "the agent does not listen on its \(length)-byte socket path: \(flush.stderr)")
                agent.send(SIGTERM)
                let stopped = await agent.finish()
                #expect(stopped.status == 0, "\(stopped.stderr)")
            }
        }
    }

    @Test("dead-letters --discard deletes the dead letters an agent left, says how many, and frees their bytes in the quota")
    func discardDeadLetters() async throws {
        try await withTemporaryGroup { group in
            let tracker = try Tracker(configuration: .init(groupDirectory: group))
            for name in ["Ordinary", "Poison", "Ordinary", "Poison", "Ordinary"] { try await tracker.track(name) }
            let outboxPath = group + "-state/outbox.sqlite"
            let agentArguments = { (url: String) in
                ["--group", group, "--server", url + "/sa", "--outbox", outboxPath, "--once", "--log-level", "error"]
            }
            let faults = FaultConfiguration(poisonPattern: "^Poison$", poisonStatus: 422)
            try await Collector.withRunning(CollectorConfiguration(faults: faults)) { collector in
                let run = try await Self.runAgent(agentArguments(collector.url))
                #expect(run.status == 0, "stderr: \(run.stderr)")
                #expect(try await collector.stats().unique == 3)
            }
            // --group finds the outbox through the agent's status file.
            let listed = try await ChildProcess.run("tributary", ["dead-letters", "--group", group, "--json"])
            #expect(listed.status == 0, "stderr: \(listed.stderr)")
            let letters = try #require(try JSONSerialization.jsonObject(with: Data(listed.stdout.utf8)) as? [[String: Any]])
            #expect(letters.count == 2 && letters.allSatisfy { $0["status"] as? Int == 422 }, "\(listed.stdout)")
            #expect(try Outbox(path: outboxPath).pending().deadLetterBytes > 0)

            let discarded = try await ChildProcess.run("tributary", ["dead-letters", "--group", group, "--discard"])
            #expect(discarded.status == 0, "stderr: \(discarded.stderr)")
            #expect(discarded.stdout.contains("discarded 2 dead letter(s)"), "\(discarded.stdout)")
            let after = try await ChildProcess.run("tributary", ["dead-letters", "--group", group])
            #expect(after.stdout.contains("no dead letters in \(outboxPath)"), "\(after.stdout)")
            // The count the quota check reads, before any agent start recounts it from the table.
            let left = try Outbox(path: outboxPath).pending()
            #expect(left.deadLetterBytes == 0 && left.count == 0, "dead-letter bytes left: \(left.deadLetterBytes)")

            // `tributary status` shows the agent's report: the next run reports the freed quota.
            let next = try await Self.runAgent(agentArguments("http://127.0.0.1:9"))
            #expect(next.status == 0, "stderr: \(next.stderr)")
            let status = try await ChildProcess.run("tributary", ["status", "--group", group, "--json"])
            let json = try #require(try JSONSerialization.jsonObject(with: Data(status.stdout.utf8)) as? [String: Any])
            let agent = try #require(json["agent"] as? [String: Any], "no agent report: \(status.stdout)")
            #expect(agent["dead_letter_bytes"] as? Int == 0, "\(status.stdout)")
        }
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

    @Test("a tool started with stdin and stdout closed writes nothing into the store; the events stay readable", arguments: [
        "tributary status --group {g}", "tributary inspect --group {g}", "tributary config show --group {g}",
        "tributary-sim extension --events 2 --group {g}",
    ])
    func closedStandardDescriptors(command: String) async throws {
        try await withTemporaryGroup { group in
            for name in ["A", "B", "C"] {
                #expect(try await ChildProcess.run("tributary", ["track", name, "--group", group]).status == 0)
            }
            // The LMDB file took descriptor 1, and what the command printed went into it.
            let tool = productsDirectory.path + "/" + command.replacingOccurrences(of: "{g}", with: group)
            let closed = try await ChildProcess(path: "/bin/sh", ["-c", "exec <&- >&-; exec \(tool)"]).finish()
            #expect(closed.status == 0, "stderr: \(closed.stderr)")
            let status = try await ChildProcess.run("tributary", ["status", "--group", group, "--json"])
            #expect(status.status == 0, "stderr: \(status.stderr)")
            let json = try JSONSerialization.jsonObject(with: Data(status.stdout.utf8)) as? [String: Any]
            #expect(json?["pending_events"] as? Int == (command.contains("extension") ? 5 : 3), "\(status.stdout)")
        }
    }

    @Test("tributary-sim demo refuses to remove a group whose store holds undelivered events; run from PATH, it finds the other tools and runs again over its own group")
    func demoKeepsRealGroup() async throws {
        try await withTemporaryGroup { group in
            // An app's group: the same file names as a demo's, and an event waiting for the agent.
            #expect(try await ChildProcess.run("tributary", ["track", "Real", "--group", group]).status == 0)
            let refused = try await ChildProcess.run("tributary-sim", ["demo", "--group", group])
            #expect(refused.status == 64, "stderr: \(refused.stderr)")
            #expect(refused.stderr.contains("holds a Tributary store with 1 events not yet delivered"), "\(refused.stderr)")
            let status = try await ChildProcess.run("tributary", ["status", "--group", group])
            #expect(status.stdout.contains("pending events: 1"), "\(status.stdout)")

            // Started by name from PATH, in another directory (it looked for its siblings there).
            let demo = group + "-demo"
            let script = "cd \(group)-state-dir && PATH=\(productsDirectory.path):$PATH exec tributary-sim demo "
                + "--group \(demo) --app-events 30 --extension-events 3"
            try FileManager.default.createDirectory(atPath: group + "-state-dir", withIntermediateDirectories: true)
            for run in 1...2 {
                let result = try await ChildProcess(path: "/bin/sh", ["-c", script]).finish()
                #expect(result.status == 0, "run \(run): \(result.stderr)")
                #expect(result.stdout.contains("lost                         0"), "run \(run): \(result.stdout)")
            }
            try? FileManager.default.removeItem(atPath: group + "-state-dir")
            try? FileManager.default.removeItem(atPath: demo)
            try? FileManager.default.removeItem(atPath: demo + "-state")
        }
    }

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

    @Test("opening a store leaves the modes of its existing files as their owner set them")
    func storeModesKept() async throws {
        try await withTemporaryGroup { group in
            try await Self.trackOne(group)
            let file = group + "/" + SharedStore.fileName
            chmod(file, 0o640)
            chmod(file + "-lock", 0o640)
            #expect(try await ChildProcess.run("tributary", ["status", "--group", group]).status == 0)
            #expect(try await ChildProcess.run("tributary", ["track", "Y", "--group", group]).status == 0)
            for path in [file, file + "-lock"] {
                var st = stat()
                #expect(stat(path, &st) == 0 && st.st_mode & 0o777 == 0o640, "\(path): \(String(st.st_mode & 0o777, radix: 8))")
            }
        }
    }

    @Test("an argument that is not valid UTF-8 is refused (65) before anything is done, not stored with U+FFFD in its place")
    func invalidUTF8Argument() async throws {
        try await withTemporaryGroup { group in
            let tributary = productsDirectory.path + "/tributary"
            for arguments in [#"track Ev --properties "$(printf '{"a":"\377"}')""#, #"login "$(printf '\377')""#] {
                let result = try await ChildProcess(path: "/bin/sh", ["-c", "exec \(tributary) \(arguments) --group \(group)"]).finish()
                #expect(result.status == 65, "\(arguments): \(result.stderr)")
                #expect(result.stderr.contains("is not valid UTF-8"), "\(arguments): \(result.stderr)")
            }
            #expect(!FileManager.default.fileExists(atPath: group), "the group was created")
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

    /// Stores one event `X` in `group` (creating the group and its store) with `tributary track`.
    static func trackOne(_ group: String) async throws {
        let track = try await ChildProcess.run("tributary", ["track", "X", "--group", group])
        #expect(track.status == 0, "\(track.stderr)")
    }

    @Test("an agent.sock that is not a socket is refused (78) and left alone, not met with \"Address already in use\"")
    func socketPathTaken() async throws {
        try await withTemporaryGroup { group in
            try await Self.trackOne(group)
            let socketPath = group + "/" + AgentChannel.socketFile
            try FileManager.default.createDirectory(atPath: socketPath, withIntermediateDirectories: false)
            let agent = try await ChildProcess.run("tributary-agent", [
                "--group", group, "--server", "http://127.0.0.1:9/sa", "--outbox", group + "-outbox.sqlite",
            ])
            #expect(agent.status == 78, "\(agent.stderr)")
            #expect(agent.stderr.contains("is not a socket"), "\(agent.stderr)")
            var isDirectory: ObjCBool = false
            #expect(FileManager.default.fileExists(atPath: socketPath, isDirectory: &isDirectory) && isDirectory.boolValue)
        }
    }

    @Test("every tool refuses a world-writable group with exit 77, and leaves the directory's mode as it was", arguments: [
        ("tributary", ["status", "--group", "{g}"]),
        ("tributary", ["track", "Refused", "--group", "{g}"]),
        ("tributary-sim", ["load", "--count", "1", "--group", "{g}"]),
        ("tributary-sim", ["app", "--events", "1", "--group", "{g}"]),
        ("tributary-agent", ["--group", "{g}", "--once"]),
    ])
    func worldWritableGroup(tool: String, arguments: [String]) async throws {
        try await withTemporaryGroup { group in
            try FileManager.default.createDirectory(atPath: group, withIntermediateDirectories: true)
            chmod(group, 0o777)
            let result = try await ChildProcess.run(tool, arguments.map { $0.replacingOccurrences(of: "{g}", with: group) })
            #expect(result.status == 77, "stderr: \(result.stderr)")
            #expect(result.stderr.contains("writable by every user"), "stderr: \(result.stderr)")
            var st = stat()
            #expect(stat(group, &st) == 0 && st.st_mode & 0o7777 == 0o777, "mode \(String(st.st_mode & 0o7777, radix: 8))")
            #expect(try FileManager.default.contentsOfDirectory(atPath: group).isEmpty)
        }
    }

    @Test("tributary-sim demo refuses bad options before it starts or removes anything", arguments: [
        (["--format", "xml"], "--format"),
        (["--timeout", "0"], "--timeout"),
        (["--app-events=-5"], "--app-events"),
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

    @Test("status shows the outbox's bytes against its quota, and says when dead letters fill it")
    func statusOutboxFull() async throws {
        try await withTemporaryGroup { group in
            _ = try Tracker(configuration: .init(groupDirectory: group))
            var report = AgentStatus(
                pid: 1, state: "idle", outboxPath: group + "-outbox.sqlite", outboxPending: 0, delivered: 0,
                deadLetters: 7, batches: 0, retries: 0, corruptRecords: 0, lastUploadMillis: nil, updatedMillis: 0)
            (report.outboxBytes, report.deadLetterBytes, report.outboxQuota) = (0, 600, 512)
            try report.write(groupDirectory: group)
            let text = try await ChildProcess.run("tributary", ["status", "--group", group])
            #expect(text.stdout.contains("0 pending + 600 dead letters of a 512 quota; FULL"), "\(text.stdout)")
        }
    }

    @Test("track as the app leaves the app's published presets alone, unless --app-version is given")
    func trackKeepsAppPresets() async throws {
        try await withTemporaryGroup { group in
            var app = Tracker.Configuration(groupDirectory: group)
            app.appVersion = "2.3.4"
            let store = try Tracker(configuration: app).store
            func publishedVersion() throws -> String? {
                let text = try store.configuration()[ConfigurationKey.appPresets] ?? "{}"
                return (try JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any])?["$app_version"] as? String
            }
            let plain = try await ChildProcess.run("tributary", ["track", "--group", group, "ScriptPing"])
            #expect(plain.status == 0, "\(plain.stderr)")
            #expect(try publishedVersion() == "2.3.4")
            let versioned = try await ChildProcess.run("tributary", ["track", "--group", group, "ScriptPing", "--app-version", "2.4.0"])
            #expect(versioned.status == 0, "\(versioned.stderr)")
            #expect(try publishedVersion() == "2.4.0")
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

    /// Runs `tributary` as a user that is neither the owner of `group` nor in its group. As root (mode
    /// bits do not bind root) that is `nobody`, through setpriv; otherwise this user, with the directory's
    /// mode 0 for the time of the call.
    static func runLockedOut(_ arguments: [String], group: String) async throws -> (status: Int32, stdout: String, stderr: String) {
        guard getuid() == 0 else {
            chmod(group, 0)
            defer { chmod(group, 0o2770) }
            return try await ChildProcess.run("tributary", arguments)
        }
        return try await runAsNobody(arguments)
    }

    /// Runs `tool` (default `tributary`) as `nobody` (uid 65534) in group `nogroup` (gid 65534) alone,
    /// through setpriv.
    static func runAsNobody(_ arguments: [String], tool: String = "tributary") async throws -> (status: Int32, stdout: String, stderr: String) {
        let path = productsDirectory.appendingPathComponent(tool).path
        return try await ChildProcess(
            path: "/usr/bin/setpriv", ["--reuid=65534", "--regid=65534", "--clear-groups", path] + arguments
        ).finish()
    }

    @Test("an agent whose user may not write its outbox's directory exits 77 (permission), not 74",
          .enabled(if: getuid() == 0 && FileManager.default.isExecutableFile(atPath: "/usr/bin/setpriv"),
                   "needs root, to set up a group for another user, and setpriv"))
    func outboxPermissionDenied() async throws {
        let top = "/var/tmp/tributary-permission-\(UUID().uuidString.prefix(8))"
        defer { try? FileManager.default.removeItem(atPath: top) }
        // A group of nobody's, and an outbox directory that only root may write.
        try FileManager.default.createDirectory(atPath: top + "/state", withIntermediateDirectories: true)
        chmod(top, 0o755)
        chmod(top + "/state", 0o755)
        try FileManager.default.createDirectory(atPath: top + "/group", withIntermediateDirectories: true)
        chown(top + "/group", 65534, 65534)
        chmod(top + "/group", 0o2770)
        let result = try await Self.runAsNobody(
            ["--group", top + "/group", "--outbox", top + "/state/outbox.sqlite", "--server", "http://127.0.0.1:9/sa", "--once"],
            tool: "tributary-agent")
        #expect(result.status == 77, "stderr: \(result.stderr)")
        #expect(result.stderr.contains("\(top)/state"), "stderr: \(result.stderr)")
    }

    @Test("a user who may not use the group directory is told so (exit 77), not that there is no store",
          .enabled(if: getuid() != 0 || FileManager.default.isExecutableFile(atPath: "/usr/bin/setpriv"),
                   "as root only another user meets EACCES, and setpriv (util-linux) is not installed"),
          arguments: [
            ["status", "--group", "{g}"],
            ["track", "--group", "{g}", "X"],
            ["login", "--group", "{g}", "user-1"],
            ["flush", "--group", "{g}"],
            ["status", "--group", "{g}/nested"],
            ["dead-letters", "--outbox", "{g}/outbox.sqlite"],
            ["dead-letters", "--group", "{g}"],
          ])
    func permissionDenied(arguments: [String]) async throws {
        try await withTemporaryGroup { group in
            _ = try SharedStore(groupDirectory: group)  // mode 2770, this user's
            _ = FileManager.default.createFile(atPath: group + "/outbox.sqlite", contents: Data("an outbox".utf8))
            try FileManager.default.createDirectory(atPath: group + "/nested", withIntermediateDirectories: false)
            let before = try SharedStore(groupDirectory: group).lastTransactionID
            let result = try await Self.runLockedOut(
                arguments.map { $0.replacingOccurrences(of: "{g}", with: group) }, group: group)
            #expect(result.status == 77, "stderr: \(result.stderr)")
            #expect(result.stderr.contains("permission denied"), "\(result.stderr)")
            #expect(result.stderr.contains("Join the group that owns it, or run as its owner"), "\(result.stderr)")
            #expect(try SharedStore(groupDirectory: group).lastTransactionID == before)
        }
    }

    @Test("a member of the app group with read and search rights on its directory, and read-write on the store's files, may read the store",
          .enabled(if: getuid() == 0 && FileManager.default.isExecutableFile(atPath: "/usr/bin/setpriv"),
                   "needs root, to give the directory and files to another group, and setpriv (util-linux)"))
    func readOnlyDirectoryMember() async throws {
        try await withTemporaryGroup { group in
            let tracker = try Tracker(configuration: .init(groupDirectory: group))
            try await tracker.track("Ordinary")
            // The group's files as an operator may set them up: the directory r-x for the group, the
            // store's two files rw (LMDB opens both for writing), nothing to create.
            let nogroup: gid_t = 65534
            chmod(parentDirectory(of: group), 0o755)
            for path in [group, group + "/" + SharedStore.fileName, group + "/" + SharedStore.fileName + "-lock"] {
                chown(path, 0, nogroup)
            }
            chmod(group, 0o2750)
            for file in [SharedStore.fileName, SharedStore.fileName + "-lock"] { chmod(group + "/" + file, 0o660) }
            let result = try await Self.runAsNobody(["status", "--group", group, "--json"])
            // Writing to the directory is needed only to create a missing file: this member was refused (77).
            #expect(result.status == 0, "stderr: \(result.stderr)")
            #expect(result.stdout.contains("pending_events"), "\(result.stdout)")
        }
    }

    @Test("dead-letters on an outbox its user may see but not write is refused as permission denied (exit 77), not as unreadable (74)",
          .enabled(if: getuid() == 0 && FileManager.default.isExecutableFile(atPath: "/usr/bin/setpriv"),
                   "needs root, to run as another user, and setpriv (util-linux)"))
    func outboxNotWritable() async throws {
        try await withTemporaryGroup { group in
            // The agent's outbox as root made it (mode 0644 under umask 022), in a directory others may search.
            let directory = parentDirectory(of: group)
            chmod(directory, 0o755)
            let path = directory + "/outbox.sqlite"
            _ = try Outbox(path: path)
            chmod(path, 0o644)
            let result = try await Self.runAsNobody(["dead-letters", "--outbox", path])
            #expect(result.status == 77, "stderr: \(result.stderr)")
            #expect(result.stderr.contains("permission denied") && result.stderr.contains(path), "\(result.stderr)")
            #expect(result.stderr.contains("\(path) belongs to user root and group root, mode 644"), "\(result.stderr)")
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

    @Test("a world-writable group directory is refused with exit code 77, by the CLI and by the agent (no restart: its units prevent it)")
    func unsafeDirectory() async throws {
        try await withTemporaryGroup { group in
            try FileManager.default.createDirectory(atPath: group, withIntermediateDirectories: true)
            chmod(group, 0o777)
            let result = try await ChildProcess.run("tributary", ["track", "--group", group, "X"])
            #expect(result.status == 77)
            #expect(result.stderr.contains("chmod o-w"))
            let agent = try await ChildProcess.run(
                "tributary-agent", ["--group", group, "--server", "http://127.0.0.1:9/sa", "--outbox", group + "-outbox.sqlite", "--once"])
            #expect(agent.status == 77, "\(agent.stderr)")
            #expect(agent.stderr.contains("chmod o-w"), "\(agent.stderr)")
        }
    }
}
