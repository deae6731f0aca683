import ArgumentParser
import Foundation

/// `tributary-bench agent`: the sync agent's figures. The drain rate of the Swift `Drainer` next to
/// `lmdb-baseline drain` doing the same LMDB → SQLite work; end-to-end events/s of `tributary-agent
/// --once` to the reference collector on loopback; and the agent's peak RSS by backlog size.
struct AgentBench: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "agent",
        abstract:
            "Sync agent: drain rate next to C, end-to-end events/s to the reference collector, peak RSS by backlog.",
        discussion: """
            Every run starts from a byte-for-byte copy of a backlog store filled once per size with real \
            Tracker events, and is verified: the drains leave the store empty and the outbox with every \
            event once (the Swift and C outboxes of a repetition must be identical); the end-to-end runs \
            leave store and outbox empty and the collector with every event once; the backlog runs \
            account for every event (store + outbox + delivered = backlog). See docs/performance.md.
            """
    )

    @Option(
        help: ArgumentHelp(
            "Directory holding tributary-bench, lmdb-baseline, tributary-agent and tributary-collector "
                + "(default: this executable's).",
            valueName: "dir"))
    var bin: String?

    @Option(parsing: .upToNextOption, help: "What to measure: drain, e2e, rss, pipeline.")
    var parts: [AgentPart] = AgentPart.allCases

    @Option(help: "Repetitions of the drain and end-to-end runs; the tables show medians.")
    var reps: Int = 3

    @Option(name: .customLong("drain-events"), help: "Backlog of each drain run.")
    var drainEvents: Int = 100_000

    @Option(help: "Events per drain transaction (the issue's 1,000 per cycle; the agent's default is 2,000).")
    var chunk: Int = 1000

    @Option(
        name: .customLong("e2e-events"),
        help: "Backlog of each end-to-end run (tributary-agent --once to the collector).")
    var e2eEvents: Int = 20_000

    @Option(
        name: .customLong("rss-backlogs"), parsing: .upToNextOption,
        help: "Backlogs of the peak-RSS runs, one run each.")
    var rssBacklogs: [Int] = [100_000, 1_000_000]

    @Option(
        name: .customLong("pipeline-events"),
        help: "Events of each pipeline run (producers -> agent -> collector, all running at once).")
    var pipelineEvents: Int = 1_000_000

    @Option(name: .customLong("pipeline-processes"), help: "Producer processes of the pipeline runs.")
    var pipelineProcesses: Int = 2

    @Option(name: .customLong("pipeline-callers"), help: "Concurrent callers per pipeline producer.")
    var pipelineCallers: Int = 8

    @Option(
        name: .customLong("pipeline-window"),
        help: "Events each pipeline caller keeps in flight with enqueue(); 0: each awaits every track().")
    var pipelineWindow: Int = 128

    @Option(
        name: .customLong("pipeline-agent-options"), parsing: .upToNextOption,
        help: ArgumentHelp(
            "tributary-agent options of the pipeline runs, each given with '=' (--pipeline-agent-options=--drain-ahead=60000"
                + " ...; given after a space, a value starting with -- is taken for an option of this command). Giving any "
                + "replaces the defaults.",
            valueName: "option"))
    var pipelineAgentOptions: [String] = ["--batch-size=2000", "--max-batch-bytes=4194304"]

    @Option(name: .customLong("pipeline-reps"), help: "Repetitions of the pipeline run.")
    var pipelineReps: Int = 3

    @Flag(name: .customLong("skip-1m"), help: "Leave the 1,000,000-event backlog out of the peak-RSS runs.")
    var skip1M = false

    @Option(
        name: .customLong("rss-deadline"),
        help: "--deadline of the peak-RSS runs, in seconds; 0 runs each backlog to the end.")
    var rssDeadline: Double = 30

    @Option(
        name: .customLong("work-dir"),
        help: ArgumentHelp("Where run stores are created (must not be tmpfs).", valueName: "dir"))
    var workDirectory: String = "/var/tmp"

    @Flag(help: "Do not print one progress line per run on stderr.")
    var quiet = false

    /// The agent's default store quota (SharedStore.Options): a backlog must fit under it.
    static let largestBacklog = 1_200_000

    func validate() throws {
        guard reps >= 1 else { throw ValidationError("--reps must be at least 1.") }
        guard !parts.isEmpty else { throw ValidationError("--parts needs at least one of drain, e2e, rss.") }
        guard chunk >= 1 else { throw ValidationError("--chunk must be at least 1.") }
        for (name, count) in [("--drain-events", drainEvents), ("--e2e-events", e2eEvents)]
            + rssBacklogs.map({ ("--rss-backlogs", $0) })
        {
            guard (1...Self.largestBacklog).contains(count) else {
                throw ValidationError(
                    "\(name) takes 1 to \(Self.largestBacklog) events (the agent's store quota is 1 GiB).")
            }
        }
        guard pipelineProcesses >= 1, pipelineCallers >= 1, pipelineReps >= 1, pipelineWindow >= 0,
            (pipelineProcesses...2_000_000).contains(pipelineEvents)
        else {
            throw ValidationError(
                "--pipeline-processes, --pipeline-callers and --pipeline-reps must be at least 1; "
                    + "--pipeline-events at least one per process and at most 2,000,000.")
        }
        guard rssDeadline >= 0 else { throw ValidationError("--rss-deadline must not be negative.") }
        let fileSystem = try FileSystemInfo(path: workDirectory)
        guard !fileSystem.isMemoryBacked else {
            throw ValidationError("--work-dir \(workDirectory) is on \(fileSystem.name); choose a directory on a disk.")
        }
    }

    func run() throws {
        writeLine(try measure().text)
    }

    /// Every part asked for, verified; the tables of medians.
    func measure() throws -> AgentReport {
        let binDirectory = try bin ?? ownDirectory()
        for name in ["tributary-bench", "lmdb-baseline", "tributary-agent", "tributary-collector"]
        where !FileManager.default.isExecutableFile(atPath: binDirectory + "/" + name) {
            throw ValidationError("\(binDirectory)/\(name) is missing; build it first (make bench does).")
        }
        let scratch = try makeScratchDirectory(in: workDirectory)
        defer { try? FileManager.default.removeItem(atPath: scratch) }
        let session = AgentSession(binDirectory: binDirectory, scratch: scratch, chunk: chunk, quiet: quiet)
        var report = AgentReport(workDirectory: workDirectory, reps: reps)
        do {
            session.template = try Backlog.trackerBody(scratch: scratch)
            if parts.contains(.drain) {
                for rep in 1...reps { report.drain.append(try session.drainRep(rep, of: reps, events: drainEvents)) }
                report.drainEvents = drainEvents
                report.chunk = chunk
            }
            if parts.contains(.e2e) {
                // Plain and TLS runs alternate, so that both meet the same machine.
                for rep in 1...reps {
                    report.e2e.append(try session.endToEnd(rep, of: reps, events: e2eEvents))
                    report.e2eTLS.append(try session.endToEnd(rep, of: reps, events: e2eEvents, overTLS: true))
                }
                report.e2eEvents = e2eEvents
            }
            if parts.contains(.rss) {
                for backlog in rssBacklogs where !(skip1M && backlog == 1_000_000) {
                    report.rss.append(
                        try session.backlogRun(events: backlog, deadline: rssDeadline > 0 ? rssDeadline : nil))
                }
                report.rssDeadline = rssDeadline
            }
            if parts.contains(.pipeline) {
                let spec = PipelineSpec(
                    events: pipelineEvents, processes: pipelineProcesses, callers: pipelineCallers,
                    window: pipelineWindow, agentArguments: pipelineAgentOptions)
                for rep in 1...pipelineReps {
                    report.pipeline.append(try session.pipelineRun(rep, of: pipelineReps, spec: spec))
                }
                report.pipelineSpec = spec
            }
            report.recordSize = session.recordSize
        } catch {
            writeError("tributary-bench agent: run failed, aborting: \(error)")
            throw ExitCode.failure
        }
        return report
    }
}

