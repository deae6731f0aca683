/// Builds a request body event by event, straight from the events' stored bytes.
///
/// The agent appends each event as it reads it from the outbox (no per-event arrays), then
/// ``finish(gzipLevel:)`` compresses the text and, for the Sensors form, base64-, form-encodes and
/// hashes it in one pass. ``WireFormat/encode(_:gzipLevel:)`` is this builder fed from arrays.
public struct BatchBodyBuilder: Sendable {
    /// The format the body is for.
    public let format: WireFormat
    /// The uncompressed text so far: the JSON array without its closing `]` (sensors), or the NDJSON
    /// lines.
    public private(set) var text: [UInt8] = []
    /// Events appended so far.
    public private(set) var count = 0

    /// An empty body for `format`, with room for `capacity` bytes of events.
    public init(format: WireFormat, capacity: Int = 0) {
        self.format = format
        text.reserveCapacity(capacity + 2)
        if format == .sensors { text.append(UInt8(ascii: "[")) }
    }

    /// Appends one event (a complete JSON object, UTF-8).
    public mutating func append(_ event: UnsafeRawBufferPointer) {
        beginEvent()
        text.append(contentsOf: event)
        endEvent()
    }

    /// Appends one event with `member` (`"key":value`, valid JSON) added as its last top-level member,
    /// before the closing brace. An event that does not end with `}` is appended unchanged.
    public mutating func append(_ event: UnsafeRawBufferPointer, member: UnsafeRawBufferPointer) {
        beginEvent()
        if !appendJSONObject(event, adding: member, to: &text) { text.append(contentsOf: event) }
        endEvent()
    }

    private mutating func beginEvent() {
        if format == .sensors && count > 0 { text.append(UInt8(ascii: ",")) }
    }

    private mutating func endEvent() {
        if format == .ndjson { text.append(UInt8(ascii: "\n")) }
        count += 1
    }

    /// Compresses the body at `gzipLevel` (1 fastest … 9 smallest) and encodes it for the wire.
    public consuming func finish(gzipLevel: Int32 = Gzip.defaultLevel) throws(WireError) -> EncodedBatch {
        switch format {
        case .sensors:
            text.append(UInt8(ascii: "]"))
            return EncodedBatch(
                body: sensorsForm(gzipped: try Gzip.compress(text, level: gzipLevel)),
                headers: [("Content-Type", "application/x-www-form-urlencoded")], uncompressedBytes: text.count)
        case .ndjson:
            return EncodedBatch(
                body: try Gzip.compress(text, level: gzipLevel),
                headers: [("Content-Type", "application/x-ndjson"), ("Content-Encoding", "gzip")],
                uncompressedBytes: text.count)
        }
    }
}

/// Appends `object` (JSON object text) to `out` with `member` (`"key":value`, valid JSON) added as its
/// last top-level member, before the closing brace. Returns false, appending nothing, when `object`
/// does not end with `}` (trailing whitespace aside).
public func appendJSONObject(_ object: UnsafeRawBufferPointer, adding member: UnsafeRawBufferPointer, to out: inout [UInt8])
    -> Bool
{
    appendJSONObject(object, to: &out) { $0.append(contentsOf: member) }
}

/// ``appendJSONObject(_:adding:to:)`` with the member written by `writeMember` straight into `out`
/// (`"key":value`, valid JSON), so that a member made for each event needs no buffer of its own.
public func appendJSONObject(
    _ object: UnsafeRawBufferPointer, to out: inout [UInt8], addingMember writeMember: (inout [UInt8]) -> Void
) -> Bool {
    func lastNonSpace(before end: Int) -> Int? {
        var i = end - 1
        while i >= 0 {
            switch object[i] {
            case 0x20, 0x0A, 0x0D, 0x09: i -= 1
            default: return i
            }
        }
        return nil
    }
    guard let close = lastNonSpace(before: object.count), object[close] == UInt8(ascii: "}") else { return false }
    let isEmpty = lastNonSpace(before: close).map { object[$0] == UInt8(ascii: "{") } ?? true
    out.append(contentsOf: UnsafeRawBufferPointer(rebasing: object[..<close]))
    if !isEmpty { out.append(UInt8(ascii: ",")) }
    writeMember(&out)
    out.append(contentsOf: UnsafeRawBufferPointer(rebasing: object[close...]))
    return true
}

/// `crc=<hash>&gzip=1&data_list=<data>`, where data is the base64 (RFC 4648, padded) of `gzipped`,
/// form-encoded, and hash the Java `String.hashCode` of the base64 text: all three in one pass.
///
/// Base64 text is ASCII, so its UTF-16 code units (what `hashCode` sums) are its bytes; of its
/// alphabet only `+`, `/` and `=` are not unreserved form characters, and they become `%2B`, `%2F`
/// and `%3D`, as ``formURLEncode(_:)`` writes them.
func sensorsForm(gzipped input: [UInt8]) -> [UInt8] {
    let base64Count = (input.count + 2) / 3 * 4
    var hash: Int32 = 0
    // At most 3 output bytes per base64 character (%2B, %2F, %3D).
    let dataList = [UInt8](unsafeUninitializedCapacity: base64Count * 3) { out, written in
        var writer = FormBase64Writer(out: out.baseAddress!)
        base64Alphabet.withUnsafeBufferPointer { table in
            input.withUnsafeBufferPointer { bytes in
                var i = 0
                while i + 3 <= bytes.count {
                    let n = UInt32(bytes[i]) << 16 | UInt32(bytes[i + 1]) << 8 | UInt32(bytes[i + 2])
                    writer.put(table[Int(n >> 18)])
                    writer.put(table[Int(n >> 12 & 63)])
                    writer.put(table[Int(n >> 6 & 63)])
                    writer.put(table[Int(n & 63)])
                    i += 3
                }
                let left = bytes.count - i
                if left > 0 {
                    let n = UInt32(bytes[i]) << 16 | (left == 2 ? UInt32(bytes[i + 1]) << 8 : 0)
                    writer.put(table[Int(n >> 18)])
                    writer.put(table[Int(n >> 12 & 63)])
                    writer.put(left == 2 ? table[Int(n >> 6 & 63)] : UInt8(ascii: "="))
                    writer.put(UInt8(ascii: "="))
                }
            }
        }
        written = writer.count
        hash = writer.hash
    }
    var body = Array("crc=\(hash)&gzip=1&data_list=".utf8)
    body.reserveCapacity(body.count + dataList.count)
    body.append(contentsOf: dataList)
    return body
}

/// Writes base64 characters form-encoded, hashing them as Java's `String.hashCode` does.
private struct FormBase64Writer {
    let out: UnsafeMutablePointer<UInt8>
    var count = 0
    var hash: Int32 = 0

    @inline(__always)
    mutating func put(_ c: UInt8) {
        hash = 31 &* hash &+ Int32(c)
        switch c {
        case UInt8(ascii: "+"), UInt8(ascii: "/"), UInt8(ascii: "="):
            out[count] = UInt8(ascii: "%")
            out[count + 1] = c == UInt8(ascii: "=") ? UInt8(ascii: "3") : UInt8(ascii: "2")
            out[count + 2] = c == UInt8(ascii: "+") ? UInt8(ascii: "B") : c == UInt8(ascii: "/") ? UInt8(ascii: "F") : UInt8(ascii: "D")
            count += 3
        default:
            out[count] = c
            count += 1
        }
    }
}

private let base64Alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".utf8)
