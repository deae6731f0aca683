import Foundation
import TributaryJSON

/// How a batch of events is put on the wire. Specified in `docs/wire-formats.md`.
public enum WireFormat: String, CaseIterable, Sendable, CustomStringConvertible {
    /// The Sensors Analytics SDK form: `crc=…&gzip=1&data_list=…` (`application/x-www-form-urlencoded`),
    /// `data_list` = base64 of gzip of the JSON array, `crc` = Java `String.hashCode` of the base64 text.
    case sensors
    /// Newline-delimited JSON, gzip-compressed (`Content-Type: application/x-ndjson`,
    /// `Content-Encoding: gzip`), as generic HTTP collectors (Vector, Fluent Bit) accept.
    case ndjson

    public var description: String { rawValue }
}

/// An encoded request body with the headers that describe it.
public struct EncodedBatch: Sendable {
    /// The request body.
    public var body: [UInt8]
    /// `Content-Type` and, for NDJSON, `Content-Encoding`.
    public var headers: [(name: String, value: String)]
    /// The uncompressed JSON size, for logs and metrics.
    public var uncompressedBytes: Int
}

extension WireFormat {
    /// Encodes events (each a complete JSON object, UTF-8) into a request body, gzip at `gzipLevel`.
    public func encode(_ events: [[UInt8]], gzipLevel: Int32 = Gzip.defaultLevel) throws(WireError) -> EncodedBatch {
        var body = BatchBodyBuilder(format: self, capacity: events.reduce(0) { $0 + $1.count + 1 })
        for event in events { event.withUnsafeBytes { body.append($0) } }
        return try body.finish(gzipLevel: gzipLevel)
    }

    /// Recognises the format of a request from its `Content-Type`; nil for another type, or for a
    /// `charset` other than UTF-8 (or its subset US-ASCII): the body is read as UTF-8.
    public init?(contentType: String?) {
        let parts = (contentType ?? "").split(separator: ";").map { $0.trimmingCharacters(in: .whitespaces).lowercased() }
        for parameter in parts.dropFirst() where parameter.hasPrefix("charset=") {
            let charset = parameter.dropFirst("charset=".count).trimmingCharacters(in: CharacterSet(charactersIn: "\""))
            guard ["utf-8", "utf8", "us-ascii"].contains(charset) else { return nil }
        }
        switch parts.first {
        case "application/x-www-form-urlencoded": self = .sensors
        case "application/x-ndjson", "application/jsonl", "application/json-lines": self = .ndjson
        default: return nil
        }
    }

    /// Decodes a request body into its events (JSON objects).
    ///
    /// - Parameters:
    ///   - contentEncoding: the `Content-Encoding` header, undone first (``Gzip/undoContentEncoding(_:of:limit:)``).
    ///   - limit: the largest decompressed size accepted.
    public func decode(_ body: [UInt8], contentEncoding: String?, limit: Int = 64 << 20) throws(WireError)
        -> [[String: Any]]
    {
        try decodeWithText(body, contentEncoding: contentEncoding, limit: limit).map(\.object)
    }

    /// Decodes a request body into its events, each with its JSON text exactly as it arrived (the
    /// element of the `data_list` array, or the NDJSON line).
    public func decodeWithText(_ body: [UInt8], contentEncoding: String?, limit: Int = 64 << 20) throws(WireError)
        -> [(object: [String: Any], text: ArraySlice<UInt8>)]
    {
        let body = try Gzip.undoContentEncoding(contentEncoding, of: body, limit: limit)
        switch self {
        case .sensors:
            let form = parseForm(body)
            guard let dataList = form["data_list"] else {
                throw WireError(.malformedBody, "The form has no data_list field.")
            }
            if let crcText = form["crc"] {
                let expected = javaStringHash(dataList)
                guard Int32(crcText) == expected else {
                    throw WireError(.crcMismatch, "crc=\(crcText) does not match data_list (expected \(expected)).")
                }
            }
            guard var json = Data(base64Encoded: dataList).map(Array.init) else {
                throw WireError(.malformedBody, "data_list is not valid base64.")
            }
            if form["gzip"] == "1" { json = try Gzip.decompress(json, limit: limit) }
            guard let array = try? JSONSerialization.jsonObject(with: Data(json)) as? [Any] else {
                throw WireError(.malformedBody, "data_list does not hold a JSON array.")
            }
            // The parser accepted the text, so the scan of its top-level elements lines up with it.
            let texts = topLevelElements(ofArray: json)
            guard texts.count == array.count else {
                throw WireError(.malformedBody, "data_list does not hold a JSON array.")
            }
            return try array.enumerated().map { (i, item) throws(WireError) in
                guard let object = item as? [String: Any] else {
                    throw WireError(.malformedBody, "Element \(i) of data_list is not a JSON object.")
                }
                return (object, texts[i])
            }
        case .ndjson:
            var out: [(object: [String: Any], text: ArraySlice<UInt8>)] = []
            for (i, line) in body.split(separator: UInt8(ascii: "\n"), omittingEmptySubsequences: false).enumerated() {
                // A blank line (JSON whitespace only: a CRLF file's empty line is "\r") holds no event;
                // lines are counted as they stand, blank ones too.
                if line.allSatisfy(JSONBytes.isWhitespace) { continue }
                guard let object = try? JSONSerialization.jsonObject(with: Data(line)) as? [String: Any] else {
                    throw WireError(.malformedBody, "Line \(i + 1) is not a JSON object.")
                }
                // A byte-order mark the parser skipped is not part of the event's text.
                out.append((object, line.starts(with: [0xEF, 0xBB, 0xBF]) ? line.dropFirst(3) : line))
            }
            return out
        }
    }
}