/// The parts of the agent benchmark.
enum AgentPart: String, CaseIterable, ExpressibleByArgument, Sendable {
    case drain, e2e, rss, pipeline
}

/// The directory of the running executable.
func ownDirectory() throws -> String {
    let path = try FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")
    return (path as NSString).deletingLastPathComponent
}

/// A new, private directory (mode 0700) under `parent` for a benchmark's stores.
func makeScratchDirectory(in parent: String) throws -> String {
    var template = Array("\(parent)/tributary-bench.XXXXXX".utf8CString)
    let created = template.withUnsafeMutableBufferPointer { buffer in
        mkdtemp(buffer.baseAddress!).map { String(cString: $0) }
    }
    guard let created else {
        throw BenchFailure("Could not create a scratch directory in \(parent): \(String(cString: strerror(errno))).")
    }
    return created
}

/// One drain process: its report and the memory peaks the driver sampled.
struct DrainResult {
    var report: WorkerReport
    var memory: MemorySampler.Peaks
    var eventsPerSecond: Double { Double(report.events) / (Double(report.endNanos - report.startNanos) / 1e9) }
}

/// One drain repetition: the same backlog drained by Swift, by C with synchronous=FULL, by C with NORMAL.
struct DrainSample {
    var swift: DrainResult
    var cFull: DrainResult
    var cNormal: DrainResult
}

