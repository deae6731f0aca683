import CLMDB
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// Whether a group's store can be trusted, judged by a walk of all its pages in a child process
/// (``PageWalk``), and what is done with one that cannot: it is moved aside whole, for forensics, and
/// a new store is made in its place.
///
/// LMDB keeps no page checksums. A tree page of garbage crashes the process that walks into it
/// (SIGSEGV, SIGBUS), and a daemon that crashes so at every start strands every event behind the bad
/// page: so the agent, before it opens the store, has a child walk it first. A crash of the child is a
/// verdict like any other.
public enum StoreCheck {
    /// The argument that makes an executable of this package walk a store and exit with the outcome
    /// (``walkerMain(_:)``); `tributary` and `tributary-agent` take it.
    public static let walkArgument = "--tributary-walk-store"

    /// The name of a directory a damaged store is moved into, inside the group directory, before its time
    /// stamp: `damaged-store-20261128T114500Z`.
    public static let setAsidePrefix = "damaged-store-"
    /// The file in such a directory that says why the store was moved there.
    public static let reasonFile = "REASON"

    /// What a check found.
    public enum Verdict: Sendable, Equatable {
        /// Every page was read.
        case intact
        /// The store is damaged: why (what LMDB said, or the signal that ended the walk).
        case damaged(String)
        /// No verdict: the walk could not be made (it said why).
        case notChecked(String)
    }

    /// If `arguments` (the command line without the program) ask for a walk, walks each store named, in
    /// turn, writing a line for each to stdout (its ``PageWalk/Outcome`` code, a tab, what was found), and
    /// exits with the last one's outcome; otherwise returns. Call it first in `main`: the walk must not run
    /// in a process that has anything else to lose.
    public static func walkerMain(_ arguments: [String]) {
        guard arguments.count >= 2, arguments[0] == walkArgument else { return }
        StandardDescriptors.takeClosed()
        var last = PageWalk.Outcome.intact
        for path in arguments.dropFirst() {
            let (outcome, reason) = PageWalk.walk(path: path)
            let line = verdictLine(outcome, reason)
            // Unbuffered: a crash at the next path keeps it.
            _ = line.withUnsafeBufferPointer { write(1, $0.baseAddress, $0.count) }
            last = outcome
        }
        exit(last.rawValue)
    }

    /// Walks the store of `groupDirectory` in a child process started as `walker` (an executable that calls
    /// ``walkerMain(_:)``, and the arguments before the walk's own), waiting at most `limit`; a store
    /// that is not there is intact. A walk that crashes, or does not end in time, is damage.
    public static func check(groupDirectory: String, walker: [String], limit: Duration = .seconds(120)) -> Verdict {
        check(groupDirectories: [groupDirectory], walker: walker, limit: limit)[0]
    }

    /// ``check(groupDirectory:walker:limit:)`` for several stores, walked one after another by as few
    /// children as can do it: a child that crashes (or takes over `limit` for one store) ends that
    /// store's walk, and a new child goes on with the next.
    public static func check(groupDirectories: [String], walker: [String], limit: Duration = .seconds(120)) -> [Verdict] {
        var verdicts: [Verdict?] = groupDirectories.map { directory in
            access(directory + "/" + SharedStore.fileName, F_OK) == 0 ? nil : .intact
        }
        while let first = verdicts.firstIndex(where: { $0 == nil }) {
            let pending = verdicts.indices.filter { $0 >= first && verdicts[$0] == nil }
            let paths = pending.map { groupDirectories[$0] + "/" + SharedStore.fileName }
            let found = walk(paths, walker: walker, limit: limit)
            for (index, verdict) in zip(pending, found) { verdicts[index] = verdict }
        }
        return verdicts.map { $0! }
    }

    /// Walks `paths` in one child: a verdict for each store it got through, and for the one it ended in
    /// (crashed, timed out, or could not start); at least one.
    private static func walk(_ paths: [String], walker: [String], limit: Duration) -> [Verdict] {
        guard let executable = walker.first else { return paths.map { _ in .notChecked("no walker given") } }
        guard let (pid, fd) = spawn(executable, Array(walker.dropFirst()) + [walkArgument] + paths) else {
            return paths.map { _ in .notChecked("the walker \(executable) could not be started: \(String(cString: strerror(errno)))") }
        }
        defer { close(fd) }
        var verdicts: [Verdict] = []
        var pending: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        var deadline = ContinuousClock.now.advanced(by: limit)
        var status: Int32 = 0
        var exited = false
        while true {
            var poller = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            // Once the child has exited, what it wrote is read to the end, without waiting.
            if poll(&poller, 1, exited ? 0 : 10) > 0, case let count = read(fd, &buffer, buffer.count), count > 0 {
                pending += buffer[0..<count]
                while let newline = pending.firstIndex(of: UInt8(ascii: "\n")) {
                    verdicts.append(verdict(line: String(decoding: pending[..<newline], as: UTF8.self)))
                    pending.removeSubrange(...newline)
                    deadline = ContinuousClock.now.advanced(by: limit)
                }
                continue
            }
            if exited { break }
            if waitpid(pid, &status, WNOHANG) == pid {
                exited = true
            } else if ContinuousClock.now >= deadline {
                kill(pid, SIGKILL)
                waitpid(pid, &status, 0)
                return verdicts + [.damaged("the walk of its pages did not end within \(limit) (a loop in its tree?)")]
            }
        }
        guard verdicts.count < paths.count else { return verdicts }
        // WIFSIGNALED and WTERMSIG (macros Swift cannot see): the low 7 bits, not 0 nor 0x7f.
        let signal = status & 0x7f
        if signal != 0 && signal != 0x7f {
            let name = strsignal(signal).map { String(cString: $0) } ?? "signal \(signal)"
            return verdicts + [.damaged("the walk of its pages crashed inside liblmdb (signal \(signal), \(name))")]
        }
        return verdicts + paths.dropFirst(verdicts.count).map { _ in
            .notChecked("the walker exited \((status >> 8) & 0xff) without a verdict")
        }
    }

