import Foundation

/// One unique event as the collector stored it, with where and when it arrived.
public struct ReceivedEvent: Sendable, Equatable {
    /// The 1-based position of this event among the unique events, in arrival order. Arrivals are
    /// contiguous, so `GET /events?after=N` continues after the first N events.
    public var arrival: Int64
    /// The event's `event_id`.
    public var eventID: String
    /// The event's `type` (`track`, `profile_set`, …).
    public var type: String
    /// The event's name (`event`), if it has one.
    public var event: String?
    /// `_tributary.seq`, the global shared-store sequence number, if present.
    public var seq: UInt64?
    /// `_tributary.producer`, the producing process's id, if present.
    public var producer: String?
    /// `_tributary.producer_seq`, the producer's own sequence number, if present.
    public var producerSeq: UInt64?
    /// The `Idempotency-Key` of the request that first delivered this event, if it had one.
    public var batchID: String?
    /// The event as stored: its JSON text byte for byte as it arrived (docs/collector.md).
    public var json: String

    /// Creates a received event (normally read from the collector, not built by hand).
    public init(
        arrival: Int64,
        eventID: String,
        type: String,
        event: String?,
        seq: UInt64?,
        producer: String?,
        producerSeq: UInt64?,
        batchID: String?,
        json: String
    ) {
        self.arrival = arrival
        self.eventID = eventID
        self.type = type
        self.event = event
        self.seq = seq
        self.producer = producer
        self.producerSeq = producerSeq
        self.batchID = batchID
        self.json = json
    }

    /// The event parsed back into a JSON object (for checking properties in tests).
    public func jsonObject() throws -> [String: Any] {
        guard let object = try JSONSerialization.jsonObject(with: Data(json.utf8)) as? [String: Any] else {
            throw CollectorError(.database, "Stored event \(arrival) is not a JSON object; the database is damaged.")
        }
        return object
    }
}