/// One `tributary-agent --once` run against the reference collector.
struct AgentRun {
    var backlog: Int
    var exit: SpawnedProcess.Exit
    var drained: Int
    var delivered: Int
    var collectorCPUSeconds: Double
    var memory: MemorySampler.Peaks
    var eventsPerSecond: Double { Double(delivered) / exit.seconds }
}

/// The runs of one `tributary-bench agent` invocation: backlogs (filled once per size), drains, agent runs.
final class AgentSession {
    let binDirectory: String
    let scratch: String
    let chunk: Int
    let quiet: Bool
    var template: [UInt8] = []
    private(set) var recordSize: Double = 0
    private var backlogs: [Int: String] = [:]
    private var runs = 0
    /// The CA and certificate of the runs over TLS, made on first use.
    private var tls: BenchTLS?

    init(binDirectory: String, scratch: String, chunk: Int, quiet: Bool) {
        self.binDirectory = binDirectory
        self.scratch = scratch
        self.chunk = chunk
        self.quiet = quiet
    }

    /// The backlog store of `events` events, filled on first use.
    private func backlog(_ events: Int) throws -> String {
        if let group = backlogs[events] { return group }
        let group = scratch + "/backlog-\(events)"
        let started = Monotonic.nanos()
        // 1 GiB covers 1.2 M records of ~780 B with LMDB's page overhead, and is the agent's quota.
        recordSize = try Backlog.fill(group: group, events: events, mapSize: 1 << 30, template: template)
        progress(
            "backlog of \(Report.grouped(Double(events))) events filled in "
                + "\(Report.decimal(Double(Monotonic.nanos() - started) / 1e9, 1)) s (not measured)")
        backlogs[events] = group
        return group
    }

    /// A new, empty run directory.
    func newRunDirectory() throws -> String {
        runs += 1
        let directory = scratch + "/run-\(runs)"
        guard mkdir(directory, 0o700) == 0 else { throw BenchFailure("mkdir \(directory) failed.") }
        return directory
    }

    /// A fresh run directory holding a copy of the backlog of `events` events in `group/`.
    func prepareRun(events: Int) throws -> (directory: String, group: String) {
        let source = try backlog(events)
        let directory = try newRunDirectory()
        let group = directory + "/group"
        try Backlog.copy(from: source, to: group)
        return (directory, group)
    }

    // MARK: Drain