/// The text of each top-level element of a JSON array that a parser has accepted (whitespace around
/// elements left out). Scans strings (with escapes) and nesting only; no validation.
func topLevelElements(ofArray json: [UInt8]) -> [ArraySlice<UInt8>] {
    var elements: [ArraySlice<UInt8>] = []
    var depth = 0
    var inString = false
    var escaped = false
    var start: Int?
    var end = 0
    for (i, byte) in json.enumerated() {
        if inString {
            if escaped {
                escaped = false
            } else if byte == UInt8(ascii: "\\") {
                escaped = true
            } else if byte == UInt8(ascii: "\"") {
                inString = false
                end = i + 1
            }
            continue
        }
        switch byte {
        case UInt8(ascii: " "), UInt8(ascii: "\n"), UInt8(ascii: "\r"), UInt8(ascii: "\t"):
            continue
        case UInt8(ascii: "\""):
            inString = true
            if depth == 1 && start == nil { start = i }
        case UInt8(ascii: "["), UInt8(ascii: "{"):
            depth += 1
            if depth == 2 && start == nil { start = i }
            end = i + 1
            continue
        case UInt8(ascii: "]"), UInt8(ascii: "}"):
            if depth == 1, let first = start {
                elements.append(json[first..<end])
                start = nil
            }
            depth -= 1
            end = i + 1
            continue
        case UInt8(ascii: ","):
            if depth == 1, let first = start {
                elements.append(json[first..<end])
                start = nil
            }
            continue
        default:
            if depth == 1 && start == nil { start = i }
        }
        end = i + 1
    }
    return elements
}

/// Java's `String.hashCode()` (31·h + c over UTF-16 code units, wrapping), as the Sensors SDK's `crc`.
public func javaStringHash(_ text: String) -> Int32 {
    var h: Int32 = 0
    for unit in text.utf16 { h = 31 &* h &+ Int32(unit) }
    return h
}

/// Percent-encodes a form value (`application/x-www-form-urlencoded`: unreserved characters stay).
public func formURLEncode(_ text: String) -> String {
    var out: [UInt8] = []
    formURLEncode(text, into: &out)
    return String(decoding: out, as: UTF8.self)
}

/// Appends the percent-encoded form of `text` to `out`.
func formURLEncode(_ text: String, into out: inout [UInt8]) {
    let hex = Array("0123456789ABCDEF".utf8)
    out.reserveCapacity(out.count + text.utf8.count + 64)
    for byte in text.utf8 {
        switch byte {
        case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
            UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "_"),
            UInt8(ascii: "~"):
            out.append(byte)
        default:
            out.append(UInt8(ascii: "%"))
            out.append(hex[Int(byte >> 4)])
            out.append(hex[Int(byte & 0xF)])
        }
    }
}

/// Parses `a=1&b=2` form text (`+` is a space, `%XX` escapes).
public func parseForm(_ text: String) -> [String: String] {
    parseForm(Array(text.utf8))
}

/// Parses `a=1&b=2` form bytes (`+` is a space, `%XX` escapes; a malformed escape is kept as is).
public func parseForm(_ bytes: [UInt8]) -> [String: String] {
    var out: [String: String] = [:]
    for pair in bytes.split(separator: UInt8(ascii: "&")) {
        let parts = pair.split(separator: UInt8(ascii: "="), maxSplits: 1, omittingEmptySubsequences: false)
        out[formURLDecode(parts[0])] = parts.count > 1 ? formURLDecode(parts[1]) : ""
    }
    return out
}

func formURLDecode(_ bytes: ArraySlice<UInt8>) -> String {
    func hex(_ byte: UInt8) -> UInt8? {
        switch byte {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): byte - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): byte - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): byte - UInt8(ascii: "A") + 10
        default: nil
        }
    }
    var out: [UInt8] = []
    out.reserveCapacity(bytes.count)
    var i = bytes.startIndex
    while i < bytes.endIndex {
        let byte = bytes[i]
        if byte == UInt8(ascii: "+") {
            out.append(UInt8(ascii: " "))
        } else if byte == UInt8(ascii: "%"), i + 2 < bytes.endIndex, let high = hex(bytes[i + 1]),
            let low = hex(bytes[i + 2])
        {
            out.append(high << 4 | low)
            i += 2
        } else {
            out.append(byte)
        }
        i += 1
    }
    return String(decoding: out, as: UTF8.self)
}
