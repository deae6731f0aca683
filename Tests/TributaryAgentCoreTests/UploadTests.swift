import Foundation
import Logging
import Testing
import Tributary
import TributaryCollector
import TributaryWire

@testable import TributaryAgentCore

/// The agent against the real reference collector on loopback. The tests are in `UploadTests+*.swift`, a file
/// per concern; the helpers those files (and other suites) use are here.
@Suite("Upload to the reference collector")
struct UploadTests {
    static let logger: Logger = {
        var logger = Logger(label: "agent-test")
        logger.logLevel = .warning
        return logger
    }()

    /// Fills a group with `count` events from two producers (an app and an extension), interleaved.
    static func produce(_ group: String, count: Int) async throws {
        let app = try Tracker(configuration: .init(groupDirectory: group, producerKind: .app))
        let ext = try Tracker(configuration: .init(groupDirectory: group, producerKind: .extension, producerID: "share"))
        try await withThrowingTaskGroup(of: Void.self) { tasks in
            for (tracker, half) in [(app, 0), (ext, 1)] {
                tasks.addTask {
                    for i in stride(from: half, to: count, by: 2) {
                        try await tracker.track(i % 97 == 13 ? "Poison" : "Ordinary", properties: ["i": .int(Int64(i))])
                    }
                }
            }
            try await tasks.waitForAll()
        }
    }

    static func agent(_ group: String, _ collector: RunningCollector, format: WireFormat = .sensors,
                      _ adjust: (inout AgentConfiguration) -> Void = { _ in }) throws -> Agent {
        try agent(group, serverURL: collector.url + "/sa", format: format, adjust)
    }

    /// An agent for `group` with fast backoff and polls, sending to `serverURL` (nil: none given).
    static func agent(_ group: String, serverURL: String?, format: WireFormat = .sensors,
                      _ adjust: (inout AgentConfiguration) -> Void = { _ in }) throws -> Agent {
        var config = AgentConfiguration(
            groupDirectory: group, serverURL: serverURL, outboxPath: group + "-state/outbox.sqlite")
        config.upload.format = format
        config.upload.backoff = Backoff(base: .milliseconds(5), cap: .milliseconds(40), maxRetryAfter: .milliseconds(50))
        config.upload.requestTimeout = .seconds(5)  // generous: a loaded 2-core machine must not cause resends
        config.pollInterval = .milliseconds(20)
        adjust(&config)
        return try Agent(configuration: config, logger: logger)
    }

    /// Polls `condition` every 20 ms until it holds or `seconds` pass (on a loaded 2-core machine an
    /// agent's turn can take seconds); returns whether it held.
    static func eventually(within seconds: Double = 30, _ condition: () async throws -> Bool) async throws -> Bool {
        let began = Date()
        while Date().timeIntervalSince(began) < seconds {
            if try await condition() { return true }
            try await Task.sleep(for: .milliseconds(20))
        }
        return try await condition()
    }

    /// Checks the collector holds exactly `count` unique events, each producer's in order, seq in order.
    static func expectDelivered(_ collector: RunningCollector, count: Int, sourceLocation: SourceLocation = #_sourceLocation) async throws {
        let stats = try await collector.stats()
        #expect(stats.unique == count, sourceLocation: sourceLocation)
        #expect(stats.orderViolations.values.reduce(0, +) == 0, sourceLocation: sourceLocation)
        #expect(stats.seqViolations == 0, sourceLocation: sourceLocation)
        let events = try await collector.events(limit: count + 10)
        #expect(events.compactMap(\.seq) == Array(1...UInt64(count)), "global order", sourceLocation: sourceLocation)
    }
}
