import TributaryWire

/// How the agent talks to the collector.
public struct UploadConfiguration: Sendable {
    /// Where batches are POSTed; nil until one is known (the group's settings may give it later:
    /// nothing is sent meanwhile).
    public var serverURL: String?
    /// The body format. Default `.sensors`.
    public var format: WireFormat = .sensors
    /// Most events per batch. Default 500.
    public var batchSize: Int = 500
    /// Most uncompressed event bytes per batch. Default 1 MiB.
    public var maxBatchBytes: Int = 1 << 20
    /// gzip level of request bodies, 1 (fastest) … 9 (smallest). Default 1: see docs/performance.md.
    public var gzipLevel: Int32 = 1
    /// Retry policy for 408, 429, 5xx and transport errors.
    public var backoff = Backoff()
    /// Events dead-lettered in a row (none delivered between them) after which uploads halt instead
    /// of dead-lettering the next one. A collector that refuses every event (a wrong `--format`, a
    /// proxy that answers 400, a body limit below any event) would otherwise move the whole backlog
    /// to dead letters, each after its own bisection. While halted, the refused event is sent alone
    /// again at the backoff cap: delivered, uploads go on; refused again, it is dead-lettered and the
    /// next refused event halts again, so a long run of truly bad events still passes, one per
    /// interval. 0: never halt. Default 10.
    public var haltAfterDeadLetters = 10
    /// How long one request may take. Default 30 s.
    public var requestTimeout: Duration = .seconds(30)
    /// Sent as `Authorization: Bearer …` when set.
    public var bearerToken: String?
    /// TLS for `https://` collectors: trusted roots, client certificate, pins. Default: the system's
    /// roots, no client certificate, no pins (TLS 1.2 or later in every case).
    public var tls = TLSSettings()
    /// The HTTP proxies. Default none (`tributary-agent` reads the environment's `HTTPS_PROXY`…).
    public var proxy = ProxySettings()
    /// ``tls`` loaded from its files (the agent does so when it starts, refusing bad files with exit 78).
    var loadedTLS: TLSSettings.Loaded?
    /// How old a batch read ahead may be when its turn comes: an older one is built again, so that
    /// its `_flush_time` and `Date` say when it was sent (it waits for the next upload, which may be
    /// a flush interval away). Default 1 s.
    var readAheadMaxAge: Duration = .seconds(1)

    /// A configuration for `serverURL` with defaults for the rest.
    public init(serverURL: String?) { self.serverURL = serverURL }
}
