import Foundation
import Testing
import TributaryWire

/// The request bodies the agent builds event by event: the same bytes the collector has always
/// decoded (base64, form encoding and `crc` as the Sensors SDK writes them), at every gzip level.
@Suite("Batch bodies")
struct BatchBodyTests {
    /// `count` events of varying length, so that the gzip output ends on each base64 padding case.
    static func events(_ count: Int) -> [[UInt8]] {
        (0..<count).map { i in
            Array(#"{"event":"E\#(i)","event_id":"id-\#(i)","properties":{"s":"\#(String(repeating: "+/=&é", count: i % 7))"}}"#.utf8)
        }
    }

    @Test("the Sensors form is the base64 of the gzip, form-encoded, with the Java hash as crc", arguments: 0..<12)
    func sensorsFormBytes(count: Int) throws {
        let encoded = try WireFormat.sensors.encode(Self.events(count))
        let text = String(decoding: encoded.body, as: UTF8.self)
        let dataList = try #require(parseForm(text)["data_list"])
        let gzipped = try #require(Data(base64Encoded: dataList))
        // Foundation's base64 and the form encoder give the very same text.
        let base64 = gzipped.base64EncodedString()
        #expect(base64 == dataList)
        #expect(text == "crc=\(javaStringHash(base64))&gzip=1&data_list=" + formURLEncode(base64))
        let json = try Gzip.decompress(Array(gzipped))
        let expected = "[" + Self.events(count).map { String(decoding: $0, as: UTF8.self) }.joined(separator: ",") + "]"
        #expect(String(decoding: json, as: UTF8.self) == expected)
        #expect(encoded.uncompressedBytes == json.count)
    }

    @Test("every gzip level gives a body the collector's decoder reads back", arguments: [Int32(1), 3, 6, 9], WireFormat.allCases)
    func levels(level: Int32, format: WireFormat) throws {
        let events = Self.events(50)
        let encoded = try format.encode(events, gzipLevel: level)
        let encoding = encoded.headers.first { $0.name == "Content-Encoding" }?.value
        let decoded = try format.decodeWithText(encoded.body, contentEncoding: encoding)
        #expect(decoded.map { Array($0.text) } == events)
    }

    @Test("a member is added before the closing brace; text that is not an object is sent unchanged", arguments: [
        (#"{"a":1}"#, #"{"a":1,"f":7}"#), (#"{}"#, #"{"f":7}"#), (" { \"a\" : [1] } \n", " { \"a\" : [1] ,\"f\":7} \n"),
        (#"[1]"#, #"[1]"#), ("", ""),
    ])
    func member(event: String, expected: String) {
        var body = BatchBodyBuilder(format: .ndjson)
        Array(event.utf8).withUnsafeBytes { event in
            Array(#""f":7"#.utf8).withUnsafeBytes { body.append(event, member: $0) }
        }
        #expect(String(decoding: body.text, as: UTF8.self) == expected + "\n")
        #expect(body.count == 1)
    }
}
