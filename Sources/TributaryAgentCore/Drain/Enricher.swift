import Foundation
import TributaryStore
import TributaryJSON
import TributaryWire
import TributaryErrors

/// The enrich stage of the drain: what the container app does for extension events in the iOS SDK.
///
/// - Extension events get the app's preset properties (the app's `$app_version`, device and OS
///   properties override the extension's own; a profile record only the `lib`'s `$app_version`), and keep their own `time`, custom properties and
///   identity: the store is shared, so the identity spliced in when the event was written is the
///   one in force when it was tracked. The identity current at drain time would attribute an event
///   tracked before a login change, and drained after it, to the wrong person. Only an event that
///   carries no `distinct_id` gets the group's current identity.
/// - App events pass through unchanged (they were written with the app's presets and identity).
/// - Every event gets `_tributary`: `{"seq", "producer", "producer_kind", "producer_seq"}`.
public struct Enricher: Sendable {
    /// The app's preset properties, as published by the main app (nil when it never ran).
    public var appPresets: [String: any Sendable]?
    /// The group's identity at drain time: for an extension event that carries none.
    public var identity: Identity?

    /// An enricher for the given app presets and identity.
    public init(appPresets: [String: any Sendable]?, identity: Identity?) {
        self.appPresets = appPresets
        self.identity = identity
    }

