import Foundation
import TributaryJSON
import TributaryWire

/// A request body decoded to the JSON text of its events, with the scan of each event.
struct DecodedBody: Sendable {
    /// The bytes the events' ranges point into: the `data_list` array, or the NDJSON body.
    var json: [UInt8]
    /// Each event, in order.
    var events: [ScannedEvent]
    /// `json` as it came, still compressed if it came so: `Gzip.undoContentEncoding(payloadEncoding,
    /// of: payload)` gives `json` back. What the collector keeps of a batch (``EventStore``).
    var payload: [UInt8]
    /// The `Content-Encoding` that `payload` is in (nil: `payload` is `json`).
    var payloadEncoding: String?
}

/// Decodes ingest bodies on bytes: what `WireFormat.decodeWithText` does, without building a
/// `String` of `data_list` or a Foundation object of each event.
///
/// The checks and their order are those of `WireFormat.decodeWithText`, and so are the messages,
/// which add where the JSON is wrong; the JSON is checked by ``JSONScanner``, which accepts what
/// `JSONSerialization` accepts from UTF-8 text except a trailing comma.
enum BodyDecoder {
    /// Decodes `body` in `format`; its `contentEncoding` is undone first.
    ///
    /// Each event's scan is checked as soon as it is made (an object; at most `maxEvents` of them), so
    /// the memory a body costs stays a small multiple of `limit` whatever it holds.
    ///
    /// - Throws: `WireError` (`malformedBody`, `crcMismatch`, `tooLarge` when a decompressed size is
    ///   over `limit` or there are more than `maxEvents` events, `unsupportedMediaType` for a content
    ///   coding other than gzip).
    static func decode(
        _ body: [UInt8],
        format: WireFormat,
        contentEncoding: String?,
        limit: Int,
        maxEvents: Int
    ) throws(WireError) -> DecodedBody {
        let decoded = try Gzip.undoContentEncoding(contentEncoding, of: body, limit: limit)
        switch format {
        case .sensors: return try sensors(decoded, limit: limit, maxEvents: maxEvents)
        case .ndjson: return try ndjson(decoded, maxEvents: maxEvents, asSent: body, contentEncoding)
        }
    }

    /// The refusal of a body with more than `limit` events (413: the agent splits such a batch).
    static func tooManyEvents(_ limit: Int) -> WireError {
        WireError(.tooLarge, "The batch has more than \(limit) events; this collector accepts at most \(limit) per request.")
    }

    // MARK: Sensors form

    private static func sensors(_ body: [UInt8], limit: Int, maxEvents: Int) throws(WireError) -> DecodedBody {
        let form = SensorsForm(body)
        guard let dataList = form.dataList else {
            throw WireError(.malformedBody, "The form has no data_list field.")
        }
        let isASCII = dataList.allSatisfy { $0 < 0x80 }
        if let crcText = form.crc {
            // Java's String.hashCode over UTF-16 code units: for ASCII text, the bytes themselves.
            let expected =
                isASCII ? javaHash(ofASCII: dataList) : javaStringHash(String(decoding: dataList, as: UTF8.self))
            guard Int32(crcText) == expected else {
                throw WireError(.crcMismatch, "crc=\(crcText) does not match data_list (expected \(expected)).")
            }
        }
        let decoded = dataList.withUnsafeBytes { text in
            // Data over the decoded form value itself (no copy), only for the call.
            text.baseAddress.map { start in
                Data(base64Encoded: Data(bytesNoCopy: .init(mutating: start), count: text.count, deallocator: .none))
            } ?? Data(base64Encoded: Data())
        }
        guard isASCII, let decoded else {
            throw WireError(.malformedBody, "data_list is not valid base64.")
        }
        let payload = [UInt8](decoded)
        let gzipped = form.gzip == [UInt8(ascii: "1")]
        let json = gzipped ? try Gzip.decompress(payload, limit: limit) : payload
        let scanned = json.withUnsafeBufferPointer { bytes in
            Result { () throws(JSONScanner.ArrayRefusal) in try JSONScanner.scanObjects(bytes, maxElements: maxEvents) }
        }
        let events: [ScannedEvent]
        switch scanned {
        case .success(let elements): events = elements
        case .failure(.syntax(let syntax)):
            let hint = json.starts(with: Self.gzipMagic) ? " (it is gzip data: send gzip=1)" : ""
            throw WireError(.malformedBody, "data_list does not hold a JSON array: \(syntax)\(hint).")
        case .failure(.notAnObject(let index)):
            throw WireError(.malformedBody, "Element \(index) of data_list is not a JSON object.")
        case .failure(.tooManyElements(let limit)):
            throw Self.tooManyEvents(limit)
        }
        return DecodedBody(json: json, events: events, payload: payload, payloadEncoding: gzipped ? "gzip" : nil)
    }

