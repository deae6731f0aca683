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
    /// The most events one ingest request may carry; a request with more gets 413 (`too_large`), which
    /// the agent answers by splitting the batch. Default 100,000. Each event's scan holds a few hundred
    /// bytes until the request is answered, so this bounds what a request of many tiny elements costs.
    public var maxEventsPerRequest: Int
    /// Faults to inject into ingest requests. Default: none. Replaceable at run time with
    /// ``Collector/setFaults(_:)`` or `POST /control/faults`.
    public var faults: FaultConfiguration
    /// TLS (https), with or without client certificates. Default `nil`: plain http.
    public var tls: CollectorTLS?

    /// The default ``maxBodyBytes``: 16 MiB.
    public static let defaultMaxBodyBytes = 16 << 20
    /// The default ``maxEventsPerRequest``: 100,000.
    public static let defaultMaxEventsPerRequest = 100_000

    /// Creates a configuration; every argument has the default documented on its property.
    public init(
        host: String = "127.0.0.1",
        port: Int = 0,
        token: String? = nil,
        databasePath: String? = nil,
        maxBodyBytes: Int = CollectorConfiguration.defaultMaxBodyBytes,
        maxEventsPerRequest: Int = CollectorConfiguration.defaultMaxEventsPerRequest,
        faults: FaultConfiguration = FaultConfiguration()
    ) {
        self.host = host
        self.port = port
        self.token = token
        self.databasePath = databasePath
        self.maxBodyBytes = maxBodyBytes
        self.maxEventsPerRequest = maxEventsPerRequest
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
        // What a request presents is trimmed (as the agent trims its --auth-token-file), and a header
        // carries printable ASCII only: any other token would be refused on every request, with 401.
        if let token, token.first == " " || token.last == " "
            || !token.utf8.allSatisfy({ (0x20...0x7E).contains($0) })
        {
            throw CollectorError(
                .invalidConfiguration,
                "The token (--token, or TRIBUTARY_COLLECTOR_TOKEN) must be printable ASCII with no space at either end "
                    + "(\(token.utf8.count) bytes given): no request could present it, so every one would get 401.")
        }
        guard maxBodyBytes > 0 else {
            throw CollectorError(
                .invalidConfiguration, "--max-body-bytes (maxBodyBytes) must be positive, got \(maxBodyBytes).")
        }
        guard maxEventsPerRequest > 0 else {
            throw CollectorError(
                .invalidConfiguration,
                "--max-request-events (maxEventsPerRequest) must be positive, got \(maxEventsPerRequest).")
        }
        try faults.validate()
        _ = try tls?.serverConfiguration()
    }
}
