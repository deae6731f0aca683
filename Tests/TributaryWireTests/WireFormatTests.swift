import CZlib
import Foundation
import Testing
import TributaryWire

@Suite("Wire formats")
struct WireFormatTests {
    static let events: [[UInt8]] = [
        Array(#"{"event":"A","event_id":"1","properties":{"s":"é+/= &"}}"#.utf8),
        Array(#"{"event":"B","event_id":"2","properties":{}}"#.utf8),
    ]

    @Test("gzip round trip", arguments: [0, 1, 1000, 300_000])
    func gzipRoundTrip(size: Int) throws {
        let input = (0..<size).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ $0 / 7) }
        let compressed = try Gzip.compress(input)
        #expect(compressed.prefix(2) == [0x1f, 0x8b])
        #expect(try Gzip.decompress(compressed) == input)
    }

    @Test("every compression level 0 … 12 round trips through zlib's inflate; others are refused")
    func compressionLevels() throws {
        let input = Array(String(repeating: #"{"event":"BuyProduct","price":9.99},"#, count: 500).utf8)
        var sizes: [Int32: Int] = [:]
        for level in Int32(0)...12 {
            let compressed = try Gzip.compress(input, level: level)
            #expect(try Gzip.decompress(compressed) == input, "level \(level)")
            sizes[level] = compressed.count
        }
        #expect(sizes[0]! > input.count, "level 0 stores")
        #expect(sizes[1]! < input.count / 10 && sizes[9]! <= sizes[1]!)
        for level: Int32 in [-1, 13] {
            let error = #expect(throws: WireError.self) { try Gzip.compress(input, level: level) }
            #expect(error?.code == .compression)
        }
    }

    @Test("concurrent compressions at one level each get a compressor of their own and round trip")
    func concurrentCompression() async throws {
        let results = try await withThrowingTaskGroup(of: Bool.self) { group in
            for task in 0..<8 {
                group.addTask {
                    let input = (0..<50_000).map { UInt8(truncatingIfNeeded: ($0 &* (task + 3)) >> 4) }
                    for _ in 0..<20 where try Gzip.decompress(Gzip.compress(input, level: 1)) != input { return false }
                    return true
                }
            }
            return try await group.reduce(into: [Bool]()) { $0.append($1) }
        }
        #expect(results == Array(repeating: true, count: 8))
    }

    @Test("gunzip refuses garbage, truncation and bombs")
    func gunzipErrors() throws {
        #expect(throws: WireError.self) { try Gzip.decompress(Array("not gzip".utf8)) }
        // A zlib stream (the deflate coding) is not gzip: zlib's automatic header detection accepted it.
        let text = [UInt8](repeating: UInt8(ascii: "z"), count: 1000)
        var zlibStream = [UInt8](repeating: 0, count: 100)
        var zlibSize = uLongf(zlibStream.count)
        #expect(compress2(&zlibStream, &zlibSize, text, uLong(text.count), 6) == Z_OK)
        let notGzip = #expect(throws: WireError.self) { try Gzip.decompress(Array(zlibStream.prefix(Int(zlibSize)))) }
        #expect(notGzip?.code == .malformedBody)
        #expect(notGzip?.message.contains("not valid gzip") == true, "\(notGzip?.message ?? "")")
        let compressed = try Gzip.compress([UInt8](repeating: 7, count: 100_000))
        #expect(throws: WireError.self) { try Gzip.decompress(Array(compressed.prefix(compressed.count / 2))) }
        let error = #expect(throws: WireError.self) { try Gzip.decompress(compressed, limit: 1000) }
        #expect(error?.code == .tooLarge)
    }

    @Test("gunzip treats the trailer's stated size as a hint only: understated, overstated, another member's")
    func gunzipSizeHint() throws {
        let input = (0..<200_000).map { UInt8(truncatingIfNeeded: ($0 &* 2_654_435_761) >> 13) }
        let compressed = try Gzip.compress(input, level: 1)
        func stating(_ size: UInt32) -> [UInt8] {
            var lying = compressed
            for index in 0..<4 { lying[lying.count - 4 + index] = UInt8(truncatingIfNeeded: size >> (8 * index)) }
            return lying
        }
        // The trailer's ISIZE is outside the CRC-32; inflate checks it against the output, so a wrong
        // one is an error; but the buffer must never be what refuses a valid body.
        #expect(try Gzip.decompress(compressed, limit: input.count) == input)
        for lie: UInt32 in [10, UInt32(input.count + 1), UInt32.max] {
            let error = #expect(throws: WireError.self) { try Gzip.decompress(stating(lie), limit: input.count * 2) }
            #expect(error?.code == .malformedBody, "stated \(lie): zlib's length check, not the buffer, refuses it")
        }
        #expect(throws: WireError.self) { try Gzip.decompress(compressed, limit: input.count - 1) }
        // Two members: the trailer read is the last one's, 10 bytes; the output grows from there, doubling.
        let repeated = [UInt8](repeating: 42, count: 300_000) + Array("0123456789".utf8)
        let members = try Gzip.compress(Array(repeated.prefix(300_000)), level: 9) + Gzip.compress(Array(repeated.suffix(10)))
        #expect(members.count < repeated.count / 64, "several doublings")
        #expect(try Gzip.decompress(members) == repeated)
        #expect(try Gzip.decompress(members, limit: repeated.count) == repeated)
        let error = #expect(throws: WireError.self) { try Gzip.decompress(members, limit: repeated.count - 1) }
        #expect(error?.code == .tooLarge)
        // No limit at all (Int.max) is a limit too: nothing overflows.
        #expect(try Gzip.decompress(members, limit: .max) == repeated)
        #expect(throws: WireError.self) { try Gzip.decompress(Array("garbage".utf8), limit: .max) }
    }

    @Test("Content-Type: the format, and a charset other than UTF-8 refused", arguments: [
        ("application/x-ndjson", WireFormat.ndjson), ("application/x-ndjson; charset=utf-8", .ndjson),
        ("Application/X-NDJSON; Charset=\"UTF-8\"", .ndjson), ("application/x-www-form-urlencoded; charset=us-ascii", .sensors),
        ("application/x-ndjson; charset=latin1", nil), ("application/x-www-form-urlencoded;charset=utf-16", nil),
        ("text/plain", nil), ("", nil),
    ])
    func contentType(header: String, format: WireFormat?) {
        #expect(WireFormat(contentType: header) == format)
    }

    @Test("a body whose size is right but whose CRC-32 or data is not is refused as malformed, by name")
    func gunzipDamaged() throws {
        let input = Array(String(repeating: #"{"event":"BuyProduct","price":9.99},"#, count: 2_000).utf8)
        let compressed = try Gzip.compress(input, level: 1)
        // The CRC-32 is the 4 bytes before ISIZE: libdeflate refuses the body, zlib then names the fault.
        var badCheck = compressed
        badCheck[badCheck.count - 8] ^= 0x01
        let checkError = #expect(throws: WireError.self) { try Gzip.decompress(badCheck) }
        #expect(checkError?.code == .malformedBody && checkError?.message.contains("not valid gzip") == true)
        // A flipped bit in the middle of the DEFLATE data.
        var badData = compressed
        badData[badData.count / 2] ^= 0x10
        let dataError = #expect(throws: WireError.self) { try Gzip.decompress(badData) }
        #expect(dataError?.code == .malformedBody)
        // Undamaged, the same bytes inflate.
        #expect(try Gzip.decompress(compressed) == input)
    }

    @Test("a gzip body of several members inflates to all of them, as gunzip's; other trailing bytes are refused")
    func gunzipMembers() throws {
        let first = Array(String(repeating: #"{"event":"A"},"#, count: 700).utf8)
        let second = Array(String(repeating: #"{"event":"B"},"#, count: 700).utf8)
        let third = Array("tail".utf8)
        let members = try Gzip.compress(first) + Gzip.compress(second)
        // Both members are as long, so the last trailer states the first member's size exactly: the
        // first member alone must not pass for the body.
        #expect(first.count == second.count)
        #expect(try Gzip.decompress(members) == first + second)
        #expect(try Gzip.decompress(members + Gzip.compress(third)) == first + second + third)
        #expect(try Gzip.decompress(members, limit: first.count * 2) == first + second)
        let tooLarge = #expect(throws: WireError.self) { try Gzip.decompress(members, limit: first.count * 2 - 1) }
        #expect(tooLarge?.code == .tooLarge)
        for trailing: [UInt8] in [[0], [0x1f], Array("garbage".utf8)] {
            let error = #expect(throws: WireError.self) { try Gzip.decompress(Gzip.compress(first) + trailing) }
            #expect(error?.code == .malformedBody && error?.message.contains("after its compressed data") == true,
                    "\(trailing): \(String(describing: error))")
        }
        let cut = #expect(throws: WireError.self) { try Gzip.decompress(Array(members.dropLast(5))) }
        #expect(cut?.message.contains("truncated") == true, "\(String(describing: cut))")
    }

    @Test("a truncated gzip body says so")
    func gunzipTruncated() throws {
        let compressed = try Gzip.compress(Array(repeating: Array("abc".utf8), count: 10_000).flatMap { $0 })
        for cut in [compressed.count - 1, compressed.count - 8, compressed.count / 2] {
            let error = #expect(throws: WireError.self) { try Gzip.decompress(Array(compressed.prefix(cut))) }
            #expect(error?.message.contains("truncated") == true, "\(cut): \(String(describing: error))")
        }
    }

    @Test("Java String.hashCode matches Java's values", arguments: [
        ("", Int32(0)), ("a", 97), ("hello", 99_162_322), ("Hello, World!", 1_498_789_909),
        ("polygenelubricants", Int32.min),
    ])
    func javaHash(text: String, expected: Int32) {
        #expect(javaStringHash(text) == expected)
    }

    @Test("each format round trips", arguments: WireFormat.allCases)
    func roundTrip(format: WireFormat) throws {
        let batch = try format.encode(Self.events)
        let contentType = batch.headers.first { $0.name == "Content-Type" }?.value
        let encoding = batch.headers.first { $0.name == "Content-Encoding" }?.value
        #expect(WireFormat(contentType: contentType) == format)
        let decoded = try format.decode(batch.body, contentEncoding: encoding)
        #expect(decoded.map { $0["event"] as? String } == ["A", "B"])
        #expect((decoded[0]["properties"] as? [String: Any])?["s"] as? String == "é+/= &")
    }

    @Test("sensors form: crc is checked, fields are as the SDK sends them")
    func sensorsForm() throws {
        let batch = try WireFormat.sensors.encode(Self.events)
        let form = parseForm(String(decoding: batch.body, as: UTF8.self))
        #expect(form["gzip"] == "1")
        let dataList = try #require(form["data_list"])
        #expect(form["crc"] == String(javaStringHash(dataList)))
        let json = try Gzip.decompress(Array(try #require(Data(base64Encoded: dataList))))
        #expect(String(decoding: json, as: UTF8.self).hasPrefix(#"[{"event":"A""#))

        let tampered = String(decoding: batch.body, as: UTF8.self).replacingOccurrences(
            of: "crc=\(form["crc"]!)", with: "crc=12345")
        let error = #expect(throws: WireError.self) {
            try WireFormat.sensors.decode(Array(tampered.utf8), contentEncoding: nil)
        }
        #expect(error?.code == .crcMismatch)
    }

    @Test("malformed bodies are typed errors", arguments: [
        (WireFormat.sensors, "gzip=1&crc=1", WireError.Code.malformedBody),
        (.sensors, "data_list=%%%", .malformedBody),
        (.ndjson, "{\"a\":1}\nnot json\n", .malformedBody),
    ])
    func malformed(format: WireFormat, body: String, code: WireError.Code) {
        let error = #expect(throws: WireError.self) { try format.decode(Array(body.utf8), contentEncoding: nil) }
        #expect(error?.code == code)
    }

    @Test("decodeWithText gives each element's text as sent, whitespace between elements left out")
    func elementTexts() throws {
        let elements = [#"{"a":"],\"}"}"#, #"{ "b" : [1, {"c":"\\"}], "d":{} }"#, #"{}"#]
        let array = " [\n " + elements.joined(separator: " ,\n\t") + " ]\n"
        let base64 = Data(array.utf8).base64EncodedString()
        let body = Array(("crc=\(javaStringHash(base64))&data_list=" + formURLEncode(base64)).utf8)
        let decoded = try WireFormat.sensors.decodeWithText(body, contentEncoding: nil)
        #expect(decoded.map { String(decoding: $0.text, as: UTF8.self) } == elements)
        #expect(decoded[1].object["d"] is [String: Any])
    }
}
