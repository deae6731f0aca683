import Foundation
import TributaryJSON

/// One validated event of an ingest batch, reduced to what the collector indexes plus where its JSON
/// text is.
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
    /// `_hybrid_h5: true` at the top level: an event a hybrid (H5) page sent through an app.
    var hybridH5 = false
    /// What a profile record (`type` `profile_*`) does to its user's profile.
    var profile: ProfileUpdate?
    /// Where the event's JSON text, exactly as it arrived, is in the batch's bytes: as stored and
    /// served by `/events`.
    var text: Range<Int>
}

/// A batch rejected because one of its events is not a well-formed event.
struct InvalidEvent: Error {
    var index: Int
    var field: String
    var message: String
}

/// Checks the shape of scanned events and extracts their indexed fields.
///
/// Every event must be an object with a non-empty string `event_id` and a string `type`; a `track`
/// event also needs a string `event`, a numeric `time` and an object `properties`. `_tributary`, when
/// present, must be an object whose `seq` and `producer_seq` are non-negative integers and whose
/// `producer` is a string; `_hybrid_h5`, when present, a boolean. A profile record (`profile_*`) is
/// checked as ``ProfileUpdate/read(_:type:_:)`` says. Messages name the index and the field, never a property value.
enum EventValidator {
    static func validate(_ body: DecodedBody) throws(InvalidEvent) -> [IncomingEvent] {
        let validated = body.json.withUnsafeBufferPointer { bytes in
            Result { () throws(InvalidEvent) in
                var events: [IncomingEvent] = []
                events.reserveCapacity(body.events.count)
                for (index, event) in body.events.enumerated() {
                    events.append(try validate(event, in: bytes, at: index))
                }
                return events
            }
        }
        return try validated.get()
    }

    /// Checks one scanned event object; `bytes` are the batch's JSON bytes its tokens point into.
    static func validate(
        _ event: ScannedEvent,
        in bytes: UnsafeBufferPointer<UInt8>,
        at index: Int
    ) throws(InvalidEvent) -> IncomingEvent {
        func invalid(_ field: String, _ problem: String) -> InvalidEvent {
            InvalidEvent(index: index, field: field, message: "event \(index): \"\(field)\" \(problem)")
        }
        /// A string the collector indexes: SQLite's text ends at U+0000, so "a\u0000b" and "a\u0000c"
        /// would be one event id (the second dropped as a duplicate), and one producer.
        /// And one with U+FEFF: `JSONSerialization`, whose decoding the collector follows, drops a raw
        /// byte-order mark at the start of a string and after an escape, so "\u{FEFF}a" and "a" would be
        /// one event id too.
        func indexed(_ token: JSONToken, _ field: String) throws(InvalidEvent) -> String? {
            let value = string(token, in: bytes)
            // A plain string holds no control character (the scanner refuses them raw).
            if let value, !token.isPlain, value.utf8.contains(0) {
                throw invalid(field, "contains U+0000 (\\u0000), which the collector cannot index")
            }
            if token.kind == .string, containsByteOrderMark(UnsafeBufferPointer(rebasing: bytes[token.range])) {
                throw invalid(field, "contains U+FEFF (a byte-order mark), which JSON decoders drop or keep inconsistently")
            }
            return value
        }
        if let repeated = event.repeatedKey {
            throw invalid(repeated, "is given twice; readers disagree on which one counts (the first or the last)")
        }
        guard let eventID = try indexed(event.eventID, "event_id"), !eventID.isEmpty else {
            throw invalid("event_id", "is missing or not a non-empty string")
        }
        guard let type = try indexed(event.type, "type") else {
            throw invalid("type", "is missing or not a string")
        }
        let name = try indexed(event.name, "event")
        if type == "track" {
            guard name != nil else {
                throw invalid("event", "is missing or not a string (required for type \"track\")")
            }
            guard event.time.kind == .number else {
                throw invalid("time", "is missing or not a number (required for type \"track\")")
            }
            guard event.properties.kind == .object else {
                throw invalid("properties", "is missing or not an object (required for type \"track\")")
            }
        }
        var incoming = IncomingEvent(eventID: eventID, type: type, name: name, text: event.text)
        if event.tributary.kind != .absent {
            guard event.tributary.kind == .object else { throw invalid("_tributary", "is not an object") }
            incoming.seq = try sequenceNumber(event.seq, in: bytes, field: "_tributary.seq", invalid)
            incoming.producerSeq = try sequenceNumber(
                event.producerSeq, in: bytes, field: "_tributary.producer_seq", invalid)
            if event.producer.kind != .absent {
                guard let producer = try indexed(event.producer, "_tributary.producer") else {
                    throw invalid("_tributary.producer", "is not a string")
                }
                incoming.producer = producer
            }
        }
        switch event.hybridH5.kind {
        case .absent: break
        case .bool: incoming.hybridH5 = bytes[event.hybridH5.range.lowerBound] == UInt8(ascii: "t")
        default: throw invalid("_hybrid_h5", "is not a boolean (true marks an event a hybrid page sent)")
        }
        if type.hasPrefix("profile_") {
            incoming.profile = try ProfileUpdate.read(UnsafeBufferPointer(rebasing: bytes[event.text]), type: type, invalid)
        }
        return incoming
    }

