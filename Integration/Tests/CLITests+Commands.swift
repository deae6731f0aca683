import Foundation
import Testing
import Tributary
import TributaryStore
import TributaryTestSupport

// tributary track, status and inspect: what they print, their exit codes, and what they leave in the store.
extension CLITests {
    @Test("track prints the event id; status and inspect show it")
    func trackStatusInspect() async throws {
        try await withTemporaryGroup { group in
            let track = try await ChildProcess.run(
                "tributary", ["track", "--create", "--group", group, "BuyProduct", "--properties", #"{"price": 9.99}"#,
                              "--producer", "extension", "--producer-id", "share"])
            #expect(track.status == 0, "\(track.stderr)")
            let eventID = track.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
            #expect(eventID.count == 36)
            let status = try await ChildProcess.run("tributary", ["status", "--group", group, "--json"])
            let json = try #require(try JSONSerialization.jsonObject(with: Data(status.stdout.utf8)) as? [String: Any])
            #expect(json["pending_events"] as? Int == 1)
            // The tool's own quota (1 GiB by default) is not the store's: each producer has its own.
            #expect(json["quota"] == nil && json["map_size"] as? Int != nil, "\(status.stdout)")
            let text = try await ChildProcess.run("tributary", ["status", "--group", group])
            #expect(!text.stdout.contains("quota 1024.0 MiB") && text.stdout.contains("up to its own quota"), "\(text.stdout)")
            let inspect = try await ChildProcess.run("tributary", ["inspect", "--group", group, "--json"])
            #expect(inspect.stdout.contains(eventID))
            #expect(inspect.stdout.contains(#""producer":"share""#))
            #expect(inspect.stdout.contains(#""producer_kind":"extension""#))
        }
    }

