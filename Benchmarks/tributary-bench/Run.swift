import ArgumentParser
import Foundation

/// The driver: runs every configuration with Swift and with C producer processes, repeats, and
/// prints the medians.
struct Run: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Run every configuration, Swift then C, and print a table of medians (the default command).",
        discussion: """
            Repetitions are interleaved (rep 1 of every configuration, then rep 2, ...) so that a slow \
            phase of a shared machine hits every configuration alike. In each configuration the C run \
            comes right after the Swift run and copies its record size and (group commit) its mean \
            batch size. Every run uses a fresh store under --work-dir, which must be on a disk: fsync \
            on tmpfs costs nothing and would measure nothing.
            """
    )

    @Option(help: ArgumentHelp("Directory holding tributary-bench and lmdb-baseline (default: this executable's).",
                               valueName: "dir"))
    var bin: String?

    @Option(help: "Repetitions of every configuration; the table shows medians.")
    var reps: Int = 5

    @Option(parsing: .upToNextOption, help: "Producer process counts.")
    var processes: [Int] = [1, 2, 4]

    @Option(
        parsing: .upToNextOption,
        help: """
            Commit modes: single (one transaction per track), group (group commit, each caller keeping \
            --window events in flight), awaited (group commit, each caller awaiting every track).
            """)
    var modes: [Mode] = Mode.allCases

    @Option(name: .customLong("single-events"), help: "Events per process with single track.")
    var singleEvents: Int = 2_000

    @Option(name: .customLong("group-events"), help: "Events per process with group commit.")
    var groupEvents: Int = 20_000

    @Option(help: "Concurrent async track() callers per Swift process with group commit.")
    var callers: Int = 8

    @Option(help: "Events each caller keeps in flight (enqueue) in the group mode.")
    var window: Int = 128

    @Option(name: .customLong("c-batch"), help: "C events per transaction with group commit (default: the Swift run's mean batch).")
    var cBatch: Int?

    @Option(name: .customLong("map-mib"), help: "LMDB map size for every run, in MiB (no map growth during runs).")
    var mapMiB: Int = 1024

    @Option(name: .customLong("work-dir"), help: ArgumentHelp("Where run stores are created (must not be tmpfs).", valueName: "dir"))
    var workDirectory: String = "/var/tmp"

    @Flag(help: "Do not print one progress line per run on stderr.")
    var quiet = false

    func validate() throws {
        guard reps >= 1 else { throw ValidationError("--reps must be at least 1.") }
        guard !processes.isEmpty, processes.allSatisfy({ (1...64).contains($0) }) else {
            throw ValidationError("--processes takes counts from 1 to 64.")
        }
        guard !modes.isEmpty else { throw ValidationError("--modes needs at least one of single, group.") }
        guard singleEvents >= 1, groupEvents >= 1 else { throw ValidationError("Event counts must be at least 1.") }
        guard callers >= 1 else { throw ValidationError("--callers must be at least 1.") }
        guard window >= 1 else { throw ValidationError("--window must be at least 1.") }
        guard (cBatch ?? 1) >= 1 else { throw ValidationError("--c-batch must be at least 1.") }
        // A record is under 1 KiB; twice that covers B-tree pages and copy-on-write churn.
        let largestRun = (processes.max() ?? 1) * max(singleEvents, groupEvents) * 2048
        guard mapMiB << 20 >= largestRun else {
            throw ValidationError("--map-mib \(mapMiB) is too small for the largest run; use at least \(largestRun >> 20 + 1).")
        }
        let fileSystem = try FileSystemInfo(path: workDirectory)
        guard !fileSystem.isMemoryBacked else {
            throw ValidationError("--work-dir \(workDirectory) is on \(fileSystem.name); choose a directory on a disk.")
        }
    }

    func run() throws {
        writeLine(try measure().report.text)
    }

    /// Every repetition of every configuration; the table of medians and the samples behind it.
    func measure() throws -> (report: Report, samples: [Configuration: [Sample]]) {
        let binDirectory = try bin ?? ownDirectory()
        for name in ["tributary-bench", "lmdb-baseline"] where !FileManager.default.isExecutableFile(atPath: binDirectory + "/" + name) {
            throw ValidationError("\(binDirectory)/\(name) is missing; build it first (make bench does).")
        }
        let scratch = try makeScratchDirectory(in: workDirectory)
        defer { try? FileManager.default.removeItem(atPath: scratch) }
        let runner = Runner(binDirectory: binDirectory, scratch: scratch, mapSize: mapMiB << 20)

        let configurations = modes.flatMap { mode in processes.map { Configuration(mode: mode, processes: $0) } }
        var samples: [Configuration: [Sample]] = [:]
        do {
            for rep in 1...reps {
                for configuration in configurations {
                    let events = configuration.mode == .single ? singleEvents : groupEvents
                    var spec = RunSpec(
                        language: .swift, mode: configuration.mode, processes: configuration.processes,
                        eventsPerProcess: events, callers: callers, window: window, batch: 1, recordSize: 0)
                    let swift = try runner.run(spec)
                    progress(rep, configuration, spec, swift)

                    spec.language = .c
                    spec.recordSize = Int(swift.meanRecordSize.rounded())
                    spec.batch = configuration.mode == .single ? 1 : cBatch ?? max(1, Int(swift.meanBatch.rounded()))
                    let c = try runner.run(spec)
                    progress(rep, configuration, spec, c)
                    samples[configuration, default: []].append(Sample(swift: swift, c: c, cBatch: spec.batch))
                }
            }
        } catch {
            // A failed process, a store that does not hold what it should, or a store error.
            writeError("tributary-bench: run failed, aborting: \(error)")
            throw ExitCode.failure
        }
        let report = Report(run: self, configurations: configurations, samples: samples, workDirectory: workDirectory)
        return (report, samples)
    }

    private func progress(_ rep: Int, _ configuration: Configuration, _ spec: RunSpec, _ result: RunResult) {
        guard !quiet else { return }
        writeError(
            "rep \(rep)/\(reps)  \(configuration.label.padding(toLength: 9, withPad: " ", startingAt: 0)) "
                + "\(spec.language.rawValue.padding(toLength: 5, withPad: " ", startingAt: 0)) "
                + "\(Report.grouped(result.eventsPerSecond)) ev/s  p50 \(Report.grouped(result.p50Micros)) µs  "
                + "p99 \(Report.grouped(result.p99Micros)) µs  max \(Report.grouped(result.maxMicros)) µs  "
                + "\(result.transactions) txns "
                + "(\(Report.decimal(result.meanBatch, 1)) ev/txn, \(Int(result.meanRecordSize.rounded())) B/record), "
                + "processes done after \(result.finishSeconds.map { Report.decimal($0, 2) }.joined(separator: "/")) s")
    }
}