    /// Whether a string's raw text holds U+FEFF, as UTF-8 or as a `\\ufeff` escape (any case).
    private static func containsByteOrderMark(_ raw: UnsafeBufferPointer<UInt8>) -> Bool {
        guard let base = raw.baseAddress, raw.count >= 3 else { return false }
        // The usual id (ASCII, no escape) has neither byte: two memchr calls, and done.
        guard memchr(base, 0xEF, raw.count) != nil || memchr(base, Int32(UInt8(ascii: "\\")), raw.count) != nil else {
            return false
        }
        for i in 0..<(raw.count - 2) {
            if raw[i] == 0xEF && raw[i + 1] == 0xBB && raw[i + 2] == 0xBF { return true }
            if raw[i] == UInt8(ascii: "\\"), i + 5 < raw.count, raw[i + 1] == UInt8(ascii: "u"),
                String(decoding: raw[(i + 2)..<(i + 6)], as: UTF8.self).lowercased() == "feff"
            {
                // Unless this backslash is itself escaped: count the backslashes before it.
                var backslashes = 0
                var j = i
                while j > 0 && raw[j - 1] == UInt8(ascii: "\\") { backslashes += 1; j -= 1 }
                if backslashes % 2 == 0 { return true }
            }
        }
        return false
    }

    /// The value of a string token (nil for any other kind): its bytes when plain, else decoded.
    private static func string(_ token: JSONToken, in bytes: UnsafeBufferPointer<UInt8>) -> String? {
        guard token.kind == .string else { return nil }
        guard token.isPlain else { return JSONScanner.decodeString(token.range, in: bytes) }
        return String(decoding: UnsafeBufferPointer(rebasing: bytes[token.range]), as: UTF8.self)
    }

    private static func sequenceNumber(
        _ token: JSONToken,
        in bytes: UnsafeBufferPointer<UInt8>,
        field: String,
        _ invalid: (String, String) -> InvalidEvent
    ) throws(InvalidEvent) -> Int64? {
        switch token.kind {
        case .absent:
            return nil
        case .number where token.isPlain:
            // At most 18 digits: below 2^63 as an Int64 and as a Double.
            return bytes[token.range].reduce(0) { $0 * 10 + Int64($1 - UInt8(ascii: "0")) }
        case .number:
            // Any other number: as JSONSerialization's NSNumber has it (Int64, UInt64, Decimal or Double).
            let text = [UInt8(ascii: "[")] + bytes[token.range] + [UInt8(ascii: "]")]
            let value = ((try? JSONSerialization.jsonObject(with: Data(text))) as? [Any])?.first
            if let value, let number = SerializedNumber.nonNegativeInteger(value) { return number }
        default:
            break
        }
        throw invalid(field, "is not an integer within 0...\(Int64.max)")
    }
}

/// The numbers of values produced by `JSONSerialization`, where numbers and booleans are both `NSNumber`.
enum SerializedNumber {
    private static let booleanType = ObjectIdentifier(type(of: NSNumber(value: true)))

    /// Whether `value` is a JSON number (and not `true`/`false`).
    static func isNumber(_ value: Any?) -> Bool {
        guard let number = value as? NSNumber else { return false }
        return ObjectIdentifier(type(of: number)) != booleanType
    }

    /// `value` as a non-negative integer, if it is a JSON number with no fractional part that fits `Int64`.
    static func nonNegativeInteger(_ value: Any) -> Int64? {
        guard isNumber(value), let number = value as? NSNumber else { return nil }
        // An integer is taken exactly: a Double rounds the top 512 values below 2^63 up to 2^63.
        switch UInt8(bitPattern: number.objCType.pointee) {
        case UInt8(ascii: "c"), UInt8(ascii: "s"), UInt8(ascii: "i"), UInt8(ascii: "l"), UInt8(ascii: "q"):
            let integer = number.int64Value
            return integer >= 0 ? integer : nil
        case UInt8(ascii: "C"), UInt8(ascii: "S"), UInt8(ascii: "I"), UInt8(ascii: "L"), UInt8(ascii: "Q"):
            let integer = number.uint64Value
            return integer <= UInt64(Int64.max) ? Int64(integer) : nil
        default:
            break
        }
        let double = number.doubleValue
        guard double >= 0, double.rounded() == double, double < 0x1p63 else { return nil }
        let integer = number.int64Value
        return integer >= 0 ? integer : nil
    }
}
