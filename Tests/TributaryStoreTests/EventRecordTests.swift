import Testing
@testable import TributaryStore

@Suite("Record format v1")
struct EventRecordTests {
    static func sample(id: String = "app", body: String = #"{"event":"X"}"#) -> EventRecord {
        EventRecord(
            producerKind: .extension, producerID: id, pid: 4242, producerSeq: 7, wallTimeMillis: 1_700_000_000_123,
            bootTimeNanos: 123_456_789_012, bootID: BootID(uuidString: "52fe9acc-1bcf-4248-9725-f68ca9e48bf7")!,
            body: Array(body.utf8))
    }

    @Test("round trip", arguments: [
        ("app", #"{"event":"X"}"#),
        ("share-extension", ""),
        ("é-producer-ü", #"{"k":"\u00e9 \n"}"#),
        (String(repeating: "p", count: 255), String(repeating: "x", count: 70_000)),
    ])
    func roundTrip(id: String, body: String) throws {
        let record = Self.sample(id: id, body: body)
        let bytes = record.encoded()
        #expect(bytes.count == record.encodedSize)
        #expect(bytes[0] == EventRecord.formatVersion)
        let decoded = try bytes.withUnsafeBytes { try EventRecord.decode($0) }
        #expect(decoded == record)
    }

    @Test("a flipped byte anywhere outside the CRC field is detected (kind and header length included)",
          arguments: [1, 2, 3, 8, 12, 20, 30, 40, 52, 54, 60, 66])
    func crcDetectsFlip(offset: Int) {
        var bytes = Self.sample().encoded()
        bytes[offset] ^= 0x40
        #expect(throws: EventRecord.Corruption.self) {
            try bytes.withUnsafeBytes { try EventRecord.decode($0) }
        }
    }

    @Test("truncated records and unknown versions are rejected")
    func truncatedAndVersion() {
        let bytes = Self.sample().encoded()
        for length in [0, 1, 10, 53, bytes.count - 1] {
            #expect(throws: EventRecord.Corruption.self) {
                try Array(bytes.prefix(length)).withUnsafeBytes { try EventRecord.decode($0) }
            }
        }
        var future = bytes
        future[0] = 9
        let error = #expect(throws: EventRecord.Corruption.self) {
            try future.withUnsafeBytes { try EventRecord.decode($0) }
        }
        #expect(error?.reason.contains("version 9") == true)
    }

    @Test("a producer id length outside 1 … 255 is corruption, even under a valid CRC", arguments: [0, 256])
    func producerIDLength(length: Int) {
        let bytes = Self.sample(id: String(repeating: "p", count: length)).encoded()
        let error = #expect(throws: EventRecord.Corruption.self) {
            try bytes.withUnsafeBytes { try EventRecord.decode($0) }
        }
        #expect(error?.reason.contains("producer id length \(length)") == true, "\(String(describing: error))")
    }

    @Test("boot id parses and prints the canonical form")
    func bootID() {
        let text = "52fe9acc-1bcf-4248-9725-f68ca9e48bf7"
        #expect(BootID(uuidString: text)?.description == text)
        #expect(BootID(uuidString: "nope") == nil)
        #expect(BootID.current != BootID.unknown)
    }

    @Test("the record CRC is CRC-32 of the IEEE 802.3 polynomial: known answers (zlib's crc32 wrote older stores)")
    func crcKnownAnswers() {
        #expect(Array("123456789".utf8).withUnsafeBytes { crc32Of($0) } == 0xCBF4_3926)
        // Values from Python's zlib.crc32 over a fixed 300-byte pattern: v2 covers bytes 0 … 3 and 8 … end.
        let record = (0..<300).map { UInt8(($0 * 37 + 11) % 256) }
        #expect(record.withUnsafeBytes { EventRecord.crc(of: $0, version: 2) } == 0xBE81_7119)
        #expect(record.withUnsafeBytes { EventRecord.crc(of: $0, version: 1) } == 0xC098_F3EB)
    }

    @Test("a version 1 record (CRC over bytes 8 … end) is still read")
    func legacyRecord() throws {
        var bytes = Self.sample().encoded()
        bytes[0] = 1
        let crc = bytes.withUnsafeBytes { EventRecord.crc(of: $0, version: 1) }
        withUnsafeBytes(of: crc.bigEndian) { bytes.replaceSubrange(4..<8, with: $0) }
        let decoded = try bytes.withUnsafeBytes { try EventRecord.decode($0) }
        #expect(decoded == Self.sample())
    }
}
