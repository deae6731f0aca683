import Foundation
import GRDB
import TributaryCollector

/// The reference collector as a real process inside the collector's network namespace
/// (``NetworkNamespaces``), listening on its veth address, storing into a database file the test
/// reads: while it runs, how many batches it accepted (``batches()``); once stopped, everything
/// the oracle needs (``observed()``).
public final class NamespacedCollector: Sendable {
    /// Its base URL (`http://10.231.0.2:PORT`).
    public let url: String
    /// Its port.
    public let port: Int
    /// Its database file.
    public let database: String
    private let process: ChildProcess
    private let reader: DatabaseQueue

    /// Starts `tributary-collector` in `net`'s collector namespace with its database at `database`
    /// and `arguments` besides (faults such as `--latency-ms`), and waits for its `LISTENING` line.
    public init(_ net: NetworkNamespaces, database: String, _ arguments: [String] = []) async throws {
        self.database = database
        process = try net.start(
            "tributary-collector", in: net.collector,
            ["--host", net.collectorAddress, "--port", "0", "--db", database, "--log-level", "warning"] + arguments)
        guard let line = await process.waitForLine(startingWith: "LISTENING "),
            let port = line.split(separator: ":").last.flatMap({ Int($0) })
        else {
            process.send(SIGKILL)
            let result = await process.finish()
            throw NotStarted(stderr: result.stderr)
        }
        self.port = port
        url = "http://\(net.collectorAddress):\(port)"
        var configuration = Configuration()
        configuration.readonly = true
        reader = try DatabaseQueue(path: database, configuration: configuration)
    }

    /// Batches it accepted so far, a batch sent again included (its counter, read from its database
    /// while it runs).
    public func batches() throws -> Int { try counter("batches") }

    /// One of its counters (`batches`, `repeated_batches`: a batch sent again, its answer lost, …).
    public func counter(_ name: String) throws -> Int {
        try reader.read { db in try Int.fetchOne(db, sql: "SELECT value FROM counters WHERE name = ?", arguments: [name]) ?? 0 }
    }

    /// Waits until it accepted more than `count` batches, polling every 10 ms for at most `limit`;
    /// returns when it saw that, or nil.
    public func waitForBatches(moreThan count: Int, within limit: Duration) async throws -> ContinuousClock.Instant? {
        let end = ContinuousClock.now + limit
        while ContinuousClock.now < end {
            if try batches() > count { return .now }
            try await Task.sleep(for: .milliseconds(10))
        }
        return nil
    }

    /// Stops it (SIGTERM: a graceful shutdown) and returns its exit status and stderr.
    @discardableResult
    public func stop() async -> (status: Int32, stderr: String) {
        process.send(SIGTERM)
        let limit = process.killAfter(.seconds(10))
        defer { limit.cancel() }
        let result = await process.finish()
        return (result.status, result.stderr)
    }

    /// What it stored, read through a collector made on its database (stop it first).
    public func observed() async throws -> Oracle.Observed {
        let collector = try Collector(configuration: CollectorConfiguration(databasePath: database))
        return try await Oracle.Observed.from(collector)
    }

    /// The collector did not say it listens.
    public struct NotStarted: Error, CustomStringConvertible {
        public var stderr: String
        public var description: String { "tributary-collector did not start in its namespace: \(stderr)" }
    }
}
