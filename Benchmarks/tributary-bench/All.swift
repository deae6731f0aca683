import ArgumentParser
import Foundation

/// `tributary-bench all` (what `make bench` runs): the producer benchmark with the issue's C batch of
/// 100 events per transaction for group commit, the agent benchmark with every part, the comparison
/// with the Python SDKs, then one table of every figure next to its baseline and its target.
struct All: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Every benchmark, then one summary table of medians, ratios and targets (make bench).",
        discussion: "Prints each benchmark's own table as it finishes and the summary last. See docs/performance.md."
    )

    @Option(help: ArgumentHelp("Directory holding the release binaries (default: this executable's).", valueName: "dir"))
    var bin: String?

    @Option(help: ArgumentHelp("Python interpreter with segment-analytics-python and posthog.", valueName: "path"))
    var python: String = ".build-bench/venv/bin/python"

    @Option(help: "Repetitions of every figure (the 1,000,000-event RSS runs are made once).")
    var reps: Int = 3

    @Option(name: .customLong("c-batch"), help: "C events per transaction, group commit rows.")
    var cBatch: Int = 100

    @Option(
        name: .customLong("work-dir"),
        help: ArgumentHelp("Where stores are created (must not be tmpfs).", valueName: "dir"))
    var workDirectory: String = "/var/tmp"

    func run() throws {
        let binDirectory = try bin ?? ownDirectory()
        let common = ["--bin", binDirectory, "--reps", "\(reps)", "--work-dir", workDirectory]
        let started = Monotonic.nanos()

        let producers = try Run.parse(common + ["--c-batch", "\(cBatch)"]).measure()
        writeLine(producers.report.text + "\n")
        let agent = try AgentBench.parse(common + ["--pipeline-reps", "\(reps)"]).measure()
        writeLine(agent.text + "\n")
        let device = try DeviceBench.parse(common).measure()
        writeLine(device.text + "\n")
        let compare: CompareReport
        do {
            compare = try Compare.parse(common + ["--python", python]).measure()
        } catch {
            writeError("tributary-bench compare: run failed, aborting: \(error)")
            throw ExitCode.failure
        }
        writeLine(compare.text + "\n")
        writeLine(
            Summary(producers: producers.samples, agent: agent, device: device, compare: compare, cBatch: cBatch).text
                + "\nWhole run: \(Report.decimal(Double(Monotonic.nanos() - started) / 6e10, 1)) min")
    }
}

/// The one table: every figure of the issue next to its baseline from the same run, and its target.
struct Summary {
    let producers: [Configuration: [Sample]]
    let agent: AgentReport
    let device: DeviceReport
    let compare: CompareReport
    let cBatch: Int

