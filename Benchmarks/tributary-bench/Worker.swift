import ArgumentParser
import Foundation
import Tributary

/// One Swift producer process: opens a `Tracker`, waits for the driver's start signal, tracks
/// `--events` events and reports its latencies as one JSON line (see ``WorkerReport``).
struct Worker: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "One Swift producer process (started by the driver; prints READY, waits for GO on stdin).",
        shouldDisplay: false
    )

    @Option(help: ArgumentHelp("The app group directory.", valueName: "dir"))
    var group: String

    @Option(name: .customLong("producer-id"), help: ArgumentHelp("Producer id.", valueName: "id"))
    var producerID: String

    @Option(help: "How many events to track.")
    var events: Int

    @Option(help: "Concurrent async track() callers sharing group commits; 0 = synchronous track(), one transaction each.")
    var callers: Int = 0

    @Option(help: """
        With --callers: events each caller keeps in flight with enqueue(), awaiting the oldest receipt \
        when the window is full; 0 = each caller awaits every track() before the next.
        """)
    var window: Int = 0

    @Option(
        name: .customLong("interval-us"),
        help: "Without --callers: one track() every this many microseconds (an app's pace), 0 = back to back.")
    var intervalMicros: Int = 0

    @Option(name: .customLong("map-size"), help: ArgumentHelp("LMDB map size in bytes.", valueName: "bytes"))
    var mapSize: Int = 1 << 30

    @Flag(help: "After the last track() returned, print ENQUEUED <events> <seconds> and wait to be killed.")
    var hold = false

    @Flag(help: """
        Report no per-call latencies (the pipeline runs need none): encoding and decoding 500,000 of them \
        took about 0.9 s of CPU per run, while the agent and the collector were being measured.
        """)
    var noLatencies = false

    func validate() throws {
        guard events >= 0 else { throw ValidationError("--events must not be negative.") }
        guard callers >= 0 else { throw ValidationError("--callers must not be negative.") }
        guard window >= 0 else { throw ValidationError("--window must not be negative.") }
        guard window == 0 || callers > 0 else { throw ValidationError("--window needs --callers.") }
        guard mapSize > 0 else { throw ValidationError("--map-size must be positive.") }
        guard intervalMicros >= 0, intervalMicros == 0 || callers == 0 else {
            throw ValidationError("--interval-us must not be negative, and goes without --callers.")
        }
    }

    func run() async throws {
        var configuration = Tracker.Configuration(groupDirectory: group, producerID: producerID)
        // The driver sizes the map for the whole run, so neither Swift nor C pays for map growth.
        configuration.store.initialMapSize = mapSize
        configuration.store.quota = mapSize
        let tracker = try Tracker(configuration: configuration)

        writeLine("READY \(getpid())")
        guard readLine() == "GO" else {
            writeError("tributary-bench worker: expected GO on stdin, the driver went away")
            throw ExitCode.failure
        }
        let start = Monotonic.nanos()
        let cpuStart = ResourceUsage.cpuNanos()
        let latencies =
            callers == 0
            ? try trackOneByOne(tracker) : window == 0 ? try await trackConcurrently(tracker) : try await enqueueConcurrently(tracker)
        let end = Monotonic.nanos()
        if hold {
            // Every track() above returned: each of these events is durable. The driver SIGKILLs us now.
            writeLine("ENQUEUED \(latencies.count) \(Double(end - start) / 1e9)")
            waitToBeKilled()
        }

        let report = WorkerReport(
            lang: "swift", producer: producerID, pid: getpid(), events: latencies.count, txns: nil,
            startNanos: start, endNanos: end, latencyNanos: noLatencies ? [] : latencies,
            cpuNanos: ResourceUsage.cpuNanos() - cpuStart)
        FileHandle.standardOutput.write(try JSONEncoder().encode(report) + Data("\n".utf8))
    }

    /// Synchronous `track`: one durable write transaction per call.
    private func trackOneByOne(_ tracker: Tracker) throws -> [UInt64] {
        var latencies: [UInt64] = []
        latencies.reserveCapacity(events)
        let start = Monotonic.nanos()
        for index in 0..<events {
            let properties = BenchEvent.properties(index: index)
            // At the app's pace: each call at its slot, or at once when the last one ran late.
            let slot = start + UInt64(index * intervalMicros) * 1000
            let now = Monotonic.nanos()
            if slot > now { usleep(UInt32((slot - now) / 1000)) }
            let t0 = Monotonic.nanos()
            try tracker.track(BenchEvent.name, properties: properties)
            latencies.append(Monotonic.nanos() - t0)
        }
        return latencies
    }

    /// Async `track` from `callers` concurrent tasks: group commit shares transactions among them.
    private func trackConcurrently(_ tracker: Tracker) async throws -> [UInt64] {
        let callers = self.callers
        let events = self.events
        return try await withThrowingTaskGroup(of: [UInt64].self) { group in
            for caller in 0..<callers {
                group.addTask {
                    var latencies: [UInt64] = []
                    latencies.reserveCapacity(events / callers + 1)
                    for index in stride(from: caller, to: events, by: callers) {
                        let properties = BenchEvent.properties(index: index)
                        let t0 = Monotonic.nanos()
                        try await tracker.track(BenchEvent.name, properties: properties)
                        latencies.append(Monotonic.nanos() - t0)
                    }
                    return latencies
                }
            }
            var all: [UInt64] = []
            all.reserveCapacity(events)
            for try await latencies in group { all += latencies }
            return all
        }
    }
}

