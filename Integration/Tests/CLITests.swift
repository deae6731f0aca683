import Foundation
import Testing
import Tributary
@testable import TributaryAgentCore
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
        (["track", "--group", "{g}", "X", "--properties", #"{"p": 1e400}"#], 65, "beyond what a Double holds"),
        (["track", "--group", "{g}", "X", "--properties", #"{"p": 18446744073709551615}"#], 65, "send it as a string"),
        (["inspect", "--group", "{g}", "--limit", "0"], 64, "--limit"),
        (["dead-letters", "--group", "{g}", "--id", "3"], 64, "--replay"),
        (["dead-letters", "--outbox", "{g}-junk"], 74, "cannot be read"),
        (["dead-letters", "--outbox", "{g}-empty"], 66, "no outbox"),
        (["flush", "--group", "{g}/missing"], 66, "cannot be used"),
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

    @Test("dead-letters --replay --id refuses an id that names no dead letter, and replays nothing")
    func replayUnknownID() async throws {
        try await withTemporaryGroup { group in
            let path = group + "-outbox.sqlite"
            let outbox = try Outbox(path: path)
            let body = Array(#"{"event_id":"e1"}"#.utf8)
            try outbox.insertDrained([.event(Outbox.Row(
                id: 0, seq: 1, eventID: "e1", producer: "app", producerKind: .app, producerSeq: 1,
                wallMillis: 1, bootNanos: 2, bootID: .current, body: body, batchID: nil))])
            try outbox.deadLetter(try #require(outbox.nextBatch(maxCount: 1, maxBytes: 1 << 20).first), status: 422, reason: "HTTP 422")
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

    @Test("tributary-agent refuses a duration it cannot hold with exit 64, naming the option", arguments: [
        (["--once", "--deadline", "inf"], "--deadline"),
        (["--backoff-cap", "1e300"], "--backoff-cap"),
        (["--max-retry-after=-1"], "--max-retry-after"),
        (["--grace", "nan"], "--grace"),
        (["--stop-timeout", "0"], "--stop-timeout"),
        (["--backoff-base", "5", "--backoff-cap", "2"], "--backoff-cap"),
    ])
    func agentDurations(extra: [String], flag: String) async throws {
        try await withTemporaryGroup { group in
            let result = try await ChildProcess.run(
                "tributary-agent", ["--group", group, "--server", "http://127.0.0.1:9/sa", "--outbox", group + "-outbox.sqlite"] + extra)
            #expect(result.status == 64, "stderr: \(result.stderr)")
            #expect(result.stderr.contains(flag))
        }
    }

    @Test("a second agent, of another group, is refused the outbox the first one uses (exit 78), and gets it once that one stopped")
    func sharedOutboxRefused() async throws {
        try await withTemporaryGroup { group in
            let other = group + "-other"
            defer { try? FileManager.default.removeItem(atPath: other) }
            let outbox = group + "-state/outbox.sqlite"
            let common = ["--server", "http://127.0.0.1:9/sa", "--outbox", outbox, "--log-level", "warning"]
            let first = try ChildProcess("tributary-agent", ["--group", group] + common)
            // The first agent holds the outbox once it has written its status.
            let started = ContinuousClock.now
            while AgentChannel.readStatus(groupDirectory: group) == nil && ContinuousClock.now - started < .seconds(30) {
                try await Task.sleep(for: .milliseconds(20))
            }
            let refused = try await ChildProcess.run("tributary-agent", ["--group", other, "--once"] + common)
            #expect(refused.status == 78, "stderr: \(refused.stderr)")
            #expect(refused.stderr.contains("is in use by another tributary-agent") && refused.stderr.contains(group))
            first.send(SIGTERM)
            #expect(await first.finish().status == 0)
            let alone = try await ChildProcess.run("tributary-agent", ["--group", other, "--once", "--deadline", "1"] + common)
            #expect(alone.status == 0, "stderr: \(alone.stderr)")
        }
    }

    @Test("tributary-collector names the flag a bad setting came from, and exits 64", arguments: [
        (["--fail-rate", "2"], [String: String](), "--fail-rate"),
        (["--latency-ms", "-5"], [:], "--latency-ms"),
        (["--poison", "("], [:], "--poison"),
        (["--port", "0"], ["TRIBUTARY_COLLECTOR_TOKEN": ""], "TRIBUTARY_COLLECTOR_TOKEN"),
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

    @Test("a world-writable group directory is refused with exit code 77")
    func unsafeDirectory() async throws {
        try await withTemporaryGroup { group in
            try FileManager.default.createDirectory(atPath: group, withIntermediateDirectories: true)
            chmod(group, 0o777)
            let result = try await ChildProcess.run("tributary", ["track", "--group", group, "X"])
            #expect(result.status == 77)
            #expect(result.stderr.contains("chmod o-w"))
        }
    }
}
