import Foundation
import TributaryStore
import TributaryWire

/// The enrich stage of the drain: what the container app does for extension events in the iOS SDK.
///
/// - Extension events get the app's preset properties (the app's `$app_version`, device and OS
///   properties override the extension's own) and the group's current identity, and keep their own
///   `time` and custom properties.
/// - App events pass through unchanged (they were written with the app's presets and identity).
/// - Every event gets `_tributary`: `{"seq", "producer", "producer_kind", "producer_seq"}`.
public struct Enricher: Sendable {
    /// The app's preset properties, as published by the main app (nil when it never ran).
    public var appPresets: [String: any Sendable]?
    /// The group's identity at drain time.
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
        self.init(appPresets: presets, identity: try store.identity())
    }

    /// Enriches one stored event; returns the outbox row.
    public func enrich(seq: UInt64, record: EventRecord) throws -> Outbox.Row {
        var body = record.body
        if record.producerKind == .extension {
            body = try enrichExtension(body, seq: seq)
        }
        let eventID = JSONFields.string("event_id", in: body)
        guard let eventID, !eventID.isEmpty else {
            throw EnrichError(seq: seq, reason: "the event has no event_id")
        }
        var marker = "{\"seq\":\(seq),\"producer\":"
        marker += jsonQuoted(record.producerID)
        marker += ",\"producer_kind\":\"\(record.producerKind)\",\"producer_seq\":\(record.producerSeq)}"
        guard let tagged = JSONFields.appending("_tributary", rawValue: Array(marker.utf8), to: body) else {
            throw EnrichError(seq: seq, reason: "the event body is not a JSON object")
        }
        return Outbox.Row(
            id: 0, seq: seq, eventID: eventID, producer: record.producerID, producerKind: record.producerKind,
            producerSeq: record.producerSeq, wallMillis: record.wallTimeMillis, bootNanos: record.bootTimeNanos,
            bootID: record.bootID, body: tagged, batchID: nil)
    }

    private func enrichExtension(_ body: [UInt8], seq: UInt64) throws -> [UInt8] {
        guard var event = try JSONSerialization.jsonObject(with: Data(body)) as? [String: Any] else { return body }
        if let identity {
            event["distinct_id"] = identity.distinctID
            event["anonymous_id"] = identity.anonymousID
            event["login_id"] = identity.loginID
        }
        if let appPresets {
            var properties = event["properties"] as? [String: Any] ?? [:]
            for (key, value) in appPresets { properties[key] = value }
            event["properties"] = properties
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

    private static func sendable(_ value: Any) -> (any Sendable)? {
        switch value {
        case let v as String: v
        case let v as Bool: v
        case let v as Int: v
        case let v as Double: v
        case let v as [String]: v
        default: nil
        }
    }
}

/// A stored event the drain could not turn into an outbox row; it goes to the dead-letter table.
public struct EnrichError: Error, CustomStringConvertible, Sendable {
    public var seq: UInt64
    public var reason: String
    public var description: String { "event seq \(seq): \(reason)" }
}

/// `s` as a JSON string literal (RFC 8259 escaping), without a JSON serialiser on the hot path.
func jsonQuoted(_ s: String) -> String {
    var out = "\""
    out.reserveCapacity(s.utf8.count + 2)
    for scalar in s.unicodeScalars {
        switch scalar {
        case "\"": out += "\\\""
        case "\\": out += "\\\\"
        case "\n": out += "\\n"
        case "\r": out += "\\r"
        case "\t": out += "\\t"
        case _ where scalar.value < 0x20:
            let hex = String(scalar.value, radix: 16)
            out += "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
        default: out.unicodeScalars.append(scalar)
        }
    }
    return out + "\""
}
