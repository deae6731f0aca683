/// The faults a ``Collector`` injects into ingest requests (`POST /sa`, `POST /ingest`).
///
/// Random decisions (failure, hang, reset, lost acknowledgement) come from a generator seeded with
/// ``seed``: the same seed and rates give the same sequence of decisions for the same sequence of
/// requests. Replacing the faults (``Collector/setFaults(_:)``, `POST /control/faults`) restarts the
/// generator from the new seed.
///
/// In JSON (`/control/faults`) the keys are snake_case (`failure_rate`, `lost_ack_rate`, …); missing
/// keys take their defaults and unknown keys are an error.
public struct FaultConfiguration: Sendable, Codable, Equatable {
    /// Seeds the fault generator. Default 0.
    public var seed: UInt64
    /// Probability (0…1) that a request is answered with ``failureStatus`` and nothing is stored. Default 0.
    public var failureRate: Double
    /// The status of an injected failure. Default 503.
    public var failureStatus: Int
    /// The raw `Retry-After` header value sent with injected failures and forced statuses (`"2"`, or an
    /// HTTP date). Default none.
    public var retryAfter: String?
    /// Milliseconds of delay added before every ingest response (after any commit). Default 0.
    public var latencyMillis: Int
    /// Probability (0…1) that a request is read and then never answered, until the client closes the
    /// connection or the collector shuts down; the connection is then closed. Nothing is stored. Default 0.
    public var hangRate: Double
    /// Probability (0…1) that the connection is reset (TCP RST) after the request is read, before any
    /// response. Nothing is stored. Default 0.
    public var resetRate: Double
    /// Probability (0…1) that the events are committed and then the connection is reset without a
    /// response: a lost acknowledgement. The client must retry, and the retry is deduplicated. Default 0.
    public var lostAckRate: Double
    /// A regular expression searched for in each event's name (`event`); a batch with a matching event is
    /// rejected with ``poisonStatus`` and an error naming the first offending index. Default none.
    public var poisonPattern: String?
    /// The status of a poisoned batch. Default 400.
    public var poisonStatus: Int
    /// When set, a batch with more events than this is rejected with 413. Default none.
    public var maxEventsPerBatch: Int?
    /// When set, every ingest request is answered with this status and nothing is stored, until the
    /// faults are replaced. Default none.
    public var forcedStatus: Int?

    /// Creates a fault configuration; the defaults inject nothing.
    public init(
        seed: UInt64 = 0,
        failureRate: Double = 0,
        failureStatus: Int = 503,
        retryAfter: String? = nil,
        latencyMillis: Int = 0,
        hangRate: Double = 0,
        resetRate: Double = 0,
        lostAckRate: Double = 0,
        poisonPattern: String? = nil,
        poisonStatus: Int = 400,
        maxEventsPerBatch: Int? = nil,
        forcedStatus: Int? = nil
    ) {
        self.seed = seed
        self.failureRate = failureRate
        self.failureStatus = failureStatus
        self.retryAfter = retryAfter
        self.latencyMillis = latencyMillis
        self.hangRate = hangRate
        self.resetRate = resetRate
        self.lostAckRate = lostAckRate
        self.poisonPattern = poisonPattern
        self.poisonStatus = poisonStatus
        self.maxEventsPerBatch = maxEventsPerBatch
        self.forcedStatus = forcedStatus
    }

    /// No faults at all.
    public static let none = FaultConfiguration()

    /// Checks every value, naming the first one out of range.
    public func validate() throws(CollectorError) {
        for (name, rate) in [
            (Self.name(.failureRate, flag: "fail-rate"), failureRate), (Self.name(.hangRate), hangRate),
            (Self.name(.resetRate), resetRate), (Self.name(.lostAckRate), lostAckRate),
        ] {
            guard rate >= 0, rate <= 1 else {
                throw CollectorError(.invalidConfiguration, "\(name) must be within 0...1, got \(rate).")
            }
        }
        var statuses = [(Self.name(.failureStatus, flag: "fail-status"), failureStatus), (Self.name(.poisonStatus), poisonStatus)]
        if let forcedStatus { statuses.append((Self.name(.forcedStatus), forcedStatus)) }
        // An injected answer stores nothing: a 2xx would claim what did not happen, and a 1xx is not
        // a final answer at all.
        for (name, status) in statuses where !(300...599).contains(status) {
            throw CollectorError(
                .invalidConfiguration,
                "\(name) must be an HTTP status 300...599 (an injected answer stores nothing), got \(status).")
        }
        guard latencyMillis >= 0 else {
            throw CollectorError(.invalidConfiguration, "\(Self.name(.latencyMillis)) must not be negative, got \(latencyMillis).")
        }
        if let maxEventsPerBatch, maxEventsPerBatch < 1 {
            throw CollectorError(
                .invalidConfiguration,
                "\(Self.name(.maxEventsPerBatch, flag: "max-events")) must be at least 1, got \(maxEventsPerBatch)."
            )
        }
        if let retryAfter, retryAfter.isEmpty || retryAfter.contains(where: \.isNewline) {
            throw CollectorError(
                .invalidConfiguration,
                "\(Self.name(.retryAfter)) must be a non-empty single-line header value."
            )
        }
        if let poisonPattern {
            do {
                _ = try Regex(poisonPattern)
            } catch {
                throw CollectorError(
                    .invalidConfiguration,
                    "\(Self.name(.poisonPattern, flag: "poison")) is not a valid regular expression: \(error)."
                )
            }
        }
    }