    func drainRep(_ rep: Int, of reps: Int, events: Int) throws -> DrainSample {
        var results: [DrainResult] = []
        var outboxes: [String] = []
        var directories: [String] = []
        defer { for directory in directories { try? FileManager.default.removeItem(atPath: directory) } }
        for variant in ["swift", "c-full", "c-normal"] {
            let run = try prepareRun(events: events)
            directories.append(run.directory)
            let outbox = run.directory + "/outbox/outbox.sqlite"
            guard mkdir(run.directory + "/outbox", 0o700) == 0 else { throw BenchFailure("mkdir outbox failed.") }
            let (executable, arguments): (String, [String]) =
                variant == "swift"
                ? (
                    binDirectory + "/tributary-bench",
                    ["drain-worker", "--group", run.group, "--outbox", outbox, "--chunk", "\(chunk)"]
                )
                : (
                    binDirectory + "/lmdb-baseline",
                    [
                        "drain", "--group", run.group, "--outbox", outbox, "--chunk", "\(chunk)",
                        "--synchronous", variant == "c-full" ? "full" : "normal", "--map-size", "\(1 << 30)",
                    ]
                )
            let child = try ProducerProcess(name: "\(variant) drain", executable: executable, arguments: arguments)
            try child.waitUntilReady()
            try child.start()
            let sampler = MemorySampler(pid: child.pid)
            let finished = Result { try child.finish() }
            let memory = sampler.stop()
            let report = try finished.get()
            // Verify: every event moved once, the store is empty, the outbox holds seq 1…N.
            guard report.events == events else {
                throw BenchFailure("\(variant) drain moved \(report.events) events, expected \(events).")
            }
            let left = try Backlog.pendingInStore(group: run.group)
            guard left == 0 else { throw BenchFailure("\(variant) drain left \(left) events in the store.") }
            try OutboxContents(path: outbox).verifyDrained(events, name: "\(variant) outbox")
            results.append(DrainResult(report: report, memory: memory))
            outboxes.append(outbox)
            let seconds = Double(report.endNanos - report.startNanos) / 1e9
            progress(
                "rep \(rep)/\(reps)  drain \(variant.padding(toLength: 8, withPad: " ", startingAt: 0)) "
                    + "\(Report.grouped(Double(events) / seconds)) ev/s  "
                    + "CPU \(Report.decimal(Double(report.cpuNanos ?? 0) / 1e3 / Double(events), 1)) µs/event  "
                    + "peak RSS \(Report.decimal(Double(report.maxRSSKB ?? 0) / 1024, 1)) MiB "
                    + memory.note
            )
        }
        // The C drain did the same work: its outboxes hold exactly the rows the Swift drain wrote.
        try OutboxContents.verifySame(outboxes[0], outboxes[1], events: events)
        try OutboxContents.verifySame(outboxes[0], outboxes[2], events: events)
        return DrainSample(swift: results[0], cFull: results[1], cNormal: results[2])
    }

    // MARK: Agent runs

    func endToEnd(_ rep: Int, of reps: Int, events: Int, overTLS: Bool = false) throws -> AgentRun {
        let run = try agentRun(events: events, deadline: nil, overTLS: overTLS)
        progress(
            "rep \(rep)/\(reps)  e2e\(overTLS ? " over TLS" : "") \(Report.grouped(Double(events))) events: "
                + "\(Report.grouped(run.eventsPerSecond)) ev/s in \(Report.decimal(run.exit.seconds, 1)) s, "
                + "agent CPU \(Report.decimal(run.exit.cpuSeconds, 1)) s, "
                + "collector CPU \(Report.decimal(run.collectorCPUSeconds, 1)) s, "
                + "agent peak RSS \(Report.decimal(Double(run.memory.hwmKB) / 1024, 1)) MiB "
                + run.memory.note
        )
        return run
    }

    func backlogRun(events: Int, deadline: Double?) throws -> AgentRun {
        let run = try agentRun(events: events, deadline: deadline)
        progress(
            "backlog \(Report.grouped(Double(events))): agent ran \(Report.decimal(run.exit.seconds, 1)) s"
                + (deadline.map { " (--deadline \(Report.decimal($0, 0)))" } ?? "")
                + ", drained \(Report.grouped(Double(run.drained))), "
                + "delivered \(Report.grouped(Double(run.delivered))), "
                + "peak RSS \(Report.decimal(Double(run.memory.hwmKB) / 1024, 1)) MiB "
                + run.memory.note + ", "
                + "CPU \(Report.decimal(run.exit.cpuSeconds, 1)) s")
        return run
    }

