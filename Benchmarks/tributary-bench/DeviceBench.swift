import ArgumentParser
import Foundation

#if canImport(Glibc)
    import Glibc
#endif

/// `tributary-bench device`: what the agent costs a device (issue 36). An idle agent's wake-ups, disk
/// writes and CPU; a producer's `track()` latency while the agent drains a large backlog, next to the
/// same producer with no agent, and the agent's store-lock hold times; the agent's CPU per delivered
/// event next to the C floor (`lmdb-baseline drain --gzip-level 1`), and its bytes written per event.
struct DeviceBench: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "device",
        abstract: "Agent on a device: idle cost, producer latency under a drain, CPU and disk bytes per event.",
        discussion: """
            idle: one event delivered, then --idle-seconds with nothing to send (collector up, \
            WATCHDOG_USEC=30 s): wake-ups (voluntary context switches of every thread), write_bytes and \
            CPU from /proc; once. latency: a copy of a --latency-backlog store; the producer tracks \
            --latency-events, one every --latency-interval-us, first with no agent, then once \
            tributary-agent has begun draining the backlog, then beside the C floor's drain of a copy (the same \
            reads, deletes, outbox commits and gzip, nothing else); the agent's store-lock hold times from its \
            metrics. \
            energy: tributary-agent --once on --energy-events (verified as the e2e runs), its requests of \
            --chunk events as the floor compresses them, then with the default batch size; between the two \
            the C drain with gzip on a copy of the same backlog; CPU from wait4/getrusage. See \
            docs/performance.md.
            """
    )

    @Option(help: ArgumentHelp("Directory holding the release binaries (default: this executable's).", valueName: "dir"))
    var bin: String?

    @Option(parsing: .upToNextOption, help: "What to measure: idle, latency, energy.")
    var parts: [DevicePart] = DevicePart.allCases

    @Option(help: "Repetitions of the latency and energy runs; the tables show medians.")
    var reps: Int = 3

    @Option(name: .customLong("idle-seconds"), help: "Length of the idle window.")
    var idleSeconds: Int = 60

    @Option(name: .customLong("latency-backlog"), help: "Backlog the agent drains while the producer tracks.")
    var latencyBacklog: Int = 1_000_000

    @Option(name: .customLong("latency-events"), help: "Events the producer tracks in each latency run.")
    var latencyEvents: Int = 3_000

    @Option(name: .customLong("latency-interval-us"), help: "The producer's pace: one track() every this many µs.")
    var latencyInterval: Int = 1_000

    @Option(name: .customLong("energy-events"), help: "Backlog of each energy run.")
    var energyEvents: Int = 100_000

    @Option(help: "Events per drain transaction of the C floor (the agent's default chunk), and per request of the agent's like-for-like energy runs.")
    var chunk: Int = 2000

    @Option(name: .customLong("work-dir"), help: ArgumentHelp("Where stores are created (must not be tmpfs).", valueName: "dir"))
    var workDirectory: String = "/var/tmp"

    @Flag(help: "Do not print one progress line per run on stderr.")
    var quiet = false

    func validate() throws {
        guard reps >= 1, idleSeconds >= 1, latencyEvents >= 1, latencyInterval >= 0, chunk >= 1 else {
            throw ValidationError("--reps, --idle-seconds, --latency-events and --chunk must be at least 1.")
        }
        for (name, count) in [("--latency-backlog", latencyBacklog), ("--energy-events", energyEvents)]
        where !(1...AgentBench.largestBacklog).contains(count) {
            throw ValidationError("\(name) takes 1 to \(AgentBench.largestBacklog) events (the store quota is 1 GiB).")
        }
    }

    func run() throws {
        writeLine(try measure().text)
    }

    func measure() throws -> DeviceReport {
        let binDirectory = try bin ?? ownDirectory()
        let scratch = try makeScratchDirectory(in: workDirectory)
        defer { try? FileManager.default.removeItem(atPath: scratch) }
        let session = AgentSession(binDirectory: binDirectory, scratch: scratch, chunk: chunk, quiet: quiet)
        var report = DeviceReport()
        do {
            session.template = try Backlog.trackerBody(scratch: scratch)
            if parts.contains(.idle) { report.idle = try session.idleRun(seconds: idleSeconds) }
            // Energy before latency: the latency runs copy gigabytes of backlog, whose writeback goes on
            // for a while after them, and the energy runs' CPU includes their commits' kernel time.
            if parts.contains(.energy) {
                for rep in 1...reps { report.energy.append(try session.energyRun(rep, of: reps, events: energyEvents)) }
                report.energyEvents = energyEvents
                report.energyChunk = chunk
            }
            if parts.contains(.latency) {
                for rep in 1...reps {
                    report.latency.append(
                        try session.latencyRun(
                            rep, of: reps, backlog: latencyBacklog, events: latencyEvents, intervalMicros: latencyInterval))
                }
                report.latencyEvents = latencyEvents
                report.latencyBacklog = latencyBacklog
            }
        } catch {
            writeError("tributary-bench device: run failed, aborting: \(error)")
            throw ExitCode.failure
        }
        return report
    }
}