    /// Reads the app's presets and the identity from the store.
    public init(store: SharedStore) throws {
        let config = try store.configuration()
        var presets: [String: any Sendable]?
        if let text = config[ConfigurationKey.appPresets],
            let object = try? JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any]
        {
            presets = object.compactMapValues { Self.sendable($0) }
        }
        // Read only: creating the identity would wait for the writer lock, on the agent's loop.
        self.init(appPresets: presets, identity: try store.existingIdentity())
    }

    /// Enriches one stored event (read in place) into `chunk`: its fields, and its body with
    /// `_tributary` added (extension events: enriched first). On error `chunk` is left as it was.
    func enrich(seq: UInt64, view: EventRecord.View, into chunk: inout Outbox.DrainedChunk) throws {
        let mark = chunk.bytes.count
        do {
            if view.producerKind == .extension {
                let enriched = try enrichExtension(Array(view.body), seq: seq)
                try enriched.withUnsafeBytes { try tag($0, seq: seq, view: view, into: &chunk) }
            } else {
                try tag(view.body, seq: seq, view: view, into: &chunk)
            }
        } catch {
            chunk.bytes.removeSubrange(mark...)
            throw error
        }
    }

    /// Appends the event with `body` to `chunk`, adding `_tributary`:
    /// `{"seq":…,"producer":"…","producer_kind":"…","producer_seq":…}`.
    private func tag(
        _ body: UnsafeRawBufferPointer, seq: UInt64, view: EventRecord.View, into chunk: inout Outbox.DrainedChunk
    ) throws {
        guard let idRange = JSONFields.stringRange("event_id", in: body), !idRange.isEmpty else {
            throw EnrichError(seq: seq, reason: "the event has no event_id")
        }
        let eventID: Range<Int>
        if UnsafeRawBufferPointer(rebasing: body[idRange]).contains(UInt8(ascii: "\\")) {
            guard let unescaped = JSONFields.string(at: idRange, in: body), !unescaped.isEmpty else {
                throw EnrichError(seq: seq, reason: "the event has no event_id")
            }
            eventID = chunk.store(unescaped.utf8)
        } else {
            eventID = chunk.store(UnsafeRawBufferPointer(rebasing: body[idRange]))
        }
        let producer = chunk.store(view.producerID)
        let bootID = chunk.store(view.bootID)
        let start = chunk.bytes.count
        let added = appendJSONObject(body, to: &chunk.bytes) { out in
            appendLiteral(#""_tributary":{"seq":"#, to: &out)
            appendDecimal(seq, to: &out)
            appendLiteral(#","producer":"#, to: &out)
            JSONString.append(view.producerID, to: &out)
            appendLiteral(#","producer_kind":""#, to: &out)
            out.append(contentsOf: view.producerKind.description.utf8)
            appendLiteral(#"","producer_seq":"#, to: &out)
            appendDecimal(view.producerSeq, to: &out)
            out.append(UInt8(ascii: "}"))
        }
        guard added else { throw EnrichError(seq: seq, reason: "the event body is not a JSON object") }
        chunk.appendEvent(
            seq: seq, producerKind: view.producerKind, producerSeq: view.producerSeq, wallMillis: view.wallTimeMillis,
            bootNanos: view.bootTimeNanos, producer: producer, eventID: eventID, bootID: bootID,
            body: start..<chunk.bytes.count)
    }

    private func enrichExtension(_ body: [UInt8], seq: UInt64) throws -> [UInt8] {
        guard var event = try JSONSerialization.jsonObject(with: Data(body)) as? [String: Any] else { return body }
        if let identity, event["distinct_id"] == nil {
            event["distinct_id"] = identity.distinctID
            event["anonymous_id"] = identity.anonymousID
            event["login_id"] = identity.loginID
        }
        if let appPresets {
            // A profile record's properties are the user's: the device's presets are not among them.
            if !Self.isProfile(event) {
                var properties = event["properties"] as? [String: Any] ?? [:]
                for (key, value) in appPresets { properties[key] = value }
                event["properties"] = properties
            }
            if var lib = event["lib"] as? [String: Any], let version = appPresets["$app_version"] {
                lib["$app_version"] = version
                event["lib"] = lib
            }
        }
        guard let encoded = JSONText.sortedCompact(event) else {
            throw EnrichError(seq: seq, reason: "the enriched event cannot be written back as JSON")
        }
        return encoded
    }

    /// Whether a stored record is a profile operation (`profile_set`, …), not an event.
    static func isProfile(_ event: [String: Any]) -> Bool {
        (event["type"] as? String)?.hasPrefix("profile_") == true
    }

    /// A preset `JSONSerialization` read, as a value of its exact type (a `0` stays a number).
    private static func sendable(_ value: Any) -> (any Sendable)? {
        switch value {
        case let v as String: v
        case let v as NSNumber: JSONText.exactValue(of: v)
        case let v as [String]: v
        default: nil
        }
    }
}

/// A stored event the drain could not turn into an outbox row; it goes to the dead-letter table.
public struct EnrichError: TributaryError {
    /// What kind of failure this is.
    public struct Code: ErrorCode {
        private enum Kind: String { case invalidEvent }
        private let kind: Kind
        private init(_ kind: Kind) { self.kind = kind }
        public init?(rawValue: String) {
            guard let kind = Kind(rawValue: rawValue) else { return nil }
            self.kind = kind
        }
        public var rawValue: String { kind.rawValue }

        /// The stored event cannot be enriched: no `event_id`, not a JSON object, or not writable back
        /// as JSON. It is dead-lettered as a corrupt record.
        public static let invalidEvent = Code(.invalidEvent)
    }

    public var code: Code { .invalidEvent }
    /// The event's store sequence number.
    public var seq: UInt64
    /// What is wrong with it.
    public var reason: String
    public var message: String { reason }
    public var cause: (any Error & Sendable)? { nil }
    public var location: SourceLocation

    /// An event `seq` that cannot be enriched, and why.
    public init(seq: UInt64, reason: String, file: String = #fileID, line: Int = #line) {
        self.seq = seq
        self.reason = reason
        location = SourceLocation(file: file, line: line)
    }

    public var description: String { "event seq \(seq): \(reason)" }
}

/// Appends the bytes of `literal` to `out` (from its static storage: no `String` in between).
func appendLiteral(_ literal: StaticString, to out: inout [UInt8]) {
    literal.withUTF8Buffer { out.append(contentsOf: $0) }
}

/// Appends the decimal digits of `value` to `out`.
func appendDecimal(_ value: UInt64, to out: inout [UInt8]) {
    var digits: (UInt64, UInt64, UInt64) = (0, 0, 0)  // 24 bytes: room for UInt64.max's 20 digits
    withUnsafeMutableBytes(of: &digits) { buffer in
        var n = value
        var i = buffer.count
        repeat {
            i -= 1
            buffer[i] = UInt8(ascii: "0") + UInt8(n % 10)
            n /= 10
        } while n > 0
        out.append(contentsOf: UnsafeRawBufferPointer(rebasing: buffer[i...]))
    }
}