    /// `tributary-agent --once` (with `--deadline` if given) on a copy of the backlog of `events`
    /// events, against a fresh reference collector; verified.
    func agentRun(events: Int, deadline: Double?, overTLS: Bool = false, extraArguments: [String] = []) throws -> AgentRun {
        let run = try prepareRun(events: events)
        defer { try? FileManager.default.removeItem(atPath: run.directory) }
        let outbox = run.directory + "/outbox/outbox.sqlite"
        if overTLS && tls == nil { tls = try BenchTLS.make(in: scratch) }
        let tls = overTLS ? tls : nil
        let collector = try CollectorProcess(executable: binDirectory + "/tributary-collector", tls: tls)
        var arguments = [
            "--group", run.group, "--server", collector.ingestURL, "--once", "--outbox", outbox, "--log-level",
            "warning",
        ]
        if let tls { arguments += ["--ca-file", tls.caFile] }
        if let deadline { arguments += ["--deadline", "\(deadline)"] }
        arguments += extraArguments
        let agent = try SpawnedProcess(
            name: "tributary-agent", executable: binDirectory + "/tributary-agent", arguments: arguments)
        let sampler = MemorySampler(pid: agent.pid)
        let exited = Result { try agent.wait() }
        let memory = sampler.stop()
        let exit = try exited.get()
        let collectorCPU = collector.cpuSeconds()
        let stats = try collector.stats()
        try collector.stop()
        guard exit.status == 0 else {
            throw BenchFailure(
                "tributary-agent failed (\(exit.status.map { "exit status \($0)" } ?? "signal \(exit.signal ?? 0)")).")
        }
        let left = try Backlog.pendingInStore(group: run.group)
        let contents = try OutboxContents(path: outbox)
        let drained = Int(contents.state["drained"] ?? 0)
        let delivered = Int(contents.state["delivered"] ?? 0)
        // Every event is in exactly one place: still in the store, in the outbox, or delivered.
        guard left + contents.rows + delivered == events, drained == events - left, contents.deadLetters == 0,
            stats.duplicates == 0, stats.seqViolations == 0, stats.orderViolations == 0
        else {
            throw BenchFailure(
                "agent run on \(events) events: store \(left), outbox \(contents.rows) "
                    + "(\(contents.deadLetters) dead letters), "
                    + "delivered \(delivered), drained \(drained); collector: \(stats).")
        }
        // The collector holds every delivered event; at most the one batch a deadline cut off on its
        // way back (stored, never acknowledged) more.
        guard stats.unique >= delivered, stats.unique <= delivered + 500 else {
            throw BenchFailure("the collector holds \(stats.unique) events, the agent delivered \(delivered).")
        }
        if deadline == nil {
            guard left == 0, contents.rows == 0, delivered == events, stats.unique == events else {
                throw BenchFailure(
                    "agent --once on \(events) events left store \(left), outbox \(contents.rows); "
                        + "the collector has \(stats.unique)."
                )
            }
        } else if let deadline, exit.seconds > deadline + 2 {
            throw BenchFailure("tributary-agent --deadline \(deadline) ran \(Report.decimal(exit.seconds, 1)) s.")
        }
        return AgentRun(
            backlog: events, exit: exit, drained: drained, delivered: delivered, collectorCPUSeconds: collectorCPU,
            memory: memory)
    }

    func progress(_ line: String) {
        if !quiet { writeError(line) }
    }
}

/// The agent benchmark's tables of medians.
struct AgentReport {
    let workDirectory: String
    let reps: Int
    var chunk = 1000
    var drainEvents = 0
    var e2eEvents = 0
    var rssDeadline = 0.0
    var recordSize = 0.0
    var drain: [DrainSample] = []
    var e2e: [AgentRun] = []
    /// The same runs over TLS (``BenchTLS``), each right after its plain one.
    var e2eTLS: [AgentRun] = []
    var rss: [AgentRun] = []
    var pipeline: [PipelineRun] = []
    var pipelineSpec: PipelineSpec?

    init(workDirectory: String, reps: Int) {
        self.workDirectory = workDirectory
        self.reps = reps
    }

