import ArgumentParser
import Foundation

/// `tributary-bench compare`: Tributary next to two Python analytics SDKs from PyPI.
///
/// Loss: each enqueues 10,000 events and is SIGKILLed 0.5 s later while the collector answers every
/// request in 200 ms. The Python SDKs (segment-analytics-python, posthog) post to the reference
/// collector's counting endpoint (`/count/<sdk>`); what it counted is what survived. Tributary: a
/// producer with 8 async `track()` callers, killed the same way, then `tributary-agent --once`
/// delivers the store to the same collector; both the store and the collector must hold every event
/// whose `track()` returned (the ledger). Rate: the in-memory enqueue rate of segment's `track()`.
struct Compare: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Events lost under SIGKILL: Tributary next to segment-analytics-python and posthog; segment's enqueue rate.",
        discussion: "Needs a Python with both SDKs installed (make bench creates .build-bench/venv). See docs/performance.md."
    )

    @Option(help: ArgumentHelp("Directory holding tributary-bench, tributary-agent, tributary-collector.", valueName: "dir"))
    var bin: String?

    @Option(help: ArgumentHelp("Python interpreter with segment-analytics-python and posthog.", valueName: "path"))
    var python: String = ".build-bench/venv/bin/python"

    @Option(help: ArgumentHelp("The Python side (Benchmarks/python/sdk_bench.py).", valueName: "path"))
    var script: String = "Benchmarks/python/sdk_bench.py"

    @Option(help: "Repetitions; the tables show medians.")
    var reps: Int = 3

    @Option(help: "Events each producer enqueues before it is killed.")
    var events: Int = 10_000

    @Option(name: .customLong("kill-after"), help: "Seconds between the last enqueue and SIGKILL.")
    var killAfter: Double = 0.5

    @Option(name: .customLong("latency-ms"), help: "The collector's delay before every answer, in milliseconds.")
    var latencyMillis: Int = 200

    @Option(name: .customLong("rate-events"), help: "track() calls timed for segment's enqueue rate.")
    var rateEvents: Int = 100_000

    @Option(
        name: .customLong("work-dir"),
        help: ArgumentHelp("Where Tributary's stores are created (must not be tmpfs).", valueName: "dir"))
    var workDirectory: String = "/var/tmp"

    @Flag(help: "Do not print one progress line per run on stderr.")
    var quiet = false

    func validate() throws {
        guard reps >= 1, events >= 1, rateEvents >= 1 else {
            throw ValidationError("--reps, --events and --rate-events must be at least 1.")
        }
        guard killAfter >= 0, latencyMillis >= 0 else {
            throw ValidationError("--kill-after and --latency-ms must not be negative.")
        }
        guard FileManager.default.isExecutableFile(atPath: python) else {
            throw ValidationError("\(python) is not an executable Python; make bench creates .build-bench/venv.")
        }
        guard FileManager.default.fileExists(atPath: script) else { throw ValidationError("\(script) is missing.") }
        guard !(try FileSystemInfo(path: workDirectory)).isMemoryBacked else {
            throw ValidationError("--work-dir \(workDirectory) is memory-backed; choose a directory on a disk.")
        }
    }

    func run() throws {
        do {
            writeLine(try measure().text)
        } catch {
            writeError("tributary-bench compare: run failed, aborting: \(error)")
            throw ExitCode.failure
        }
    }

    /// Every repetition of every loss run and of the rate run.
    func measure() throws -> CompareReport {
        let binDirectory = try bin ?? ownDirectory()
        let scratch = try makeScratchDirectory(in: workDirectory)
        defer { try? FileManager.default.removeItem(atPath: scratch) }
        var report = CompareReport(events: events, killAfter: killAfter, latencyMillis: latencyMillis, rateEvents: rateEvents)
        for rep in 1...reps {
            for sdk in ["segment", "posthog"] {
                let delivered = try pythonLoss(sdk: sdk, binDirectory: binDirectory)
                report.python[sdk, default: []].append(events - delivered)
                progress("rep \(rep)/\(reps)  \(sdk): \(Report.grouped(Double(delivered))) of \(events) reached the collector")
            }
            let tributary = try tributaryLoss(rep: rep, binDirectory: binDirectory, scratch: scratch)
            report.tributary.append(tributary)
            progress(
                "rep \(rep)/\(reps)  tributary: \(tributary.acknowledged) acknowledged, \(tributary.inStore) in the store "
                    + "after SIGKILL, \(tributary.delivered) at the collector after tributary-agent --once")
            let rate = try segmentRate(binDirectory: binDirectory)
            report.segmentRates.append(rate)
            progress("rep \(rep)/\(reps)  segment track() enqueue: \(Report.grouped(rate)) ev/s")
        }
        return report
    }

    private func pythonLoss(sdk: String, binDirectory: String) throws -> Int {
        let collector = try CollectorProcess(
            executable: binDirectory + "/tributary-collector", arguments: ["--latency-ms", "\(latencyMillis)"])
        let child = try ProducerProcess(
            name: "\(sdk) (Python)", executable: python,
            arguments: [script, "loss", "--sdk", sdk, "--host", "http://127.0.0.1:\(collector.port)/count/\(sdk)",
                        "--events", "\(events)"])
        _ = try child.waitForLine(prefix: "ENQUEUED")
        Thread.sleep(forTimeInterval: killAfter)
        child.killNow()
        // Requests are counted on arrival; give one in flight time to arrive.
        Thread.sleep(forTimeInterval: 0.2)
        let counted = try collector.countedEvents(sdk)
        try collector.stop()
        return counted
    }

    private func tributaryLoss(rep: Int, binDirectory: String, scratch: String) throws -> TributaryLoss {
        let directory = scratch + "/loss-\(rep)"
        guard mkdir(directory, 0o700) == 0 else { throw BenchFailure("mkdir \(directory) failed.") }
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let group = directory + "/group"
        try StoreCheck.prepare(group: group, mapSize: 1 << 30)
        let child = try ProducerProcess(
            name: "tributary producer", executable: binDirectory + "/tributary-bench",
            arguments: ["worker", "--group", group, "--producer-id", "loss-\(rep)", "--events", "\(events)",
                        "--callers", "8", "--hold"])
        try child.waitUntilReady()
        try child.start()
        let ledger = try child.waitForLine(prefix: "ENQUEUED").split(separator: " ")
        guard ledger.count >= 2, let acknowledged = Int(ledger[1]) else {
            throw BenchFailure("the producer printed \(ledger.joined(separator: " ")).")
        }
        Thread.sleep(forTimeInterval: killAfter)
        child.killNow()
        let inStore = try Backlog.pendingInStore(group: group)

        let collector = try CollectorProcess(
            executable: binDirectory + "/tributary-collector", arguments: ["--latency-ms", "\(latencyMillis)"])
        let agent = try SpawnedProcess(
            name: "tributary-agent", executable: binDirectory + "/tributary-agent",
            arguments: ["--group", group, "--server", collector.ingestURL, "--once", "--outbox",
                        directory + "/outbox.sqlite", "--log-level", "warning"])
        let exit = try agent.wait()
        let stats = try collector.stats()
        try collector.stop()
        guard exit.status == 0, stats.duplicates == 0, stats.seqViolations == 0, stats.orderViolations == 0 else {
            throw BenchFailure("tributary-agent --once after the kill: exit \(String(describing: exit.status)), \(stats).")
        }
        return TributaryLoss(acknowledged: acknowledged, inStore: inStore, delivered: stats.unique)
    }

    private func segmentRate(binDirectory: String) throws -> Double {
        let collector = try CollectorProcess(
            executable: binDirectory + "/tributary-collector", arguments: ["--latency-ms", "\(latencyMillis)"])
        let child = try ProducerProcess(
            name: "segment rate (Python)", executable: python,
            arguments: [script, "rate", "--sdk", "segment", "--host", "http://127.0.0.1:\(collector.port)/count/rate",
                        "--events", "\(rateEvents)"])
        let fields = try child.waitForLine(prefix: "RATE").split(separator: " ")
        child.killNow()
        try collector.stop()
        guard fields.count == 3, let count = Double(fields[1]), let seconds = Double(fields[2]), seconds > 0 else {
            throw BenchFailure("the rate run printed \(fields.joined(separator: " ")).")
        }
        return count / seconds
    }

    private func progress(_ line: String) {
        if !quiet { writeError(line) }
    }
}

