/// What a collector has received, as served by `GET /stats` (snake_case keys in JSON).
///
/// Every ingest request ends as exactly one of: an accepted batch (``batches``, including lost
/// acknowledgements), a rejected batch (``rejectedBatches``: any other outcome, from 401 to an injected
/// reset), or still in flight. So `requests == batches + rejectedBatches` once the collector is idle.
/// With a database file the counters persist across restarts.
public struct CollectorStats: Sendable, Codable, Equatable {
    /// Ingest requests received (`POST /sa`, `POST /ingest`).
    public var requests: Int
    /// Batches accepted: their events were committed (even if the acknowledgement was then lost).
    public var batches: Int
    /// Ingest requests not accepted: authentication, format, validation, limits and injected faults.
    public var rejectedBatches: Int
    /// Accepted batches whose `Idempotency-Key` had already been accepted before (retries of a batch
    /// whose acknowledgement was lost or timed out).
    public var repeatedBatches: Int
    /// Events in accepted batches, duplicates included.
    public var received: Int
    /// Distinct events stored (distinct `event_id`).
    public var unique: Int
    /// Events in accepted batches whose `event_id` was already stored (`received - unique`).
    public var duplicates: Int
    /// Per producer (`_tributary.producer`), unique events whose `producer_seq` was not above the highest
    /// `producer_seq` already stored for that producer. Producers with no violation are omitted.
    public var orderViolations: [String: Int]
    /// Unique events whose `_tributary.seq` was not above the highest `seq` already stored.
    public var seqViolations: Int
    /// Unique events marked `_hybrid_h5: true` at their top level: sent by a hybrid (H5) page through an app.
    public var hybridH5: Int
    /// Users with a profile (`GET /profile?distinct_id=…` shows one).
    public var profiles: Int
    /// Unique profile records applied, by type (`profile_set`, …); types with none are omitted.
    public var profileRecords: [String: Int]
    /// Injected faults and limit rejections, by kind.
    public var faults: FaultCounts
    /// Unique events per producer (`_tributary.producer`).
    public var producers: [String: Int]

    /// Creates statistics; every count defaults to zero.
    public init(
        requests: Int = 0,
        batches: Int = 0,
        rejectedBatches: Int = 0,
        repeatedBatches: Int = 0,
        received: Int = 0,
        unique: Int = 0,
        duplicates: Int = 0,
        orderViolations: [String: Int] = [:],
        seqViolations: Int = 0,
        hybridH5: Int = 0,
        profiles: Int = 0,
        profileRecords: [String: Int] = [:],
        faults: FaultCounts = FaultCounts(),
        producers: [String: Int] = [:]
    ) {
        self.requests = requests
        self.batches = batches
        self.rejectedBatches = rejectedBatches
        self.repeatedBatches = repeatedBatches
        self.received = received
        self.unique = unique
        self.duplicates = duplicates
        self.orderViolations = orderViolations
        self.seqViolations = seqViolations
        self.hybridH5 = hybridH5
        self.profiles = profiles
        self.profileRecords = profileRecords
        self.faults = faults
        self.producers = producers
    }

    enum CodingKeys: String, CodingKey {
        case requests, batches, received, unique, duplicates, faults, producers, profiles
        case profileRecords = "profile_records"
        case rejectedBatches = "rejected_batches"
        case repeatedBatches = "repeated_batches"
        case orderViolations = "order_violations"
        case seqViolations = "seq_violations"
        case hybridH5 = "hybrid_h5"
    }
}

/// How many ingest requests each kind of fault (or limit) affected, as in `GET /stats` → `faults`.
public struct FaultCounts: Sendable, Codable, Equatable {
    /// Answered with the injected ``FaultConfiguration/failureStatus``.
    public var failure: Int
    /// Never answered (``FaultConfiguration/hangRate``).
    public var hang: Int
    /// Connection reset before a response, nothing stored (``FaultConfiguration/resetRate``).
    public var reset: Int
    /// Events committed, then the connection reset without a response (``FaultConfiguration/lostAckRate``).
    public var lostAck: Int
    /// Rejected because an event name matched ``FaultConfiguration/poisonPattern``.
    public var poison: Int
    /// Rejected with 413: over ``FaultConfiguration/maxEventsPerBatch`` or
    /// ``CollectorConfiguration/maxBodyBytes``.
    public var tooLarge: Int
    /// Answered with ``FaultConfiguration/forcedStatus``.
    public var forced: Int

    /// Creates counts; every count defaults to zero.
    public init(
        failure: Int = 0,
        hang: Int = 0,
        reset: Int = 0,
        lostAck: Int = 0,
        poison: Int = 0,
        tooLarge: Int = 0,
        forced: Int = 0
    ) {
        self.failure = failure
        self.hang = hang
        self.reset = reset
        self.lostAck = lostAck
        self.poison = poison
        self.tooLarge = tooLarge
        self.forced = forced
    }

    /// The sum of all kinds.
    public var total: Int { failure + hang + reset + lostAck + poison + tooLarge + forced }

    enum CodingKeys: String, CodingKey {
        case failure, hang, reset, poison, forced
        case lostAck = "lost_ack"
        case tooLarge = "too_large"
    }
}

/// Kinds of injected fault, as counted in ``FaultCounts``.
enum FaultKind: String, CaseIterable, Sendable {
    case failure, hang, reset, poison, forced
    case lostAck = "lost_ack"
    case tooLarge = "too_large"

    /// The key of this kind's row in the `counters` table.
    var counterName: String { "fault." + rawValue }
}

extension FaultCounts {
    /// Counts read from the `counters` table (`fault.<kind>` rows).
    init(counters: [String: Int]) {
        func count(_ kind: FaultKind) -> Int { counters[kind.counterName] ?? 0 }
        self.init(
            failure: count(.failure),
            hang: count(.hang),
            reset: count(.reset),
            lostAck: count(.lostAck),
            poison: count(.poison),
            tooLarge: count(.tooLarge),
            forced: count(.forced)
        )
    }
}