    var text: String {
        let fileSystem = (try? FileSystemInfo(path: workDirectory))?.name ?? "?"
        var lines = [
            "Tributary sync agent benchmark, \(ISO8601DateFormatter().string(from: Date())), "
                + "\(ProcessInfo.processInfo.activeProcessorCount) CPUs, stores in \(workDirectory) (\(fileSystem)), "
                + "records \(Int(recordSize.rounded())) B",
            "",
        ]
        if !drain.isEmpty {
            lines.append(
                "Drain, store -> SQLite outbox: \(Report.grouped(Double(drainEvents))) events, "
                    + "\(Report.grouped(Double(chunk))) per transaction; "
                    + "medians of \(drain.count) reps")
            let rows: [(String, (DrainSample) -> DrainResult)] = [
                ("Swift Drainer.drainAvailable()", { $0.swift }),
                ("C, synchronous=FULL", { $0.cFull }),
                ("C, synchronous=NORMAL", { $0.cNormal }),
            ]
            var table = [["drain", "ev/s", "CPU µs/ev", "peak RSS MiB", "peak anon MiB"]]
            for (label, pick) in rows {
                let results = drain.map(pick)
                table.append([
                    label,
                    Report.grouped(Statistics.median(results.map(\.eventsPerSecond))),
                    Report.decimal(
                        Statistics.median(
                            results.map { Double($0.report.cpuNanos ?? 0) / 1e3 / Double($0.report.events) }), 1),
                    Report.decimal(Statistics.median(results.map { Double($0.report.maxRSSKB ?? 0) / 1024 }), 1),
                    Report.decimal(Statistics.median(results.map { Double($0.memory.anonKB) / 1024 }), 1),
                ])
            }
            lines += Self.format(table)
            let full = Statistics.median(drain.map { $0.swift.eventsPerSecond / $0.cFull.eventsPerSecond })
            let normal = Statistics.median(drain.map { $0.swift.eventsPerSecond / $0.cNormal.eventsPerSecond })
            lines.append(
                "Swift/C: \(Report.decimal(full, 2)) against synchronous=FULL, "
                    + "\(Report.decimal(normal, 2)) against NORMAL "
                    + "(medians of the per-rep ratios)")
            lines.append("")
        }
        if !e2e.isEmpty {
            lines.append(
                "End to end: tributary-agent --once -> tributary-collector (loopback), "
                    + "\(Report.grouped(Double(e2eEvents))) "
                    + "events; medians of \(e2e.count) reps")
            var table = [
                ["end to end", "ev/s", "wall s", "agent CPU s", "collector CPU s", "peak RSS MiB", "peak anon MiB"]
            ]
            func row(_ label: String, _ runs: [AgentRun]) -> [String] {
                [
                    label,
                    Report.grouped(Statistics.median(runs.map(\.eventsPerSecond))),
                    Report.decimal(Statistics.median(runs.map(\.exit.seconds)), 1),
                    Report.decimal(Statistics.median(runs.map(\.exit.cpuSeconds)), 1),
                    Report.decimal(Statistics.median(runs.map(\.collectorCPUSeconds)), 1),
                    Report.decimal(Statistics.median(runs.map { Double($0.memory.hwmKB) / 1024 }), 1),
                    Report.decimal(Statistics.median(runs.map { Double($0.memory.anonKB) / 1024 }), 1),
                ]
            }
            table.append(row("agent --once", e2e))
            if !e2eTLS.isEmpty { table.append(row("agent --once over TLS", e2eTLS)) }
            lines += Self.format(table)
            if !e2eTLS.isEmpty {
                let ratio = Statistics.median(zip(e2eTLS, e2e).map { $0.eventsPerSecond / $1.eventsPerSecond })
                func cpuPerEvent(_ runs: [AgentRun]) -> Double {
                    Statistics.median(runs.map { $0.exit.cpuSeconds * 1e6 / Double(max(1, $0.delivered)) })
                }
                lines.append(
                    "TLS/plain: \(Report.decimal(ratio, 2)) of the plain rate (target ≥ 0.80; median of the per-rep ratios); "
                        + "agent CPU per event \(Report.decimal(cpuPerEvent(e2eTLS), 1)) µs over TLS against "
                        + "\(Report.decimal(cpuPerEvent(e2e), 1)) µs plain")
            }
            lines.append("")
        }
        if !rss.isEmpty {
            let how =
                rssDeadline > 0
                ? "tributary-agent --once --deadline \(Report.decimal(rssDeadline, 0))" : "tributary-agent --once"
            lines.append("Agent peak RSS by backlog: \(how) -> tributary-collector, one run each")
            var table = [
                [
                    "backlog", "wall s", "drained", "delivered", "agent CPU s", "peak RSS MiB", "peak anon MiB",
                    "peak file MiB",
                ]
            ]
            for run in rss {
                table.append([
                    Report.grouped(Double(run.backlog)), Report.decimal(run.exit.seconds, 1),
                    Report.grouped(Double(run.drained)), Report.grouped(Double(run.delivered)),
                    Report.decimal(run.exit.cpuSeconds, 1), Report.decimal(Double(run.memory.hwmKB) / 1024, 1),
                    Report.decimal(Double(run.memory.anonKB) / 1024, 1),
                    Report.decimal(Double(run.memory.fileKB) / 1024, 1),
                ])
            }
            lines += Self.format(table)
            if let first = rss.first, let last = rss.last, rss.count > 1 {
                lines.append(
                    "\(Report.grouped(Double(last.backlog))) / \(Report.grouped(Double(first.backlog))) events: peak RSS x"
                        + Report.decimal(Double(last.memory.hwmKB) / Double(first.memory.hwmKB), 2) + ", peak anon x"
                        + Report.decimal(Double(last.memory.anonKB) / Double(max(first.memory.anonKB, 1)), 2))
                lines.append(
                    "peak anon: heap and stacks (RssAnon, sampled every 10 ms); peak file: resident pages of the binary, "
                        + "libraries and the LMDB map (RssFile), which the kernel reclaims under pressure.")
            }
        }
        if let spec = pipelineSpec, !pipeline.isEmpty {
            lines.append("")
            lines.append(
                "Pipeline: \(spec.processes) producer processes x \(spec.callers) callers x \(spec.window) enqueued "
                    + "events in flight (group commit) "
                    + "-> tributary-agent \(spec.agentArguments.joined(separator: " ")) -> tributary-collector, "
                    + "\(Report.grouped(Double(spec.events))) events; medians of \(pipeline.count) reps")
            var table = [
                [
                    "pipeline", "ev/s acked", "wall s", "producers ev/s", "producer CPU s", "agent CPU s",
                    "collector CPU s", "CPU ceiling ev/s", "busy %", "agent peak anon MiB",
                ]
            ]
            table.append([
                "producers -> collector",
                Report.grouped(Statistics.median(pipeline.map(\.eventsPerSecond))),
                Report.decimal(Statistics.median(pipeline.map(\.seconds)), 1),
                Report.grouped(Statistics.median(pipeline.map(\.producerEventsPerSecond))),
                Report.decimal(Statistics.median(pipeline.map(\.producerCPUSeconds)), 1),
                Report.decimal(Statistics.median(pipeline.map(\.agentCPUSeconds)), 1),
                Report.decimal(Statistics.median(pipeline.map(\.collectorCPUSeconds)), 1),
                Report.grouped(Statistics.median(pipeline.map(\.cpuCeiling))),
                Report.decimal(Statistics.median(pipeline.map(\.busyShare)) * 100, 0),
                Report.decimal(Statistics.median(pipeline.map { Double($0.agentPeakAnonKB) / 1024 }), 1),
            ])
            lines += Self.format(table)
            lines.append(
                "CPU ceiling: events x CPUs / CPU s of producers, agent and collector together, the rate the run's "
                    + "CPU per event allows with every CPU busy all the time; busy %: that CPU time over wall time x CPUs.")
        }
        return lines.joined(separator: "\n")
    }

    /// Columns: the first left-aligned, the others right-aligned.
    static func format(_ rows: [[String]]) -> [String] {
        let widths = rows[0].indices.map { column in rows.map { $0[column].count }.max() ?? 0 }
        return rows.map { row in
            row.enumerated().map { column, cell in
                let pad = String(repeating: " ", count: widths[column] - cell.count)
                return column == 0 ? cell + pad : pad + cell
            }.joined(separator: "   ")
        }
    }
}
