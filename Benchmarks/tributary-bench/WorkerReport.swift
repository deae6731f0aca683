import Foundation

/// What one producer process (Swift ``Worker`` or C `lmdb-baseline`) or drain process (``DrainWorker`` or
/// `lmdb-baseline drain`) reports: one JSON line on stdout.
///
/// Times are `CLOCK_MONOTONIC` nanoseconds, which every process of the machine shares, so the driver
/// can measure a run from its common start signal to the last process's end.
struct WorkerReport: Codable, Sendable {
    /// `swift` or `c`.
    var lang: String
    /// The producer id the process wrote under.
    var producer: String
    var pid: Int32
    /// Events written (and acknowledged as durable).
    var events: Int
    /// Write transactions, when the process knows them (C does; Swift's group commit hides them).
    var txns: Int?
    /// When the process received the start signal.
    var startNanos: UInt64
    /// When its last event was durable.
    var endNanos: UInt64
    /// Swift: one entry per `track` call (call to return). C: one entry per transaction (begin to commit).
    /// Drain processes: C one entry per chunk, Swift none.
    var latencyNanos: [UInt64]
    /// Drain processes: user + system CPU time between the start signal and the end.
    var cpuNanos: UInt64? = nil
    /// Drain processes: peak resident set size (`ru_maxrss`), KiB.
    var maxRSSKB: Int? = nil

    enum CodingKeys: String, CodingKey {
        case lang, producer, pid, events, txns
        case startNanos = "start_ns"
        case endNanos = "end_ns"
        case latencyNanos = "latency_ns"
        case cpuNanos = "cpu_ns"
        case maxRSSKB = "max_rss_kb"
    }
}

/// `CLOCK_MONOTONIC`, in nanoseconds (the clock `lmdb-baseline` uses too).
enum Monotonic {
    @inline(__always)
    static func nanos() -> UInt64 {
        var ts = timespec()
        clock_gettime(CLOCK_MONOTONIC, &ts)
        return UInt64(ts.tv_sec) &* 1_000_000_000 &+ UInt64(ts.tv_nsec)
    }
}

/// Writes `line` and a newline to stdout, unbuffered (the driver reads it through a pipe).
func writeLine(_ line: String) {
    FileHandle.standardOutput.write(Data((line + "\n").utf8))
}

/// Writes `line` and a newline to stderr.
func writeError(_ line: String) {
    FileHandle.standardError.write(Data((line + "\n").utf8))
}
