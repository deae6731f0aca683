import Foundation

/// Which producer implementation a run uses.
enum Language: String, Sendable {
    case swift, c
}

/// How producers commit.
enum Mode: String, CaseIterable, Sendable {
    /// Synchronous `track`: one durable write transaction per event.
    case single
    /// Group commit: concurrent callers, each keeping a window of events in flight with `enqueue`
    /// and awaiting its oldest receipt when the window is full (C: fixed-size batches).
    case group
    /// Group commit: concurrent async `track` callers, each awaiting every event before its next
    /// (at most one event per caller in a transaction; C: fixed-size batches).
    case awaited
}

/// One run: `processes` producer processes of one language, each writing `eventsPerProcess` events.
struct RunSpec: Sendable {
    var language: Language
    var mode: Mode
    var processes: Int
    var eventsPerProcess: Int
    /// Swift group commit: concurrent `track` callers per process.
    var callers: Int
    /// Swift `group` mode: events each caller keeps in flight.
    var window: Int
    /// C: events per transaction.
    var batch: Int
    /// C: bytes per record (measured from the Swift run it is paired with).
    var recordSize: Int
}

/// What one run measured, after its store was verified.
struct RunResult: Sendable {
    /// Events of every process / (last process done − common start).
    var eventsPerSecond: Double
    /// Latencies of every process, merged. Swift: per `track` call; C: per transaction.
    var p50Micros: Double
    var p99Micros: Double
    var maxMicros: Double
    /// Write transactions the run committed (from LMDB's transaction id).
    var transactions: Int
    /// Events per transaction.
    var meanBatch: Double
    /// Mean record size in the store, in bytes.
    var meanRecordSize: Double
    /// When each process finished, in seconds after the common start, earliest first.
    var finishSeconds: [Double]

    /// First process done / last process done: 1 when the processes progressed together, 1/P when
    /// each ran to its end before the next got the writer lock.
    var overlap: Double {
        guard let first = finishSeconds.first, let last = finishSeconds.last, last > 0 else { return 1 }
        return first / last
    }
}

/// Runs producer processes against fresh stores under one scratch directory.
final class Runner {
    let binDirectory: String
    let scratch: String
    let mapSize: Int
    private var runs = 0

    init(binDirectory: String, scratch: String, mapSize: Int) {
        self.binDirectory = binDirectory
        self.scratch = scratch
        self.mapSize = mapSize
    }

    func run(_ spec: RunSpec) throws -> RunResult {
        runs += 1
        let runDirectory = scratch + "/run-\(runs)"
        let group = runDirectory + "/group"
        defer { try? FileManager.default.removeItem(atPath: runDirectory) }
        try StoreCheck.prepare(group: group, mapSize: mapSize)

        let producerIDs = (1...spec.processes).map { "bench-\($0)" }
        let children = try producerIDs.map { id in
            try ProducerProcess(
                name: "\(spec.language.rawValue) producer \(id)", executable: executable(for: spec.language),
                arguments: arguments(for: spec, producerID: id, group: group))
        }
        for child in children { try child.waitUntilReady() }

        // Every process has opened the store; from here on, only appends commit.
        let firstTransaction = try StoreCheck.lastTransactionID(group: group)
        let start = Monotonic.nanos()
        for child in children { try child.start() }
        let reports = try children.map { try $0.finish() }
        let transactions = try StoreCheck.lastTransactionID(group: group) - firstTransaction

        let expected = Dictionary(uniqueKeysWithValues: producerIDs.map { ($0, spec.eventsPerProcess) })
        let contents = try StoreCheck.verify(group: group, mapSize: mapSize, expected: expected)
        let reported = reports.reduce(0) { $0 + $1.events }
        guard reported == contents.events else {
            throw BenchFailure("The producers reported \(reported) events; the store holds \(contents.events).")
        }
        if spec.language == .c {
            let reportedTransactions = reports.reduce(0) { $0 + ($1.txns ?? 0) }
            guard reportedTransactions == transactions else {
                throw BenchFailure("C producers reported \(reportedTransactions) transactions; LMDB counted \(transactions).")
            }
        }

        let end = reports.map(\.endNanos).max() ?? start
        let latencies = reports.flatMap(\.latencyNanos)
        return RunResult(
            eventsPerSecond: Double(contents.events) / (Double(end - start) / 1e9),
            p50Micros: Double(Statistics.percentile(50, of: latencies)) / 1000,
            p99Micros: Double(Statistics.percentile(99, of: latencies)) / 1000,
            maxMicros: Double(latencies.max() ?? 0) / 1000,
            transactions: transactions,
            meanBatch: transactions == 0 ? 0 : Double(contents.events) / Double(transactions),
            meanRecordSize: contents.meanRecordSize,
            finishSeconds: reports.map { Double($0.endNanos - start) / 1e9 }.sorted())
    }

    func executable(for language: Language) -> String {
        binDirectory + "/" + (language == .swift ? "tributary-bench" : "lmdb-baseline")
    }

    private func arguments(for spec: RunSpec, producerID: String, group: String) -> [String] {
        let common = ["--group", group, "--producer-id", producerID, "--events", "\(spec.eventsPerProcess)",
                      "--map-size", "\(mapSize)"]
        switch spec.language {
        case .swift:
            return ["worker"] + common + [
                "--callers", "\(spec.mode == .single ? 0 : spec.callers)", "--window", "\(spec.mode == .group ? spec.window : 0)",
            ]
        case .c:
            return common + ["--batch", "\(spec.mode == .single ? 1 : spec.batch)", "--record-size", "\(spec.recordSize)"]
        }
    }
}
