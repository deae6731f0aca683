import Foundation

/// The whole pipeline at once: producer processes → shared store → `tributary-agent` (running as a
/// service) → reference collector on loopback, until the collector has acknowledged every event.
struct PipelineSpec {
    var events: Int
    var processes: Int
    var callers: Int
    /// Events each caller keeps in flight with `enqueue` (0: each awaits every `track`).
    var window: Int
    /// Extra `tributary-agent` options (batch size, ...).
    var agentArguments: [String]
}

/// One pipeline run.
struct PipelineRun {
    var events: Int
    /// GO → the collector holds every event.
    var seconds: Double
    /// GO → the last producer's last `track()` returned.
    var producerSeconds: Double
    var agentCPUSeconds: Double
    var collectorCPUSeconds: Double
    var producerCPUSeconds: Double
    var agentPeakAnonKB: Int
    /// The machine's CPUs during the run.
    var cpus: Int
    var eventsPerSecond: Double { Double(events) / seconds }
    var producerEventsPerSecond: Double { Double(events) / producerSeconds }
    /// CPU time of producers, agent and collector together.
    var cpuSeconds: Double { producerCPUSeconds + agentCPUSeconds + collectorCPUSeconds }
    /// The rate this run's CPU time per event allows on `cpus` CPUs kept busy all the time: what the
    /// hardware allows the code as it is, with perfect overlap between the processes.
    var cpuCeiling: Double { Double(events) * Double(cpus) / cpuSeconds }
    /// How much of the machine the run kept busy: CPU time over wall time times CPUs.
    var busyShare: Double { cpuSeconds / (seconds * Double(cpus)) }
}

extension AgentSession {
    /// Producers with group commit write `spec.events` events while the agent drains and uploads; the
    /// clock stops when the collector's unique count reaches `spec.events`. Verified: no duplicate, no
    /// order or sequence violation, every producer's events all there.
    func pipelineRun(_ rep: Int, of reps: Int, spec: PipelineSpec) throws -> PipelineRun {
        let directory = try newRunDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let group = directory + "/group"
        // 2 GiB: room for the whole run even if the agent drained nothing until the end.
        let mapSize = 2 << 30
        try StoreCheck.prepare(group: group, mapSize: mapSize)
        let perProcess = spec.events / spec.processes
        let producers = try (1...spec.processes).map { index in
            try ProducerProcess(
                name: "pipeline producer \(index)", executable: binDirectory + "/tributary-bench",
                arguments: [
                    "worker", "--group", group, "--producer-id", "pipe-\(index)",
                    "--events", "\(perProcess + (index <= spec.events % spec.processes ? 1 : 0))",
                    "--callers", "\(spec.callers)", "--window", "\(spec.window)", "--map-size", "\(mapSize)",
                    "--no-latencies",
                ])
        }
        for producer in producers { try producer.waitUntilReady() }
        let collector = try CollectorProcess(executable: binDirectory + "/tributary-collector")
        let agent = try SpawnedProcess(
            name: "tributary-agent", executable: binDirectory + "/tributary-agent",
            arguments: [
                "--group", group, "--server", collector.ingestURL, "--outbox", directory + "/outbox.sqlite",
                "--log-level", "warning",
            ] + spec.agentArguments)
        let sampler = MemorySampler(pid: agent.pid)

        let start = Monotonic.nanos()
        for producer in producers { try producer.start() }
        let reports = try producers.map { try $0.finish() }
        let producersDone = reports.map(\.endNanos).max() ?? start
        var stats = try collector.stats()
        let patience = Monotonic.nanos() + 600 * 1_000_000_000
        while stats.unique < spec.events {
            guard Monotonic.nanos() < patience else {
                throw BenchFailure("the collector holds \(stats.unique) of \(spec.events) events after 10 minutes.")
            }
            usleep(20_000)
            stats = try collector.stats()
        }
        let end = Monotonic.nanos()
        let collectorCPU = collector.cpuSeconds()
        kill(agent.pid, SIGTERM)
        let exit = try agent.wait()
        let memory = sampler.stop()
        try collector.stop()
        guard exit.status == 0 else { throw BenchFailure("tributary-agent did not exit 0 after SIGTERM.") }
        guard stats.unique == spec.events, stats.duplicates == 0, stats.seqViolations == 0,
            stats.orderViolations == 0
        else { throw BenchFailure("pipeline run: the collector says \(stats).") }
        let run = PipelineRun(
            events: spec.events, seconds: Double(end - start) / 1e9,
            producerSeconds: Double(producersDone - start) / 1e9, agentCPUSeconds: exit.cpuSeconds,
            collectorCPUSeconds: collectorCPU, producerCPUSeconds: reports.reduce(0) { $0 + Double($1.cpuNanos ?? 0) / 1e9 },
            agentPeakAnonKB: memory.anonKB, cpus: ProcessInfo.processInfo.activeProcessorCount)
        progress(
            "rep \(rep)/\(reps)  pipeline \(Report.grouped(Double(spec.events))) events: "
                + "\(Report.grouped(run.eventsPerSecond)) ev/s to the collector in \(Report.decimal(run.seconds, 1)) s "
                + "(producers done after \(Report.decimal(run.producerSeconds, 1)) s, "
                + "\(Report.grouped(run.producerEventsPerSecond)) ev/s); CPU s: producers "
                + "\(Report.decimal(run.producerCPUSeconds, 1)), agent \(Report.decimal(run.agentCPUSeconds, 1)), "
                + "collector \(Report.decimal(run.collectorCPUSeconds, 1)); CPU ceiling "
                + "\(Report.grouped(run.cpuCeiling)) ev/s, \(Report.decimal(run.busyShare * 100, 0)) % busy")
        return run
    }
}