/// One row of the table: a commit mode and a process count.
struct Configuration: Hashable, Sendable {
    var mode: Mode
    var processes: Int
    var label: String { "\(mode.rawValue) x\(processes)" }
}

/// One repetition of one configuration: the Swift run and the C run right after it.
struct Sample: Sendable {
    var swift: RunResult
    var c: RunResult
    var cBatch: Int
}

extension Mode: ExpressibleByArgument {}

/// The file system holding a path: the mount with the longest matching mount point in /proc/self/mounts.
struct FileSystemInfo {
    /// The file system type, as the kernel names it (`ext4`, `xfs`, `tmpfs`, ...).
    var name: String
    /// Whether files there live in memory, where fsync costs nothing.
    var isMemoryBacked: Bool { ["tmpfs", "ramfs"].contains(name) }

    init(path: String) throws {
        guard let resolved = realpath(path, nil) else {
            throw ValidationError("\(path): \(String(cString: strerror(errno))).")
        }
        let canonical = String(cString: resolved)
        free(resolved)
        let mounts = (try? String(contentsOfFile: "/proc/self/mounts", encoding: .utf8)) ?? ""
        var best = (mountPoint: "", type: "unknown")
        for line in mounts.split(separator: "\n") {
            let fields = line.split(separator: " ")
            guard fields.count >= 3 else { continue }
            let mountPoint = fields[1].replacingOccurrences(of: "\\040", with: " ")
            let covers = mountPoint == "/" || canonical == mountPoint || canonical.hasPrefix(mountPoint + "/")
            // Later lines win ties: they are mounted over the earlier ones.
            if covers && mountPoint.count >= best.mountPoint.count { best = (mountPoint, String(fields[2])) }
        }
        name = best.type
    }
}
