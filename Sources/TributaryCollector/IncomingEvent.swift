import Foundation

/// One validated event of an ingest batch, reduced to what the collector indexes plus its JSON text.
struct IncomingEvent: Sendable {
    var eventID: String
    var type: String
    /// The event name; required for `track` events, optional for others (`profile_set`, …).
    var name: String?
    /// `_tributary.seq`: the global shared-store sequence number.
    var seq: Int64?
    /// `_tributary.producer`: the producing process's id.
    var producer: String?
    /// `_tributary.producer_seq`: the producer's own sequence number.
    var producerSeq: Int64?
    /// The event's JSON text exactly as it arrived, as stored and served by `/events`.
    var json: String
}

/// A batch rejected because one of its events is not a well-formed event.
struct InvalidEvent: Error {
    var index: Int
    var field: String
    var message: String
}

/// Checks the shape of decoded events and extracts their indexed fields.
///
/// Every event must be an object with a non-empty string `event_id` and a string `type`; a `track`
/// event also needs a string `event`, a numeric `time` and an object `properties`. `_tributary`, when
/// present, must be an object whose `seq` and `producer_seq` are non-negative integers and whose
/// `producer` is a string. Messages name the index and the field, never a property value.
enum EventValidator {
    static func validate(_ objects: [(object: [String: Any], text: ArraySlice<UInt8>)]) throws(InvalidEvent)
        -> [IncomingEvent]
    {
        var events: [IncomingEvent] = []
        events.reserveCapacity(objects.count)
        for (index, event) in objects.enumerated() {
            events.append(try validate(event.object, text: event.text, at: index))
        }
        return events
    }

    /// Checks one decoded event; `text` is its JSON as it arrived, which is what gets stored.
    static func validate(_ object: [String: Any], text: ArraySlice<UInt8>, at index: Int) throws(InvalidEvent)
        -> IncomingEvent
    {
        func invalid(_ field: String, _ problem: String) -> InvalidEvent {
            InvalidEvent(index: index, field: field, message: "event \(index): \"\(field)\" \(problem)")
        }
        guard let eventID = object["event_id"] as? String, !eventID.isEmpty else {
            throw invalid("event_id", "is missing or not a non-empty string")
        }
        guard let type = object["type"] as? String else {
            throw invalid("type", "is missing or not a string")
        }
        let name = object["event"] as? String
        if type == "track" {
            guard name != nil else {
                throw invalid("event", "is missing or not a string (required for type \"track\")")
            }
            guard JSONValue.isNumber(object["time"]) else {
                throw invalid("time", "is missing or not a number (required for type \"track\")")
            }
            guard object["properties"] is [String: Any] else {
                throw invalid("properties", "is missing or not an object (required for type \"track\")")
            }
        }
        var event = IncomingEvent(eventID: eventID, type: type, name: name, json: "")
        if let meta = object["_tributary"] {
            guard let meta = meta as? [String: Any] else { throw invalid("_tributary", "is not an object") }
            event.seq = try sequenceNumber(meta["seq"], field: "_tributary.seq", invalid)
            event.producerSeq = try sequenceNumber(meta["producer_seq"], field: "_tributary.producer_seq", invalid)
            if let producer = meta["producer"] {
                guard let producer = producer as? String else {
                    throw invalid("_tributary.producer", "is not a string")
                }
                event.producer = producer
            }
        }
        event.json = String(decoding: text, as: UTF8.self)
        return event
    }

    private static func sequenceNumber(
        _ value: Any?,
        field: String,
        _ invalid: (String, String) -> InvalidEvent
    ) throws(InvalidEvent) -> Int64? {
        guard let value else { return nil }
        guard let number = JSONValue.nonNegativeInteger(value) else {
            throw invalid(field, "is not an integer within 0...\(Int64.max)")
        }
        return number
    }
}

/// Helpers for values produced by `JSONSerialization`, where numbers and booleans are both `NSNumber`.
enum JSONValue {
    private static let booleanType = ObjectIdentifier(type(of: NSNumber(value: true)))

    /// Whether `value` is a JSON number (and not `true`/`false`).
    static func isNumber(_ value: Any?) -> Bool {
        guard let number = value as? NSNumber else { return false }
        return ObjectIdentifier(type(of: number)) != booleanType
    }

    /// `value` as a non-negative integer, if it is a JSON number with no fractional part that fits `Int64`.
    static func nonNegativeInteger(_ value: Any) -> Int64? {
        guard isNumber(value), let number = value as? NSNumber else { return nil }
        let double = number.doubleValue
        guard double >= 0, double.rounded() == double, double < 0x1p63 else { return nil }
        let integer = number.int64Value
        return integer >= 0 ? integer : nil
    }
}
