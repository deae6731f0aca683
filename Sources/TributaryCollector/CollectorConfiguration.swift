/// How a ``Collector`` listens, authenticates, stores and misbehaves.
///
/// Every property has a documented default, so `CollectorConfiguration()` is an in-memory collector on
/// a free loopback port that accepts everything and injects no faults.
public struct CollectorConfiguration: Sendable {
    /// The address to bind. Default `127.0.0.1` (loopback only).
    public var host: String
    /// The TCP port to bind; `0` (the default) lets the system pick a free port.
    public var port: Int
    /// When set, every ingest request must carry `Authorization: Bearer <token>`, else it gets 401.
    /// Default `nil`: no authentication. `/stats`, `/events` and `/control/*` are never authenticated.
    public var token: String?
    /// The SQLite database file holding received events and counters (WAL mode, `synchronous=FULL`).
    /// Default `nil`: an in-memory database that disappears with the collector.
    public var databasePath: String?
    /// The largest ingest body accepted, both as sent and after decompression; larger bodies get 413.
    /// Default 16 MiB.
    public var maxBodyBytes: Int
    /// Faults to inject into ingest requests. Default: none. Replaceable at run time with
    /// ``Collector/setFaults(_:)`` or `POST /control/faults`.
    public var faults: FaultConfiguration

    /// The default ``maxBodyBytes``: 16 MiB.
    public static let defaultMaxBodyBytes = 16 << 20

    /// Creates a configuration; every argument has the default documented on its property.
    public init(
        host: String = "127.0.0.1",
        port: Int = 0,
        token: String? = nil,
        databasePath: String? = nil,
        maxBodyBytes: Int = CollectorConfiguration.defaultMaxBodyBytes,
        faults: FaultConfiguration = FaultConfiguration()
    ) {
        self.host = host
        self.port = port
        self.token = token
        self.databasePath = databasePath
        self.maxBodyBytes = maxBodyBytes
        self.faults = faults
    }

    /// Checks every value, naming the first one out of range.
    public func validate() throws(CollectorError) {
        guard !host.isEmpty else {
            throw CollectorError(.invalidConfiguration, "host is empty; give an address such as 127.0.0.1.")
        }
        guard (0...65535).contains(port) else {
            throw CollectorError(.invalidConfiguration, "port \(port) is outside 0...65535 (0 picks a free port).")
        }
        if let token, token.isEmpty {
            throw CollectorError(
                .invalidConfiguration,
                "The token (--token, or TRIBUTARY_COLLECTOR_TOKEN) is empty; omit it, or unset the variable, to disable authentication.")
        }
        guard maxBodyBytes > 0 else {
            throw CollectorError(.invalidConfiguration, "maxBodyBytes must be positive, got \(maxBodyBytes).")
        }
        try faults.validate()
    }
}