    var text: String {
        var rows = [["figure", "Tributary", "baseline (same run)", "ratio", "target", "met"]]
        func producerRow(_ label: String, _ configuration: Configuration, baseline: String, target: Double?) {
            guard let samples = producers[configuration], !samples.isEmpty else { return }
            let swift = Statistics.median(samples.map(\.swift.eventsPerSecond))
            let c = Statistics.median(samples.map(\.c.eventsPerSecond))
            let ratio = Statistics.median(samples.map { $0.swift.eventsPerSecond / $0.c.eventsPerSecond })
            rows.append([
                label, "\(Report.grouped(swift)) ev/s", "\(baseline) \(Report.grouped(c)) ev/s",
                Report.decimal(ratio, 2), target.map { ">= \(Report.decimal($0, 1))x" } ?? "-",
                target.map { ratio >= $0 ? "yes" : "no" } ?? "-",
            ])
        }
        producerRow("1 producer, durable track() one at a time", Configuration(mode: .single, processes: 1),
                    baseline: "C 1 ev/txn:", target: 0.8)
        producerRow("1 producer, 8 callers, group commit", Configuration(mode: .group, processes: 1),
                    baseline: "C \(cBatch) ev/txn:", target: 0.5)
        if let samples = producers[Configuration(mode: .group, processes: 1)], !samples.isEmpty {
            let swift = Statistics.median(samples.map(\.swift.eventsPerSecond))
            let ratio = swift / compare.segmentRate
            rows.append([
                "  same, against segment track() in memory", "\(Report.grouped(swift)) ev/s",
                "segment \(Report.grouped(compare.segmentRate)) ev/s", Report.decimal(ratio, 2), ">= 4.0x",
                ratio >= 4 ? "yes" : "no",
            ])
        }
        producerRow("4 producer processes, group commit", Configuration(mode: .group, processes: 4),
                    baseline: "C x4, \(cBatch) ev/txn:", target: 0.5)
        // No target: the same 8 callers, but each awaits every event, so a transaction holds at most 8.
        producerRow("  (8 callers each awaiting every track())", Configuration(mode: .awaited, processes: 1),
                    baseline: "C \(cBatch) ev/txn:", target: nil)
        if !agent.drain.isEmpty {
            let swift = Statistics.median(agent.drain.map(\.swift.eventsPerSecond))
            let c = Statistics.median(agent.drain.map(\.cFull.eventsPerSecond))
            let ratio = Statistics.median(agent.drain.map { $0.swift.eventsPerSecond / $0.cFull.eventsPerSecond })
            rows.append([
                "drain store -> outbox -> delete", "\(Report.grouped(swift)) ev/s", "C FULL: \(Report.grouped(c)) ev/s",
                Report.decimal(ratio, 2), ">= 0.5x", ratio >= 0.5 ? "yes" : "no",
            ])
        }
        if let spec = agent.pipelineSpec, !agent.pipeline.isEmpty {
            // No baseline program does this work; the nearest same-run reference is what the run's own CPU
            // time per event allows on this machine (PipelineRun.cpuCeiling). The target stays absolute.
            let rate = Statistics.median(agent.pipeline.map(\.eventsPerSecond))
            let ceiling = Statistics.median(agent.pipeline.map(\.cpuCeiling))
            let share = Statistics.median(agent.pipeline.map { $0.eventsPerSecond / $0.cpuCeiling })
            let cpus = agent.pipeline.map(\.cpus).max() ?? 0
            rows.append([
                "end to end, \(Report.grouped(Double(spec.events))) events, acked", "\(Report.grouped(rate)) ev/s",
                "CPU ceiling, \(cpus) CPUs: \(Report.grouped(ceiling)) ev/s", Report.decimal(share, 2), ">= 100,000 ev/s",
                rate >= 100_000 ? "yes" : "no",
            ])
        }
        if agent.rss.count >= 2, let small = agent.rss.first, let large = agent.rss.last {
            let mib = { (kb: Int) in Report.decimal(Double(kb) / 1024, 1) }
            let growth = Double(large.memory.hwmKB) / Double(max(small.memory.hwmKB, 1))
            let met = large.memory.hwmKB <= 64 << 10 && growth <= 1.1
            rows.append([
                "agent peak RSS (anon), \(Report.grouped(Double(large.backlog))) backlog",
                "\(mib(large.memory.hwmKB)) (\(mib(large.memory.anonKB))) MiB",
                "\(Report.grouped(Double(small.backlog))): \(mib(small.memory.hwmKB)) (\(mib(small.memory.anonKB))) MiB",
                Report.decimal(growth, 2), "<= 64 MiB, no growth", met ? "yes" : "no",
            ])
        }
        rows += device.summaryRows
        let lost = compare.medianLost
        let tributaryLost = lost["tributary"] ?? 0
        rows.append([
            "lost of \(Report.grouped(Double(compare.events))) under SIGKILL", Report.grouped(tributaryLost),
            "segment \(Report.grouped(lost["segment"] ?? 0)), posthog \(Report.grouped(lost["posthog"] ?? 0))", "-",
            "0", tributaryLost == 0 ? "yes" : "no",
        ])
        return (["Summary: medians; ratio = Tributary / baseline (median of per-rep ratios where both ran in one rep)"]
            + AgentReport.format(rows)).joined(separator: "\n")
    }
}