/// The parts of the device benchmark.
enum DevicePart: String, CaseIterable, ExpressibleByArgument, Sendable {
    case idle, latency, energy
}

/// What the kernel counts for a process: each thread's voluntary context switches (each a sleep, so
/// each wake-up ends in one), the bytes it caused to be written to disk, its CPU time.
struct ProcessCounts {
    /// Voluntary context switches by thread id.
    var switches: [String: Int]
    var writtenBytes: Int
    var cpuSeconds: Double

    init(pid: pid_t) throws {
        switches = [:]
        for task in try FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task") {
            let status = (try? String(contentsOfFile: "/proc/\(pid)/task/\(task)/status", encoding: .utf8)) ?? ""
            switches[task] = MemorySampler.field("voluntary_ctxt_switches:", in: status)
        }
        let io = try String(contentsOfFile: "/proc/\(pid)/io", encoding: .utf8)
        writtenBytes = MemorySampler.field("write_bytes:", in: io)
        let stat = try String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8)
        let fields = stat[stat.index(after: stat.lastIndex(of: ")")!)...].split(separator: " ")
        cpuSeconds = (Double(fields[11]) ?? 0) + (Double(fields[12]) ?? 0)
        cpuSeconds /= Double(sysconf(Int32(_SC_CLK_TCK)))
    }

    /// Wake-ups since `before`: each live thread's new switches (all of a thread started since), and
    /// one for each thread that ended (its last count is gone with it).
    func wakeups(since before: ProcessCounts) -> Int {
        let live = switches.reduce(0) { $0 + $1.value - (before.switches[$1.key] ?? 0) }
        return live + before.switches.keys.filter { switches[$0] == nil }.count
    }
}

/// A datagram socket standing in for systemd's notify socket: it reads and drops what the agent
/// sends, so that every watchdog ping is a real send.
final class NotifySink {
    let path: String
    private let fd: Int32

    init(path: String) throws {
        self.path = path
        let fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue), 0)
        self.fd = fd
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            let bytes = Array(path.utf8.prefix(raw.count - 1))
            raw.copyBytes(from: bytes)
            raw[bytes.count] = 0
        }
        let rc = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        guard fd >= 0, rc == 0 else { throw BenchFailure("could not bind the notify socket \(path).") }
        Thread.detachNewThread {
            var buffer = [UInt8](repeating: 0, count: 4096)
            while recv(fd, &buffer, buffer.count, 0) >= 0 {}
        }
    }

    deinit {
        shutdown(fd, Int32(SHUT_RDWR))
        close(fd)
        unlink(path)
    }
}

extension AgentSession {
    // MARK: Idle

