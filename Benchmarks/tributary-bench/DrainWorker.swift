import ArgumentParser
import Foundation
import Logging
import TributaryAgentCore
import TributaryStore

/// One Swift drain process: opens the group's store and a fresh outbox as the agent does, waits for
/// the driver's start signal, runs `Drainer.drainAvailable()` and reports as one JSON line (see
/// ``WorkerReport``; `lmdb-baseline drain` is its C counterpart).
struct DrainWorker: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "drain-worker",
        abstract: "One Swift drain process (started by the driver; prints READY, waits for GO on stdin).",
        shouldDisplay: false
    )

    @Option(help: ArgumentHelp("The app group directory.", valueName: "dir"))
    var group: String

    @Option(help: ArgumentHelp("The outbox file to create.", valueName: "path"))
    var outbox: String

    @Option(help: "Events per drain transaction.")
    var chunk: Int = 1000

    func validate() throws {
        guard chunk >= 1 else { throw ValidationError("--chunk must be at least 1.") }
    }

    func run() throws {
        // The store with the agent's own options (Agent.init), and the agent's outbox.
        let store = try SharedStore(groupDirectory: group)
        let outbox = try Outbox(path: outbox)
        var logger = Logger(label: "tributary-bench.drain")
        logger.logLevel = .warning
        // The agent's drain: each chunk's store delete on the deletes' own thread, waited for.
        let deletes = StoreDeletes(logger: logger)
        let drainer = Drainer(store: store, outbox: outbox, chunkSize: chunk, logger: logger, deletes: deletes)

        writeLine("READY \(getpid())")
        guard readLine() == "GO" else {
            writeError("tributary-bench drain-worker: expected GO on stdin, the driver went away")
            throw ExitCode.failure
        }
        let cpuStart = ResourceUsage.cpuNanos()
        let start = Monotonic.nanos()
        var moved = try drainer.drainAvailable()
        // A delete slower than the deletes' patience (a slow fsync) pauses the drain: wait for it, as
        // the agent's next loop would, and go on.
        while drainer.isPaused {
            _ = deletes.awaitPending(upTo: .seconds(3600))
            moved += try drainer.drainAvailable()
        }
        let end = Monotonic.nanos()
        let cpu = ResourceUsage.cpuNanos() - cpuStart

        let report = WorkerReport(
            lang: "swift", producer: "drain", pid: getpid(), events: moved, txns: (moved + chunk - 1) / chunk,
            startNanos: start, endNanos: end, latencyNanos: [], cpuNanos: cpu, maxRSSKB: ResourceUsage.maxRSSKB())
        FileHandle.standardOutput.write(try JSONEncoder().encode(report) + Data("\n".utf8))
    }
}

/// This process's resource usage (`getrusage(RUSAGE_SELF)`).
enum ResourceUsage {
    /// User + system CPU time so far, in nanoseconds.
    static func cpuNanos() -> UInt64 {
        var usage = rusage()
        getrusage(Int32(RUSAGE_SELF.rawValue), &usage)
        return nanos(usage.ru_utime) + nanos(usage.ru_stime)
    }

    /// This process's own peak resident set size so far, in KiB: VmHWM of /proc/self/status. Not
    /// `ru_maxrss`, which after a `posix_spawn` (vfork + exec) also holds the parent's peak at the exec.
    static func maxRSSKB() -> Int {
        let status = (try? String(contentsOfFile: "/proc/self/status", encoding: .utf8)) ?? ""
        return MemorySampler.field("VmHWM:", in: status)
    }

    static func nanos(_ time: timeval) -> UInt64 {
        UInt64(time.tv_sec) * 1_000_000_000 + UInt64(time.tv_usec) * 1000
    }
}