    @Test("exit codes", arguments: [
        (["track", "--create", "--group", "{g}", "bad name"], Int32(65), "character"),
        (["track", "--create", "--group", "{g}", "X", "--properties", "{\"a\": null}"], 65, "null"),
        (["track", "--create", "--group", "{g}", "X", "--producer", "robot"], 64, "--producer"),
        (["status", "--group", "{g}/missing"], 66, "cannot be used"),
        (["login", "--group", "{g}", ""], 65, "login id"),
        (["login", "--group", "{g}/missing", "user-1"], 66, "missing"),
        (["logout", "--group", "{g}/missing"], 66, "missing"),
        (["track", "--create", "--group", "{g}", "X", "--properties", #"{"p": 1e400}"#], 65, "not finite as a Double"),
        // JSONDecoder takes a trailing comma for JSON; the collector's scanner, which checks typed JSON, does not.
        (["track", "--create", "--group", "{g}", "X", "--properties", #"{"p": 1,}"#], 65, "a ',' before the end of the container at byte 8"),
        (["track", "--create", "--group", "{g}", "X", "--properties", #"{"p": "\ud800"}"#], 65, "a high surrogate escape"),
        (["track", "--create", "--group", "{g}", "X", "--properties", #"{"p": 18446744073709551615}"#], 65, "send it as a string"),
        (["inspect", "--group", "{g}", "--limit", "0"], 64, "--limit"),
        (["dead-letters", "--group", "{g}", "--id", "3"], 64, "--replay"),
        (["dead-letters", "--outbox", "{g}-junk"], 74, "cannot be read"),
        (["dead-letters", "--outbox", "{g}-empty"], 66, "no outbox"),
        (["dead-letters", "--group", "{g}-junk"], 64, "is not a directory"),
        (["dead-letters", "--group", "{g}/missing"], 66, "cannot be used"),
        (["flush", "--group", "{g}/missing"], 66, "cannot be used"),
        (["status", "--group", "{g}-junk"], 64, "is not a directory"),
        (["track", "--create", "--group", "{g}-junk", "X"], 64, "is not a directory"),
        (["flush", "--group", "{g}-junk"], 64, "is not a directory"),
        (["status", "--group", "{g}-junk/group"], 64, "is not a directory"),
        (["track", "--create", "--group", "", "X"], 64, "--group must name"),
        (["status", "--group", ""], 64, "--group must name"),
        (["dead-letters", "--group", ""], 64, "must not be empty"),
        (["dead-letters", "--group", "{g}", "--limit", "0"], 64, "--limit"),
        (["track", "--create", "--group", "{g}", "X", "--app-version", ""], 64, "--app-version"),
        (["track", "--create", "--group", "{g}", "X", "--app-version", "1.0\t2"], 64, "--app-version"),
        (["track", "--create", "--group", "{g}", "X", "--app-version", String(repeating: "9", count: 9000)], 64, "--app-version"),
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

    @Test("track uses only an existing group directory unless --create is given: a mistyped --group makes no group nobody drains")
    func trackNeedsExistingGroup() async throws {
        try await withTemporaryGroup { group in
            let typo = group + "x"
            let refused = try await ChildProcess.run("tributary", ["track", "--group", typo, "Lost"])
            #expect(refused.status == 66, "\(refused.stderr)")
            #expect(refused.stderr.contains("does not exist; nothing was created") && refused.stderr.contains("--create"), "\(refused.stderr)")
            #expect(!FileManager.default.fileExists(atPath: typo), "the refused track created the directory")
            // An existing directory (made by an installer, say) gets its store without --create.
            try FileManager.default.createDirectory(atPath: group, withIntermediateDirectories: false)
            let first = try await ChildProcess.run("tributary", ["track", "--group", group, "First"])
            #expect(first.status == 0, "\(first.stderr)")
            #expect(FileManager.default.fileExists(atPath: group + "/" + SharedStore.fileName))
            // --create makes a missing one.
            let created = try await ChildProcess.run("tributary", ["track", "--create", "--group", typo, "New"])
            #expect(created.status == 0, "\(created.stderr)")
            #expect(FileManager.default.fileExists(atPath: typo + "/" + SharedStore.fileName))
            try? FileManager.default.removeItem(atPath: typo)
        }
    }

    @Test("a refused event leaves the app's published presets as they were; the next extension event carries the version before")
    func refusedEventPublishesNothing() async throws {
        try await withTemporaryGroup { group in
            #expect(try await ChildProcess.run("tributary", ["track", "--create", "--group", group, "Ok", "--app-version", "1.0.0"]).status == 0)
            let refused = try await ChildProcess.run("tributary", ["track", "--create", "--group", group, "bad name", "--app-version", "9.9.9"])
            #expect(refused.status == 65, "\(refused.stderr)")
            let badProperty = try await ChildProcess.run(
                "tributary", ["track", "--create", "--group", group, "Ok", "--app-version", "9.9.9", "--properties", #"{"a": null}"#])
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
            let full = try await ChildProcess(path: "/bin/sh", ["-c", #""$0" track --create --group "$1" Paid > /dev/full"#, tributary, group]).finish()
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

    @Test("a tool started with stdin and stdout closed writes nothing into the store; the events stay readable", arguments: [
        "tributary status --group {g}", "tributary inspect --group {g}", "tributary config show --group {g}",
        "tributary-sim extension --events 2 --group {g}",
    ])
    func closedStandardDescriptors(command: String) async throws {
        try await withTemporaryGroup { group in
            for name in ["A", "B", "C"] {
                #expect(try await ChildProcess.run("tributary", ["track", "--create", name, "--group", group]).status == 0)
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
            let plain = try await ChildProcess.run("tributary", ["track", "--create", "--group", group, "ScriptPing"])
            #expect(plain.status == 0, "\(plain.stderr)")
            #expect(try publishedVersion() == "2.3.4")
            let versioned = try await ChildProcess.run("tributary", ["track", "--create", "--group", group, "ScriptPing", "--app-version", "2.4.0"])
            #expect(versioned.status == 0, "\(versioned.stderr)")
            #expect(try publishedVersion() == "2.4.0")
        }
    }
}