    /// One event delivered by a running agent, then `seconds` with nothing to do.
    func idleRun(seconds: Int) throws -> IdleSample {
        let directory = try newRunDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let group = directory + "/group"
        let producer = try ProducerProcess(
            name: "producer", executable: binDirectory + "/tributary-bench",
            arguments: ["worker", "--group", group, "--producer-id", "app", "--events", "1"])
        try producer.waitUntilReady()
        try producer.start()
        _ = try producer.finish()
        let collector = try CollectorProcess(executable: binDirectory + "/tributary-collector")
        defer { try? collector.stop() }
        let notify = try NotifySink(path: directory + "/notify")
        let agent = try SpawnedProcess(
            name: "tributary-agent", executable: binDirectory + "/tributary-agent",
            arguments: [
                "--group", group, "--server", collector.ingestURL, "--outbox", directory + "/outbox.sqlite",
                "--flush-interval", "1", "--log-level", "warning",
            ],
            environment: ["NOTIFY_SOCKET": notify.path, "WATCHDOG_USEC": "30000000"])
        let started = Monotonic.nanos()
        while try collector.stats().unique < 1 {
            guard Monotonic.nanos() - started < 60_000_000_000 else { throw BenchFailure("the idle run's event was not delivered.") }
            usleep(50_000)
        }
        // The delivery's own writes (the outbox, the status a second later, the checkpoint) settle.
        sleep(3)
        let before = try ProcessCounts(pid: agent.pid)
        let from = Monotonic.nanos()
        sleep(UInt32(seconds))
        let after = try ProcessCounts(pid: agent.pid)
        let elapsed = Double(Monotonic.nanos() - from) / 1e9
        kill(agent.pid, SIGTERM)
        let exit = try agent.wait()
        guard exit.status == 0 else { throw BenchFailure("the idle agent did not stop cleanly: \(exit).") }
        let sample = IdleSample(
            seconds: elapsed, wakeups: after.wakeups(since: before),
            writtenBytes: after.writtenBytes - before.writtenBytes, cpuSeconds: after.cpuSeconds - before.cpuSeconds)
        progress(
            "idle \(Report.decimal(elapsed, 0)) s: \(sample.wakeups) wake-ups (\(Report.decimal(sample.wakeupsPerSecond, 2))/s), "
                + "\(sample.writtenBytes) bytes written, CPU \(Report.decimal(sample.cpuPercent, 3)) %")
        return sample
    }

    // MARK: Producer latency

    /// The producer's `track()` latencies on a copy of the backlog: first with no agent, then while the
    /// agent drains the backlog; and the agent's store-lock hold times (its metrics).
    func latencyRun(_ rep: Int, of reps: Int, backlog: Int, events: Int, intervalMicros: Int) throws -> LatencySample {
        let run = try prepareRun(events: backlog)
        defer { try? FileManager.default.removeItem(atPath: run.directory) }
        let idle = try producerLatencies(group: run.group, id: "app-idle", events: events, intervalMicros: intervalMicros)
        let collector = try CollectorProcess(executable: binDirectory + "/tributary-collector")
        defer { try? collector.stop() }
        let port = try freeLoopbackPort()
        guard mkdir(run.directory + "/outbox", 0o700) == 0 else { throw BenchFailure("mkdir outbox failed.") }
        let agent = try SpawnedProcess(
            name: "tributary-agent", executable: binDirectory + "/tributary-agent",
            arguments: [
                "--group", run.group, "--server", collector.ingestURL, "--outbox", run.directory + "/outbox/outbox.sqlite",
                "--log-level", "warning", "--metrics-address", "127.0.0.1:\(port)",
            ])
        var (leftAtStart, producerStarted) = (0, UInt64(0))
        let draining = try producerLatencies(group: run.group, id: "app-drain", events: events, intervalMicros: intervalMicros) {
            leftAtStart = try Self.waitUntilDrainBegins(group: run.group, backlog: backlog, drainer: "the agent")
            producerStarted = Monotonic.nanos()
        }
        // The producer ran beside the drain only if the backlog was not yet drained when it ended.
        let leftAtEnd = try Backlog.pendingInStore(group: run.group)
        let started = Monotonic.nanos()
        while try Backlog.pendingInStore(group: run.group) > 0 {
            guard Monotonic.nanos() - started < 900_000_000_000 else { throw BenchFailure("the agent did not drain the backlog.") }
            usleep(50_000)
        }
        let drainRate = (
            beside: Double(leftAtStart + events - leftAtEnd) / (Double(started - producerStarted) / 1e9),
            alone: Double(leftAtEnd) / (Double(Monotonic.nanos() - started) / 1e9)
        )
        let holds = try LockHolds(metrics: String(decoding: try HTTP.get(port: port, path: "/metrics"), as: UTF8.self))
        kill(agent.pid, SIGTERM)
        let exit = try agent.wait()
        guard exit.status == 0 else { throw BenchFailure("the draining agent did not stop cleanly: \(exit).") }
        let (floorDraining, floorLeft) = try floorLatencies(backlog: backlog, events: events, intervalMicros: intervalMicros)
        let sample = LatencySample(
            idle: idle, draining: draining, floorDraining: floorDraining, overlapped: leftAtEnd > 0 && floorLeft > 0,
            holds: holds, drainRate: drainRate)
        progress(
            "rep \(rep)/\(reps)  track() p50/p99/p99.9/max µs, no agent: \(LatencySample.text(idle)); "
                + "agent draining \(Report.grouped(Double(backlog))): \(LatencySample.text(draining))"
                + (leftAtEnd > 0 ? "" : " (the drain ended before the producer)")
                + " (drain \(Report.grouped(drainRate.beside))/s beside it, \(Report.grouped(drainRate.alone))/s after)"
                + "; C floor draining: \(LatencySample.text(floorDraining))"
                + (floorLeft > 0 ? "" : " (the drain ended before the producer)") + "; lock holds: \(holds.text)")
        return sample
    }