    /// A setting as the user gave it: its command-line flag and its key in `POST /control/faults`.
    private static func name(_ key: CodingKeys, flag: String? = nil) -> String {
        let derived = key.rawValue.replacingOccurrences(of: "_", with: "-")
        return "--\(flag ?? derived) (\"\(key.rawValue)\")"
    }

    // MARK: Codable

    enum CodingKeys: String, CodingKey, CaseIterable {
        case seed
        case failureRate = "failure_rate"
        case failureStatus = "failure_status"
        case retryAfter = "retry_after"
        case latencyMillis = "latency_ms"
        case hangRate = "hang_rate"
        case resetRate = "reset_rate"
        case lostAckRate = "lost_ack_rate"
        case poisonPattern = "poison_pattern"
        case poisonStatus = "poison_status"
        case maxEventsPerBatch = "max_events_per_batch"
        case forcedStatus = "forced_status"
    }

    /// Decodes from snake_case keys; missing keys take their defaults, unknown keys are an error.
    public init(from decoder: any Decoder) throws {
        try Self.rejectUnknownKeys(in: decoder)
        let container = try decoder.container(keyedBy: CodingKeys.self)
        let defaults = FaultConfiguration()
        seed = try container.decodeIfPresent(UInt64.self, forKey: .seed) ?? defaults.seed
        failureRate = try container.decodeIfPresent(Double.self, forKey: .failureRate) ?? defaults.failureRate
        failureStatus = try container.decodeIfPresent(Int.self, forKey: .failureStatus) ?? defaults.failureStatus
        retryAfter = try container.decodeIfPresent(String.self, forKey: .retryAfter)
        latencyMillis = try container.decodeIfPresent(Int.self, forKey: .latencyMillis) ?? defaults.latencyMillis
        hangRate = try container.decodeIfPresent(Double.self, forKey: .hangRate) ?? defaults.hangRate
        resetRate = try container.decodeIfPresent(Double.self, forKey: .resetRate) ?? defaults.resetRate
        lostAckRate = try container.decodeIfPresent(Double.self, forKey: .lostAckRate) ?? defaults.lostAckRate
        poisonPattern = try container.decodeIfPresent(String.self, forKey: .poisonPattern)
        poisonStatus = try container.decodeIfPresent(Int.self, forKey: .poisonStatus) ?? defaults.poisonStatus
        maxEventsPerBatch = try container.decodeIfPresent(Int.self, forKey: .maxEventsPerBatch)
        forcedStatus = try container.decodeIfPresent(Int.self, forKey: .forcedStatus)
    }

    /// Encodes with snake_case keys; unset optionals are written as `null` so the JSON shows every option.
    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(seed, forKey: .seed)
        try container.encode(failureRate, forKey: .failureRate)
        try container.encode(failureStatus, forKey: .failureStatus)
        try container.encode(retryAfter, forKey: .retryAfter)
        try container.encode(latencyMillis, forKey: .latencyMillis)
        try container.encode(hangRate, forKey: .hangRate)
        try container.encode(resetRate, forKey: .resetRate)
        try container.encode(lostAckRate, forKey: .lostAckRate)
        try container.encode(poisonPattern, forKey: .poisonPattern)
        try container.encode(poisonStatus, forKey: .poisonStatus)
        try container.encode(maxEventsPerBatch, forKey: .maxEventsPerBatch)
        try container.encode(forcedStatus, forKey: .forcedStatus)
    }

    private struct AnyKey: CodingKey {
        var stringValue: String
        var intValue: Int? { nil }
        init(stringValue: String) { self.stringValue = stringValue }
        init?(intValue: Int) { nil }
    }

    private static func rejectUnknownKeys(in decoder: any Decoder) throws {
        let known = Set(CodingKeys.allCases.map(\.rawValue))
        let container = try decoder.container(keyedBy: AnyKey.self)
        if let unknown = container.allKeys.first(where: { !known.contains($0.stringValue) }) {
            throw DecodingError.dataCorruptedError(
                forKey: unknown,
                in: container,
                debugDescription: "Unknown fault option \"\(unknown.stringValue)\"; known options: "
                    + CodingKeys.allCases.map(\.rawValue).joined(separator: ", ") + "."
            )
        }
    }
}