    /// Starts `executable` with `arguments`, its stdout the write end of a new pipe and its stdin and
    /// stderr `/dev/null`; the child's pid and the pipe's read end, or nil (`errno` says why).
    private static func spawn(_ executable: String, _ arguments: [String]) -> (pid: pid_t, fd: Int32)? {
        var fds: [Int32] = [-1, -1]
        guard tributary_pipe_cloexec(&fds) == 0 else { return nil }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_adddup2(&actions, fds[1], 1)
        posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0)
        let argv = ([executable] + arguments).map { strdup($0) } + [nil]
        defer { for pointer in argv { free(pointer) } }
        // The walker is expected to crash on a damaged page: without Swift's backtracer, which would
        // otherwise start for each crash (about 100 MB each) and outlive a walker killed for looping.
        var inherited: [String] = []
        var entry = environ
        while let variable = entry.pointee {
            let text = String(cString: variable)
            if !text.hasPrefix("SWIFT_BACKTRACE=") { inherited.append(text) }
            entry += 1
        }
        let envp = (inherited + ["SWIFT_BACKTRACE=enable=no"]).map { strdup($0) } + [nil]
        defer { for pointer in envp { free(pointer) } }
        var pid: pid_t = 0
        let rc = posix_spawn(&pid, executable, &actions, nil, argv, envp)
        close(fds[1])
        guard rc == 0 else {
            close(fds[0])
            errno = rc
            return nil
        }
        return (pid, fds[0])
    }

    /// The walker's line for one store: its outcome's code, a tab, the reason, a newline. A control
    /// character in the reason (a table name read from a damaged page can hold a NUL, a tab or a newline)
    /// is written escaped (`\u{0}`), so it can neither end the line early nor split it: the parent
    /// reads one verdict per line, in the order of the paths.
    static func verdictLine(_ outcome: PageWalk.Outcome, _ reason: String) -> [UInt8] {
        let shown = reason.unicodeScalars.map { scalar in
            scalar.properties.generalCategory == .control ? "\\u{\(String(scalar.value, radix: 16))}" : String(scalar)
        }.joined()
        return Array("\(outcome.rawValue)\t\(shown)\n".utf8)
    }

    /// The verdict a walker's line (``verdictLine(_:_:)``, without its newline) gives.
    static func verdict(line: String) -> Verdict {
        let parts = line.split(separator: "\t", maxSplits: 1, omittingEmptySubsequences: false)
        let reason = parts.count > 1 ? String(parts[1]) : ""
        switch parts.first.flatMap({ Int32($0) }).flatMap(PageWalk.Outcome.init(rawValue:)) {
        case .intact: return .intact
        case .damaged: return .damaged(reason)
        case .notWalked, nil: return .notChecked(reason.isEmpty ? "the walker said \(line)" : reason)
        }
    }

    /// Moves the store of `groupDirectory` (its data and lock files) into a new directory
    /// `damaged-store-<UTC time>` there, whole, with a `REASON` file saying `reason`; returns that
    /// directory. Producers and readers that have the store open see it replaced
    /// (``StoreError/Code/storeReplaced``) and open the new one. Only the group's agent calls it, holding
    /// the group's agent lock: no other process moves or creates a store meanwhile.
    public static func setAside(groupDirectory: String, reason: String) throws(StoreError) -> String {
        var now = time(nil)
        var parts = tm()
        gmtime_r(&now, &parts)
        var stamp = [CChar](repeating: 0, count: 32)
        strftime(&stamp, stamp.count, "%Y%m%dT%H%M%SZ", &parts)
        let time = String(decoding: stamp.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        var directory = groupDirectory + "/" + setAsidePrefix + time
        var suffix = 1
        while mkdir(directory, 0o2770) != 0 {
            guard errno == EEXIST, suffix < 100 else {
                throw StoreError(
                    .lmdb, "Could not make \(directory) to move the damaged store into: \(String(cString: strerror(errno))).",
                    lmdbCode: errno)
            }
            suffix += 1
            directory = groupDirectory + "/" + setAsidePrefix + time + "-\(suffix)"
        }
        let note = "\(reason)\nMoved here from \(groupDirectory) by tributary-agent (pid \(getpid())) at \(time).\n"
        _ = FileManager.default.createFile(atPath: directory + "/" + reasonFile, contents: Data(note.utf8), attributes: [.posixPermissions: 0o660])
        for name in [SharedStore.fileName, SharedStore.fileName + "-lock"] {
            let from = groupDirectory + "/" + name
            guard rename(from, directory + "/" + name) == 0 || errno == ENOENT else {
                throw StoreError(
                    .lmdb, "Could not move \(from) into \(directory): \(String(cString: strerror(errno))).", lmdbCode: errno)
            }
        }
        try GroupDirectory.sync(directory)
        try GroupDirectory.sync(groupDirectory)
        return directory
    }

    /// The damaged stores set aside in `groupDirectory`, oldest first, each with its reason's first line.
    public static func setAsideStores(groupDirectory: String) -> [(directory: String, reason: String)] {
        let names = (try? FileManager.default.contentsOfDirectory(atPath: groupDirectory)) ?? []
        return names.filter { $0.hasPrefix(setAsidePrefix) }.sorted().map { name in
            let directory = groupDirectory + "/" + name
            let text = (try? String(contentsOfFile: directory + "/" + reasonFile, encoding: .utf8)) ?? ""
            return (directory, text.split(separator: "\n").first.map(String.init) ?? "(no reason recorded)")
        }
    }
}