    /// The same producer beside the C floor's drain of a copy of the backlog (`lmdb-baseline drain`: the
    /// store's reads and deletes, a chunk at a time, the outbox's commits and gzip, with nothing else):
    /// what draining the store costs a producer whoever drains it. Returns the latencies and what the
    /// store still held when the producer's last call returned.
    private func floorLatencies(backlog: Int, events: Int, intervalMicros: Int) throws -> ([UInt64], Int) {
        let run = try prepareRun(events: backlog)
        defer { try? FileManager.default.removeItem(atPath: run.directory) }
        let floor = try startFloor(on: run, mapBytes: Self.floorMapBytes)
        let latencies = try producerLatencies(group: run.group, id: "app-floor", events: events, intervalMicros: intervalMicros) {
            _ = try Self.waitUntilDrainBegins(group: run.group, backlog: backlog, drainer: "the C floor")
        }
        let left = try Backlog.pendingInStore(group: run.group)
        let report = try floor.finish()
        guard report.events == backlog + events else {
            throw BenchFailure("the C floor drained \(report.events) of \(backlog + events).")
        }
        return (latencies, left)
    }

    /// Waits until `drainer` has taken its first events out of the `backlog` in `group`'s store (the
    /// producer tracks while the backlog drains, not while the drainer starts: its process, a new
    /// outbox), at most a minute; returns what the store still holds.
    private static func waitUntilDrainBegins(group: String, backlog: Int, drainer: String) throws -> Int {
        let started = Monotonic.nanos()
        while true {
            let left = try Backlog.pendingInStore(group: group)
            if left < backlog { return left }
            guard Monotonic.nanos() - started < 60_000_000_000 else {
                throw BenchFailure("\(drainer) did not start draining the backlog within a minute.")
            }
            usleep(5_000)
        }
    }

    /// The C floor's LMDB map for the latency runs' backlog (about 0.8 GB for 1,000,000 events) and the
    /// producer's events beside it.
    static let floorMapBytes = 4 << 30

    /// One paced producer's `track()` latencies, in nanoseconds; `starting` runs once it is ready, just
    /// before its first call.
    private func producerLatencies(
        group: String, id: String, events: Int, intervalMicros: Int, starting: () throws -> Void = {}
    ) throws -> [UInt64] {
        let producer = try ProducerProcess(
            name: id, executable: binDirectory + "/tributary-bench",
            arguments: [
                "worker", "--group", group, "--producer-id", id, "--events", "\(events)", "--interval-us", "\(intervalMicros)",
            ])
        try producer.waitUntilReady()
        try starting()
        try producer.start()
        return try producer.finish().latencyNanos
    }

