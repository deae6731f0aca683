import Foundation
import Testing
import Tributary
import TributaryCollector
import TributaryTestSupport

@testable import TributaryAgentCore

// tributary dead-letters: listing, replaying and discarding what the collector refused.
extension CLITests {
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
}
