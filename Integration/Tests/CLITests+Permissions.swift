import Foundation
import Testing
import Tributary
import TributaryStore
import TributaryTestSupport

@testable import TributaryAgentCore

// Modes and permissions: world-writable groups refused, owners' modes kept, users refused (exit 77) or let in.
extension CLITests {
    @Test("opening a store leaves the modes of its existing files as their owner set them")
    func storeModesKept() async throws {
        try await withTemporaryGroup { group in
            try await Self.trackOne(group)
            let file = group + "/" + SharedStore.fileName
            chmod(file, 0o640)
            chmod(file + "-lock", 0o640)
            #expect(try await ChildProcess.run("tributary", ["status", "--group", group]).status == 0)
            #expect(try await ChildProcess.run("tributary", ["track", "--create", "Y", "--group", group]).status == 0)
            for path in [file, file + "-lock"] {
                var st = stat()
                #expect(stat(path, &st) == 0 && st.st_mode & 0o777 == 0o640, "\(path): \(String(st.st_mode & 0o777, radix: 8))")
            }
        }
    }

    @Test("every tool refuses a world-writable group with exit 77, and leaves the directory's mode as it was", arguments: [
        ("tributary", ["status", "--group", "{g}"]),
        ("tributary", ["track", "--create", "Refused", "--group", "{g}"]),
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

    @Test("dead-letters lists an outbox its user may only read (an operator's look at the agent's outbox): read-only, nothing written",
          .enabled(if: getuid() == 0 && FileManager.default.isExecutableFile(atPath: "/usr/bin/setpriv"),
                   "needs root, to give the outbox to another user read-only, and setpriv"))
    func deadLettersListReadOnly() async throws {
        let top = "/var/tmp/tributary-readonly-\(UUID().uuidString.prefix(8))"
        defer { try? FileManager.default.removeItem(atPath: top) }
        try FileManager.default.createDirectory(atPath: top, withIntermediateDirectories: true)
        let path = top + "/outbox.sqlite"
        do { _ = try Self.outboxWithDeadLetters(path, count: 3) }  // closed again: no -wal, no -shm
        chmod(top, 0o755)
        chmod(path, 0o644)
        let before = try Data(contentsOf: URL(fileURLWithPath: path))
        // It was opened for reading and writing (and refused with 77 for want of the right to write).
        let listed = try await Self.runAsNobody(["dead-letters", "--outbox", path])
        #expect(listed.status == 0, "stderr: \(listed.stderr)")
        #expect(listed.stdout.split(separator: "\n").count == 3, "\(listed.stdout)")
        #expect(try Data(contentsOf: URL(fileURLWithPath: path)) == before)
        // Replaying changes the outbox: that still needs the right to write it.
        let replay = try await Self.runAsNobody(["dead-letters", "--outbox", path, "--replay"])
        #expect(replay.status == 77, "stderr: \(replay.stderr)")
    }

    @Test("a user who may not use the group directory is told so (exit 77), not that there is no store",
          .enabled(if: getuid() != 0 || FileManager.default.isExecutableFile(atPath: "/usr/bin/setpriv"),
                   "as root only another user meets EACCES, and setpriv (util-linux) is not installed"),
          arguments: [
            ["status", "--group", "{g}"],
            ["track", "--create", "--group", "{g}", "X"],
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

    @Test("dead-letters --discard on an outbox its user may see but not write is refused as permission denied (exit 77), not as unreadable (74)",
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
            // (Listing it is allowed: it only reads. deadLettersListReadOnly.)
            let result = try await Self.runAsNobody(["dead-letters", "--outbox", path, "--discard"])
            #expect(result.status == 77, "stderr: \(result.stderr)")
            #expect(result.stderr.contains("permission denied") && result.stderr.contains(path), "\(result.stderr)")
            #expect(result.stderr.contains("\(path) belongs to user root and group root, mode 644"), "\(result.stderr)")
        }
    }

    @Test("a world-writable group directory is refused with exit code 77, by the CLI and by the agent (no restart: its units prevent it)")
    func unsafeDirectory() async throws {
        try await withTemporaryGroup { group in
            try FileManager.default.createDirectory(atPath: group, withIntermediateDirectories: true)
            chmod(group, 0o777)
            let result = try await ChildProcess.run("tributary", ["track", "--create", "--group", group, "X"])
            #expect(result.status == 77)
            #expect(result.stderr.contains("chmod o-w"))
            let agent = try await ChildProcess.run(
                "tributary-agent", ["--group", group, "--server", "http://127.0.0.1:9/sa", "--outbox", group + "-outbox.sqlite", "--once"])
            #expect(agent.status == 77, "\(agent.stderr)")
            #expect(agent.stderr.contains("chmod o-w"), "\(agent.stderr)")
        }
    }
}