    // MARK: Energy per event

    /// The agent's CPU and disk bytes per delivered event (`--once`, verified), and the C floor's CPU per
    /// event on a copy of the same backlog: the agent first with requests of a chunk's events (what the
    /// floor compresses at a time: like for like), then with its default batch size.
    func energyRun(_ rep: Int, of reps: Int, events: Int) throws -> EnergySample {
        let matched = try agentRun(
            events: events, deadline: nil,
            extraArguments: ["--batch-size", "\(chunk)", "--max-batch-bytes", "\(chunk * Self.batchBytesPerEvent)"])
        let floor = try floorRun(events: events)
        let defaults = try agentRun(events: events, deadline: nil)
        let sample = EnergySample(
            agentCPUSeconds: matched.exit.cpuSeconds, delivered: matched.delivered,
            agentWrittenBytes: matched.exit.writtenBytes, defaultCPUSeconds: defaults.exit.cpuSeconds,
            defaultDelivered: defaults.delivered, floorCPUSeconds: floor, floorEvents: events, eventBytes: recordSize)
        progress(
            "rep \(rep)/\(reps)  CPU per event: agent \(Report.decimal(sample.agentMicros, 1)) µs with requests of "
                + "\(chunk) (default batches: \(Report.decimal(sample.defaultMicros, 1)) µs), "
                + "C drain + gzip \(Report.decimal(sample.floorMicros, 1)) µs (x\(Report.decimal(sample.ratio, 2)), "
                + "x\(Report.decimal(sample.defaultRatio, 2))); agent wrote \(Report.decimal(sample.bytesPerEvent, 0)) bytes "
                + "per \(Report.decimal(recordSize, 0))-byte event (x\(Report.decimal(sample.writeAmplification, 2)))")
        return sample
    }

    /// Room per event in the like-for-like run's requests (`--max-batch-bytes`): a chunk's events always
    /// fit (a benchmark event is about 0.9 KiB with `_tributary`), so the count alone makes the batches.
    static let batchBytesPerEvent = 4096

    /// The C floor on a copy of an `events` backlog: its CPU seconds (drain into SQLite, gzip).
    private func floorRun(events: Int) throws -> Double {
        let run = try prepareRun(events: events)
        defer { try? FileManager.default.removeItem(atPath: run.directory) }
        let report = try startFloor(on: run, mapBytes: 1 << 30).finish()
        guard report.events == events else { throw BenchFailure("the C floor drained \(report.events) of \(events).") }
        return Double(report.cpuNanos ?? 0) / 1e9
    }

    /// Starts the C floor (`lmdb-baseline drain`: the store's reads and deletes a chunk at a time, the
    /// outbox's commits with `synchronous=FULL`, gzip at the agent's level) on `run`'s store, into a new
    /// outbox beside it, with an LMDB map of `mapBytes`.
    private func startFloor(on run: (directory: String, group: String), mapBytes: Int) throws -> ProducerProcess {
        guard mkdir(run.directory + "/outbox", 0o700) == 0 else { throw BenchFailure("mkdir outbox failed.") }
        let floor = try ProducerProcess(
            name: "C drain + gzip", executable: binDirectory + "/lmdb-baseline",
            arguments: [
                "drain", "--group", run.group, "--outbox", run.directory + "/outbox/outbox.sqlite", "--chunk", "\(chunk)",
                "--synchronous", "full", "--map-size", "\(mapBytes)", "--gzip-level", "1",
            ])
        try floor.waitUntilReady()
        try floor.start()
        return floor
    }
}

/// A loopback TCP port that was free a moment ago.
func freeLoopbackPort() throws -> UInt16 {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    defer { close(fd) }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    let rc = withUnsafeMutablePointer(to: &address) { p in
        p.withMemoryRebound(to: sockaddr.self, capacity: 1) { sa in bind(fd, sa, length) == 0 ? getsockname(fd, sa, &length) : -1 }
    }
    guard rc == 0 else { throw BenchFailure("no free loopback port.") }
    return UInt16(bigEndian: address.sin_port)
}