/// One Tributary loss run: `track()` calls that returned, events in the store after SIGKILL, events
/// the collector holds after `tributary-agent --once`.
struct TributaryLoss {
    var acknowledged: Int
    var inStore: Int
    var delivered: Int
    /// Acknowledged events missing from the store or from the collector.
    var lost: Int { max(acknowledged - inStore, acknowledged - delivered, 0) }
}

/// The comparison's table.
struct CompareReport {
    var events: Int
    var killAfter: Double
    var latencyMillis: Int
    var rateEvents: Int
    var python: [String: [Int]] = [:]
    var tributary: [TributaryLoss] = []
    var segmentRates: [Double] = []

    var medianLost: [String: Double] {
        var out = python.mapValues { Statistics.median($0.map(Double.init)) }
        out["tributary"] = Statistics.median(tributary.map { Double($0.lost) })
        return out
    }

    var segmentRate: Double { Statistics.median(segmentRates) }

    var text: String {
        var lines = [
            "Events lost: \(Report.grouped(Double(events))) enqueued, SIGKILL \(Report.decimal(killAfter, 1)) s later, "
                + "collector answering in \(latencyMillis) ms; medians of \(tributary.count) reps"
        ]
        var table = [["producer", "enqueued", "lost", "lost %"]]
        let lost = medianLost
        for name in ["tributary", "segment", "posthog"] {
            let label =
                name == "tributary"
                ? "Tributary (8 async track callers)"
                : name == "segment" ? "segment-analytics-python" : "posthog (Python)"
            let value = lost[name] ?? 0
            table.append([
                label, Report.grouped(Double(events)), Report.grouped(value),
                Report.decimal(100 * value / Double(events), 1),
            ])
        }
        lines += AgentReport.format(table)
        lines.append(
            "Tributary: lost = acknowledged track() calls missing from the store after the kill or from the collector "
                + "after tributary-agent --once. Python: lost = enqueued - counted by the collector.")
        lines.append(
            "segment-analytics-python track() enqueue rate (in memory, \(Report.grouped(Double(rateEvents))) calls): "
                + "\(Report.grouped(segmentRate)) ev/s (median)")
        return lines.joined(separator: "\n")
    }
}
