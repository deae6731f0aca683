import Foundation
import Testing
import TributaryTestSupport

@testable import TributaryStore

// The group directory: its mode and set-group-ID bit, and what a permission refusal says.
extension SharedStoreTests {
    @Test("the group directory is created owner/group-only and set-group-ID; a world-writable one is refused")
    func directoryPermissions() throws {
        try withTemporaryGroup { group in
            _ = try SharedStore(groupDirectory: group + "/nested")
            var st = stat()
            #expect(stat(group + "/nested", &st) == 0)
            // Set-group-ID: what the agent (another user) creates there gets the app group, not its own.
            #expect(st.st_mode & 0o7777 == 0o2770, "mode \(String(st.st_mode & 0o7777, radix: 8))")

            let open = group + "/open"
            try FileManager.default.createDirectory(atPath: open, withIntermediateDirectories: true)
            chmod(open, 0o777)
            let error = #expect(throws: StoreError.self) { try SharedStore(groupDirectory: open) }
            #expect(error?.code == .insecureDirectory)
            #expect(error?.message.contains("writable by every user") == true)
            #expect(!FileManager.default.fileExists(atPath: open + "/" + SharedStore.fileName))
            // Refused, and left as it was: no set-group-ID bit added.
            #expect(stat(open, &st) == 0 && st.st_mode & 0o7777 == 0o777, "mode \(String(st.st_mode & 0o7777, radix: 8))")
        }
    }

    @Test("an existing group directory without the set-group-ID bit gets it when a store is opened there, and only then")
    func setGroupIDAdded() throws {
        try withTemporaryGroup { group in
            try FileManager.default.createDirectory(atPath: group, withIntermediateDirectories: true)
            chmod(group, 0o750)
            func mode() -> mode_t {
                var st = stat()
                return stat(group, &st) == 0 ? st.st_mode & 0o7777 : 0
            }
            // Looking for a store that is not there (tributary status) changes nothing.
            var lookOnly = SharedStore.Options()
            lookOnly.create = false
            #expect(throws: StoreError.self) { try SharedStore(groupDirectory: group, options: lookOnly) }
            #expect(mode() == 0o750, "mode \(String(mode(), radix: 8))")
            _ = try SharedStore(groupDirectory: group)
            #expect(mode() == 0o2750, "mode \(String(mode(), radix: 8))")
        }
    }

    @Test("the directory a path is in, as the permission messages name it", arguments: [
        ("/var/lib/app/group", "/var/lib/app"), ("/group", "/"), ("group", "."), ("app/group", "app"),
    ])
    func parentDirectories(path: String, parent: String) {
        #expect(parentDirectory(of: path) == parent)
    }

    @Test("a permission refusal tells the owner that its own mode refuses it, and anyone else to join the group")
    func permissionAdvice() throws {
        try withTemporaryGroup { group in
            try FileManager.default.createDirectory(atPath: group, withIntermediateDirectories: true)
            let own = StoreError.permissionDenied("the store \(group)/tributary.mdb", directory: group)
            #expect(own.message.contains("Its mode refuses its own owner"), "\(own.message)")
            #expect(!own.message.contains("Join the group"), "\(own.message)")
            // Owned by another user (as root, chown; as anyone else, a directory of root's).
            let other = getuid() == 0 ? group : "/"
            if getuid() == 0 { chown(group, 65534, 65534) }
            let foreign = StoreError.permissionDenied("the group directory \(other)", directory: other)
            #expect(foreign.message.contains("Join the group that owns it"), "\(foreign.message)")
        }
    }
}