    /// `javaStringHash` of ASCII bytes (one UTF-16 code unit each).
    static func javaHash(ofASCII bytes: [UInt8]) -> Int32 {
        var h: Int32 = 0
        for byte in bytes { h = 31 &* h &+ Int32(byte) }
        return h
    }

    /// The three fields of a Sensors form, percent-decoded to bytes, as `parseForm` reads a form:
    /// `&`-separated pairs (empty ones skipped), split at the first `=`, `+` is a space, `%XX` an
    /// escape (a malformed escape is kept as it is), and the last of repeated keys wins.
    struct SensorsForm {
        var crc: String?
        var gzip: [UInt8]?
        var dataList: [UInt8]?

        init(_ body: [UInt8]) {
            var start = body.startIndex
            while start < body.endIndex {
                let end = body[start...].firstIndex(of: UInt8(ascii: "&")) ?? body.endIndex
                defer { start = end + 1 }
                guard end > start else { continue }
                let pair = body[start..<end]
                let equals = pair.firstIndex(of: UInt8(ascii: "="))
                let key = Self.percentDecoded(pair[pair.startIndex..<(equals ?? pair.endIndex)])
                let value = equals.map { pair[($0 + 1)...] } ?? []
                switch key {
                case Array("crc".utf8): crc = String(decoding: Self.percentDecoded(value), as: UTF8.self)
                case Array("gzip".utf8): gzip = Self.percentDecoded(value)
                case Array("data_list".utf8): dataList = Self.percentDecoded(value)
                default: break
                }
            }
        }

        static func percentDecoded(_ bytes: ArraySlice<UInt8>) -> [UInt8] {
            [UInt8](unsafeUninitializedCapacity: bytes.count) { out, initialized in
                initialized = bytes.withUnsafeBufferPointer { input in
                    var read = 0
                    var written = 0
                    while read < input.count {
                        let byte = input[read]
                        read += 1
                        if byte == UInt8(ascii: "%"), read + 1 < input.count,
                            let high = hexValue(input[read]), let low = hexValue(input[read + 1])
                        {
                            out[written] = high << 4 | low
                            read += 2
                        } else {
                            out[written] = byte == UInt8(ascii: "+") ? UInt8(ascii: " ") : byte
                        }
                        written += 1
                    }
                    return written
                }
            }
        }

        private static func hexValue(_ byte: UInt8) -> UInt8? {
            switch byte {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): byte - UInt8(ascii: "0")
            case UInt8(ascii: "a")...UInt8(ascii: "f"): byte - UInt8(ascii: "a") + 10
            case UInt8(ascii: "A")...UInt8(ascii: "F"): byte - UInt8(ascii: "A") + 10
            default: nil
            }
        }
    }

    // MARK: NDJSON

    /// The first two bytes of a gzip member (RFC 1952), for the hint when a body or data_list is gzip
    /// data that was not declared so.
    static let gzipMagic: [UInt8] = [0x1F, 0x8B]

    /// `asSent`: the body before its `contentEncoding` was undone (the batch's payload).
    private static func ndjson(
        _ body: [UInt8], maxEvents: Int, asSent: [UInt8], _ contentEncoding: String?
    ) throws(WireError) -> DecodedBody {
        let scanned = body.withUnsafeBufferPointer { bytes in
            Result { () throws(WireError) in
                var events: [ScannedEvent] = []
                var line = 0
                var start = 0
                while start < bytes.count {
                    let rest = UnsafeRawPointer(bytes.baseAddress! + start)
                    let newline =
                        memchr(rest, Int32(UInt8(ascii: "\n")), bytes.count - start)
                        .map { start + rest.distance(to: UnsafeRawPointer($0)) } ?? bytes.count
                    defer { start = newline + 1 }
                    line += 1
                    // A blank line (JSON whitespace only: a CRLF file's empty line is "\r") holds no event.
                    guard bytes[start..<newline].contains(where: { !JSONBytes.isWhitespace($0) }) else { continue }
                    guard events.count < maxEvents else { throw Self.tooManyEvents(maxEvents) }
                    let event: ScannedEvent
                    do throws(JSONSyntaxError) {
                        event = try JSONScanner.scanDocument(bytes, range: start..<newline)
                    } catch {
                        let looksGzip = line == 1 && UnsafeBufferPointer(rebasing: bytes[start..<newline]).starts(with: Self.gzipMagic)
                        let hint = looksGzip ? " (the body is gzip data: send Content-Encoding: gzip)" : ""
                        throw WireError(
                            .malformedBody,
                            "Line \(line) is not a JSON object: not valid JSON\(hint), \(error.reason) at byte "
                                + "\(error.offset - start) of the line.")
                    }
                    guard event.isObject else { throw WireError(.malformedBody, "Line \(line) is not a JSON object.") }
                    events.append(event)
                }
                return events
            }
        }
        return DecodedBody(json: body, events: try scanned.get(), payload: asSent, payloadEncoding: contentEncoding)
    }
}
