import Foundation
import Testing
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
        (["inspect", "--group", "{g}", "--limit", "0"], 64, "--limit"),
    ])
    func exitCodes(arguments: [String], code: Int32, message: String) async throws {
        try await withTemporaryGroup { group in
            let result = try await ChildProcess.run("tributary", arguments.map { $0.replacingOccurrences(of: "{g}", with: group) })
            #expect(result.status == code, "stderr: \(result.stderr)")
            #expect(result.stderr.contains(message))
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
