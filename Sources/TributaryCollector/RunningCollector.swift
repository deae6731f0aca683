import Foundation
import Logging
import ServiceLifecycle

/// A collector started by ``Collector/withRunning(_:logger:_:)``, listening at ``url``.
public struct RunningCollector: Sendable {
    /// The base URL, `http://127.0.0.1:PORT`; post batches to `url + "/sa"` or `url + "/ingest"`.
    public let url: String
    /// The port the server listens on.
    public let port: Int
    /// The running collector itself.
    public let collector: Collector

    /// What the collector has received so far (the same figures as `GET /stats`).
    public func stats() async throws -> CollectorStats {
        try await collector.stats()
    }

    /// Unique events in arrival order: those with an arrival index above `after`, at most `limit` (nil: all).
    public func events(after: Int64 = 0, limit: Int? = nil) async throws -> [ReceivedEvent] {
        try await collector.events(after: after, limit: limit)
    }

    /// A user's profile properties, nil when the collector keeps no profile for `distinctID`.
    public func profile(of distinctID: String) async throws -> [String: Any]? {
        guard let text = try await collector.profileJSON(of: distinctID) else { return nil }
        let object = try JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any]
        return object?["properties"] as? [String: Any]
    }

    /// The faults in force.
    public var faults: FaultConfiguration {
        collector.faults
    }

    /// Replaces the faults in force and restarts the fault generator from `faults.seed`.
    ///
    /// - Throws: ``CollectorError`` with code `invalidConfiguration` when a value is out of range; the
    ///   faults in force are then unchanged.
    public func setFaults(_ faults: FaultConfiguration) async throws {
        try collector.setFaults(faults)
    }
}

extension Collector {
    /// Runs a collector for the duration of `body`, then shuts it down gracefully, even when `body` throws.
    ///
    /// The collector runs in its own `ServiceGroup`; `body` starts once the server listens. Use port 0
    /// (the default) so parallel tests never collide.
    ///
    /// ```swift
    /// try await Collector.withRunning(CollectorConfiguration()) { collector in
    ///     // POST to collector.url + "/ingest", then:
    ///     #expect(try await collector.stats().unique == 3)
    /// }
    /// ```
    ///
    /// - Parameters:
    ///   - configuration: the collector's configuration.
    ///   - logger: the collector's logger; by default only warnings and errors are logged.
    ///   - body: the work to do while the collector runs.
    /// - Returns: what `body` returns.
    /// - Throws: what `body` throws; ``CollectorError`` when the configuration is invalid, the database
    ///   cannot be opened or the server cannot listen.
    public static func withRunning<T: Sendable>(
        _ configuration: CollectorConfiguration,
        logger: Logger = Collector.quietLogger(),
        _ body: (RunningCollector) async throws -> T
    ) async throws -> T {
        let (urls, listening) = AsyncStream.makeStream(of: (url: String, port: Int).self)
        let collector = try Collector(configuration: configuration, logger: logger) { url, port in
            listening.yield((url, port))
            listening.finish()
        }
        let group = ServiceGroup(configuration: .init(services: [collector], logger: logger))
        return try await withThrowingTaskGroup(of: Void.self, returning: T.self) { tasks in
            tasks.addTask {
                defer { listening.finish() }
                try await group.run()
            }
            var iterator = urls.makeAsyncIterator()
            guard let address = await iterator.next() else {
                try await tasks.waitForAll()  // rethrows the server's own error, if it had one
                throw CollectorError(
                    .serverNotStarted,
                    "The collector stopped before listening on \(configuration.host):\(configuration.port)."
                )
            }
            let handle = RunningCollector(url: address.url, port: address.port, collector: collector)
            let result: T
            do {
                result = try await body(handle)
            } catch {
                await group.triggerGracefulShutdown()
                try? await tasks.waitForAll()
                throw error
            }
            await group.triggerGracefulShutdown()
            try await tasks.waitForAll()
            return result
        }
    }

    /// A logger for tests: label `tributary.collector`, warnings and errors only.
    public static func quietLogger() -> Logger {
        var logger = Logger(label: "tributary.collector")
        logger.logLevel = .warning
        return logger
    }
}
