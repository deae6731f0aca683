import Foundation
import Testing
import TributaryCollector
import TributaryStore
import TributaryTestSupport

@testable import TributaryAgentCore

// Which group and outbox a tributary-agent takes: relative paths, an outbox or a group another agent holds.
extension CLITests {
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

    @Test("an outbox with a hard link is refused (exit 78) by either name, and the agent of another group no longer takes it beside the first; with one name again it is used")
    func hardLinkedOutboxRefused() async throws {
        try await withTemporaryGroup { group in
            let other = group + "-other"
            let outbox = group + "-state/outbox.sqlite"
            let link = group + "-other-outbox.sqlite"
            defer { for path in [other, link] { try? FileManager.default.removeItem(atPath: path) } }
            let server = ["--server", "http://127.0.0.1:9/sa", "--log-level", "warning"]
            let made = try await ChildProcess.run(
                "tributary-agent", ["--group", group, "--once", "--deadline", "1", "--outbox", outbox] + server)
            #expect(made.status == 0, "stderr: \(made.stderr)")
            try FileManager.default.linkItem(atPath: outbox, toPath: link)
            // Locked by path, each name had a lock of its own: two agents drained into one outbox.
            for (groupDirectory, name) in [(group, outbox), (other, link)] {
                let refused = try await ChildProcess.run(
                    "tributary-agent", ["--group", groupDirectory, "--once", "--deadline", "1", "--outbox", name] + server)
                #expect(refused.status == 78, "stderr: \(refused.stderr)")
                #expect(refused.stderr.contains("has 2 names (hard links)"), "\(refused.stderr)")
            }
            #expect(!FileManager.default.fileExists(atPath: link + "-wal"), "refused before SQLite opened it by the other name")
            try FileManager.default.removeItem(atPath: link)
            let alone = try await ChildProcess.run(
                "tributary-agent", ["--group", group, "--once", "--deadline", "1", "--outbox", outbox] + server)
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
                    "tributary", ["track", "--create", "--group", relative, "Relative\(index)"], directory: directory)
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
                let track = try await ChildProcess.run("tributary", ["track", "--create", "--group", group, "Event\(index)"])
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
}
