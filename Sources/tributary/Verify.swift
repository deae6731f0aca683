import ArgumentParser
import Foundation
import TributaryErrors
import TributaryStore

struct Verify: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Walk every page of the group's store in a child process; say whether it is intact.",
        discussion: """
            LMDB keeps no page checksums: a page of garbage crashes the process that reads it. The walk (every \
            table, key and value, and the free list) runs in a child process, so a crash is a verdict, not this \
            command's end. Exit codes: 0 intact; 65 damaged (what was found is said; the agent moves such a \
            store aside at its start and makes a new one); 66 no store; 74 the walk could not be made. Nothing \
            is written.
            """)

    @OptionGroup var options: GroupOption

    func run() throws {
        try reportingErrors { try SharedStore.checkExists(groupDirectory: options.group) }
        let walker = resolvedPath("/proc/self/exe") ?? CommandLine.arguments[0]
        switch StoreCheck.check(groupDirectory: options.group, walker: [walker]) {
        case .intact:
            say("intact: every page of \(options.group)/\(SharedStore.fileName) was read")
        case .damaged(let reason):
            warn("DAMAGED: \(options.group)/\(SharedStore.fileName): \(reason)")
            throw ExitCode(ExitStatus.dataError.rawValue)
        case .notChecked(let why):
            warn("not checked: \(why)")
            throw ExitCode(ExitStatus.ioError.rawValue)
        }
    }
}
