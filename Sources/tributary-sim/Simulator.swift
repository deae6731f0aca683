import ArgumentParser
import Foundation
import Tributary
import TributaryStore

@main
struct Simulator: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "tributary-sim",
        abstract: "Simulated producer processes that write events into an app group's shared store.",
        discussion: """
            Each subcommand is one producer process. With --ledger, every event acknowledged as durable \
            is appended to a file (producer_seq, seq, event_id per line), so tests can check that \
            nothing acknowledged was lost even when the process is killed.
            """,
        subcommands: [App.self, Extension.self, Demo.self]
    )
}

struct ProducerOptions: ParsableArguments {
    @Option(help: ArgumentHelp("The app group directory.", valueName: "dir"))
    var group: String

    @Option(name: .customLong("producer-id"), help: ArgumentHelp("Producer id (default: the kind).", valueName: "id"))
    var producerID: String?

    @Option(help: "How many events to track.")
    var count: Int = 100

    @Option(help: "Event name to track.")
    var event: String = "SimEvent"

    @Option(help: "Concurrent async track() callers sharing group commits; 0 = synchronous track(), one transaction each.")
    var concurrency: Int = 0

    @Option(help: ArgumentHelp("Append every acknowledged event to this file.", valueName: "path"))
    var ledger: String?

    @Option(name: .customLong("interval-ms"), help: "Pause between events (per caller), in milliseconds.")
    var intervalMillis: Int = 0

    func validate() throws {
        guard count >= 0 else { throw ValidationError("--count must not be negative.") }
        guard concurrency >= 0 else { throw ValidationError("--concurrency must not be negative.") }
    }
}

struct App: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "The main app: tracks events as the user works.")
    @OptionGroup var options: ProducerOptions

    func run() async throws {
        try await produce(options, kind: .app)
    }
}

struct Extension: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "A short-lived app extension: tracks a few events and exits.")
    @OptionGroup var options: ProducerOptions

    func run() async throws {
        try await produce(options, kind: .extension)
    }
}

/// Appends acknowledged events to a ledger file, one `write` per line so a kill loses at most a line
/// that was never acknowledged to anyone.
final class Ledger: Sendable {
    private let handle: FileHandle?

    init(path: String?) throws {
        guard let path else {
            handle = nil
            return
        }
        if !FileManager.default.fileExists(atPath: path) {
            _ = FileManager.default.createFile(atPath: path, contents: nil)
        }
        let h = try FileHandle(forWritingTo: URL(fileURLWithPath: path))
        h.seekToEndOfFile()
        handle = h
    }

    func record(_ receipt: TrackReceipt) {
        handle?.write(Data("\(receipt.producerSeq) \(receipt.seq) \(receipt.eventID)\n".utf8))
    }
}

func produce(_ options: ProducerOptions, kind: ProducerKind) async throws {
    let tracker: Tracker
    do {
        tracker = try Tracker(
            configuration: .init(groupDirectory: options.group, producerKind: kind, producerID: options.producerID))
    } catch {
        FileHandle.standardError.write(Data("tributary-sim: \(error)\n".utf8))
        throw ExitCode(74)
    }
    let ledger = try Ledger(path: options.ledger)
    FileHandle.standardOutput.write(Data("READY \(getpid())\n".utf8))
    let pause = UInt64(max(0, options.intervalMillis)) * 1_000_000
    do {
        if options.concurrency == 0 {
            for i in 0..<options.count {
                ledger.record(try trackDurably(tracker, options.event, index: i))
                if pause > 0 { try await Task.sleep(nanoseconds: pause) }
            }
        } else {
            let callers = options.concurrency
            try await withThrowingTaskGroup(of: Void.self) { group in
                for caller in 0..<callers {
                    group.addTask {
                        var i = caller
                        while i < options.count {
                            ledger.record(try await tracker.track(options.event, properties: ["index": .int(Int64(i))]))
                            if pause > 0 { try await Task.sleep(nanoseconds: pause) }
                            i += callers
                        }
                    }
                }
                try await group.waitForAll()
            }
        }
    } catch {
        FileHandle.standardError.write(Data("tributary-sim: \(error)\n".utf8))
        throw ExitCode(error is TrackingError ? 65 : 74)
    }
}

/// One synchronous `track` (its own durable transaction), callable from async code.
func trackDurably(_ tracker: Tracker, _ event: String, index: Int) throws -> TrackReceipt {
    try tracker.track(event, properties: ["index": .int(Int64(index))])
}
