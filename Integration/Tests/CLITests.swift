import Foundation
import Testing
import TributaryTestSupport

/// The command-line tools run as real processes. The tests are in `CLITests+*.swift`, a file per concern; the
/// helpers several of those files use are here.
@Suite("tributary CLI")
struct CLITests {
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

    /// Stores one event `X` in `group` (creating the group and its store) with `tributary track`.
    static func trackOne(_ group: String) async throws {
        let track = try await ChildProcess.run("tributary", ["track", "--create", "X", "--group", group])
        #expect(track.status == 0, "\(track.stderr)")
    }
}
