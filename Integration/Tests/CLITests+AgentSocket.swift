import Foundation
import Testing
import TributaryStore
import TributaryTestSupport

// The agent's flush socket (agent.sock): its path's length, a path taken, flushes beside a stopped agent.
extension CLITests {
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
}
