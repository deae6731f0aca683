import ArgumentParser
import Foundation
import Tributary
import TributaryStore

/// The options every simulated producer shares.
struct ProducerOptions: ParsableArguments {
    @Option(help: ArgumentHelp("The app group directory.", valueName: "dir"))
    var group: String

    @Option(name: .customLong("producer-id"), help: ArgumentHelp("Producer id (default: the kind).", valueName: "id"))
    var producerID: String?

    @Option(name: [.customLong("events"), .customLong("count")], parsing: .unconditional, help: "How many events to track (--count is an alias).")
    var events: Int = 100

    @Option(parsing: .unconditional, help: "Events per second (per caller); 0 = as fast as the store allows.")
    var rate: Double = 0

    @Option(parsing: .unconditional, help: "Seed of the scripted choices (same seed, same session).")
    var seed: UInt64 = 1

    @Option(help: ArgumentHelp("Append every acknowledged event to this file.", valueName: "path"))
    var ledger: String?

    @Option(name: .customLong("app-version"), help: "This process's $app_version (the main app publishes its presets).")
    var appVersion = "0.0.0"

    @Option(name: .customLong("store-quota"), parsing: .unconditional, help: ArgumentHelp("Largest size, in bytes, this producer lets the store grow to (default 1 GiB).", valueName: "bytes"))
    var storeQuota: Int?

    func validate() throws {
        guard events >= 0 else { throw ValidationError("--events must not be negative.") }
        guard rate == 0 || (rate >= 0.001 && rate.isFinite) else {
            throw ValidationError("--rate must be 0 (as fast as possible) or at least 0.001 events per second.")
        }
        if let storeQuota, storeQuota < SharedStore.minimumQuota {
            throw ValidationError("--store-quota must be at least \(SharedStore.minimumQuota) bytes, got \(storeQuota).")
        }
    }

    /// The pause between two events of one caller that `--rate` asks for, in nanoseconds.
    var pauseNanos: UInt64 { rate > 0 ? UInt64(1e9 / rate) : 0 }

    /// Opens the tracker, reporting a failure the way every simulator does (exit 74).
    func openTracker(kind: ProducerKind) throws -> Tracker {
        do {
            var configuration = Tracker.Configuration(groupDirectory: group, producerKind: kind, producerID: producerID)
            configuration.appVersion = appVersion
            if let storeQuota {
                configuration.store.quota = storeQuota
                configuration.store.initialMapSize = min(configuration.store.initialMapSize, storeQuota)
            }
            return try Tracker(configuration: configuration)
        } catch {
            throw producerFailure(error)
        }
    }
}

/// A load generator: one event name, as fast as asked, synchronous or group-committed.
struct Load: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "A load generator: tracks one event name N times, one transaction each or in group commits.")

    @OptionGroup var options: ProducerOptions

    @Option(help: "Producer kind: app or extension.")
    var kind: String = "app"

    @Option(help: "Event name to track.")
    var event: String = "SimEvent"

    @Option(parsing: .unconditional, help: "Concurrent async track() callers sharing group commits; 0 = synchronous track(), one transaction each.")
    var concurrency: Int = 0

    @Option(name: .customLong("interval-ms"), parsing: .unconditional, help: "Pause between events (per caller), in milliseconds (overrides --rate).")
    var intervalMillis: Int?

    func validate() throws {
        guard concurrency >= 0 else { throw ValidationError("--concurrency must not be negative.") }
        // A day at most: the pause is held in nanoseconds.
        if let intervalMillis, !(0...86_400_000).contains(intervalMillis) {
            throw ValidationError("--interval-ms must be 0 … 86400000 (a day), not \(intervalMillis).")
        }
        guard kind == "app" || kind == "extension" else { throw ValidationError("--kind must be app or extension, not '\(kind)'.") }
    }

    func run() async throws {
        let pause = intervalMillis.map { UInt64($0) * 1_000_000 } ?? options.pauseNanos
        try await produceLoad(options, kind: ProducerKind(name: kind) ?? .app, event: event, concurrency: concurrency, pause: pause)
    }
}

func produceLoad(_ options: ProducerOptions, kind: ProducerKind, event: String, concurrency: Int, pause: UInt64) async throws {
    let tracker = try options.openTracker(kind: kind)
    let ledger = try Ledger(path: options.ledger)
    FileHandle.standardOutput.write(Data("READY \(getpid())\n".utf8))
    let count = options.events
    do {
        if concurrency == 0 {
            for i in 0..<count {
                ledger.record(try trackDurably(tracker, event, index: i))
                if pause > 0 { try await Task.sleep(nanoseconds: pause) }
            }
        } else {
            try await withThrowingTaskGroup(of: Void.self) { group in
                for caller in 0..<concurrency {
                    group.addTask {
                        var i = caller
                        while i < count {
                            ledger.record(try await tracker.track(event, properties: ["index": .int(Int64(i))]))
                            if pause > 0 { try await Task.sleep(nanoseconds: pause) }
                            i += concurrency
                        }
                    }
                }
                try await group.waitForAll()
            }
        }
    } catch {
        throw producerFailure(error)
    }
}

/// One synchronous `track` (its own durable transaction), callable from async code.
func trackDurably(_ tracker: Tracker, _ event: String, index: Int) throws -> TrackReceipt {
    try tracker.track(event, properties: ["index": .int(Int64(index))])
}