extension Worker {
    /// `callers` concurrent tasks, each keeping `window` events in flight with `enqueue`: a caller
    /// awaits its oldest receipt only when its window is full, so one transaction carries the events
    /// of many callers' windows. Latency: from `enqueue` to the receipt (the event durable).
    fileprivate func enqueueConcurrently(_ tracker: Tracker) async throws -> [UInt64] {
        let (callers, events, window) = (self.callers, self.events, self.window)
        return try await withThrowingTaskGroup(of: [UInt64].self) { group in
            for caller in 0..<callers {
                group.addTask {
                    var latencies: [UInt64] = []
                    latencies.reserveCapacity(events / callers + 1)
                    var inFlight: [(pending: PendingTrack, queuedAt: UInt64)] = []
                    inFlight.reserveCapacity(window)
                    var oldest = 0
                    func settleOldest() async throws {
                        let (pending, queuedAt) = inFlight[oldest]
                        _ = try await pending.receipt()
                        latencies.append(Monotonic.nanos() - queuedAt)
                        oldest += 1
                    }
                    for index in stride(from: caller, to: events, by: callers) {
                        if inFlight.count - oldest == window { try await settleOldest() }
                        if oldest == window {
                            inFlight.removeFirst(oldest)
                            oldest = 0
                        }
                        let queuedAt = Monotonic.nanos()
                        let pending = try await tracker.enqueue(BenchEvent.name, properties: BenchEvent.properties(index: index))
                        inFlight.append((pending, queuedAt))
                    }
                    while oldest < inFlight.count { try await settleOldest() }
                    return latencies
                }
            }
            var all: [UInt64] = []
            all.reserveCapacity(events)
            for try await latencies in group { all += latencies }
            return all
        }
    }
}

/// Sleeps until a signal ends the process.
func waitToBeKilled() -> Never {
    while true { sleep(60) }
}

/// The event every benchmark producer tracks: a product purchase with a handful of typical properties.
enum BenchEvent {
    static let name = "BuyProduct"

    static func properties(index: Int) -> [String: PropertyValue] {
        [
            "product_id": .string("SKU-\(100_000 + index % 900_000)"),
            "product_name": "Loose-leaf green tea, 500 g tin",
            "product_category": "groceries/tea",
            "price": 12.5,
            "quantity": .int(Int64(1 + index % 3)),
            "in_stock": true,
            "screen": "ProductDetail",
            "index": .int(Int64(index)),
        ]
    }
}
