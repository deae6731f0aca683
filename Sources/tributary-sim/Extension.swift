import ArgumentParser
import Foundation
import Tributary

/// A short-lived app extension process (a share extension, a widget, a notification service).
///
/// It opens the group's store, tracks a few events with code tracking only (no autotrack, no
/// lifecycle events), each durably committed with its own trigger time and in program order, and
/// exits. The app's identity and preset properties are added when the agent drains the events
/// (`Enricher`), not here: an extension may run before the main app ever has.
struct Extension: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "A short-lived app extension: tracks a few events (code tracking only) and exits within a second.")

    /// The events an extension tracks, chosen by --seed.
    static let eventNames = ["ShareItem", "WidgetRefresh", "NotificationReceived"]
    /// The longest an extension may run: it is done within a second, like an iOS extension.
    static let maxRunSeconds = 1.0

    @OptionGroup var options: ProducerOptions

    func validate() throws {
        guard options.events <= 100 else { throw ValidationError("--events: an extension tracks at most 100 events.") }
        guard options.rate == 0 || Double(options.events) / options.rate < Self.maxRunSeconds else {
            throw ValidationError(
                "--events \(options.events) at --rate \(options.rate) takes over \(Self.maxRunSeconds) s; an extension exits within a second."
            )
        }
    }

    func run() async throws {
        let tracker = try options.openTracker(kind: .extension)
        let ledger = try Ledger(path: options.ledger)
        let pause = options.pauseNanos
        FileHandle.standardOutput.write(Data("READY \(getpid())\n".utf8))
        do {
            for index in 0..<options.events {
                let name = Self.eventNames[Int((options.seed &+ UInt64(index)) % UInt64(Self.eventNames.count))]
                ledger.record(try trackExtensionEvent(tracker, name, index: index))
                if pause > 0 && index + 1 < options.events { try await Task.sleep(nanoseconds: pause) }
            }
        } catch {
            throw producerFailure(error)
        }
    }
}

/// One synchronous, durable `track` of an extension event, callable from async code.
func trackExtensionEvent(_ tracker: Tracker, _ name: String, index: Int) throws -> TrackReceipt {
    try tracker.track(name, properties: ["index": .int(Int64(index))])
}
