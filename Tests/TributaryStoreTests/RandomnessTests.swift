import Foundation
import Testing
import TributaryStore

@Suite("Randomness")
struct RandomnessTests {
    @Test("random ids are version-4 UUIDs in lowercase canonical form, all distinct across pool refills")
    func uuids() throws {
        let count = 20_000  // 78 refills of the 4 KiB pool
        var seen = Set<String>()
        seen.reserveCapacity(count)
        for _ in 0..<count {
            let id = randomUUIDString()
            let uuid = try #require(UUID(uuidString: id), "\(id) is not a UUID")
            #expect(uuid.uuidString.lowercased() == id)
            let bytes = Array(id.utf8)
            #expect(bytes[14] == UInt8(ascii: "4"))  // version 4
            #expect("89ab".utf8.contains(bytes[19]))  // RFC 4122 variant
            seen.insert(id)
        }
        #expect(seen.count == count)
    }

    @Test("time-ordered ids are version-7 UUIDs holding their millisecond, sorting by it, all distinct")
    func timeOrderedUUIDs() throws {
        let start: Int64 = 1_795_000_000_000  // 2026-11-18
        var seen = Set<String>()
        var previous = ""
        for step in 0..<5_000 {
            let millis = start + Int64(step / 10)  // ten ids per millisecond
            let id = timeOrderedUUIDString(unixMillis: millis)
            let uuid = try #require(UUID(uuidString: id), "\(id) is not a UUID")
            #expect(uuid.uuidString.lowercased() == id)
            let bytes = Array(id.utf8)
            #expect(bytes[14] == UInt8(ascii: "7"))  // version 7
            #expect("89ab".utf8.contains(bytes[19]))  // RFC 9562 variant
            #expect(Self.millis(of: id) == millis)
            if step % 10 == 0 { #expect(id > previous, "an id of a later millisecond sorts after the earlier ones") }
            previous = max(previous, id)
            seen.insert(id)
        }
        #expect(seen.count == 5_000)
        let now = BootClock.wallMillis()
        let current = timeOrderedUUIDString()
        let currentMillis = try #require(Self.millis(of: current))
        #expect(abs(currentMillis - now) < 60_000, "the default is the wall clock")
    }

    /// The 48-bit millisecond of a version-7 UUID's text: its first 12 hex digits.
    static func millis(of id: String) -> Int64? {
        Int64(String(id.prefix(8)) + String(id.dropFirst(9).prefix(4)), radix: 16)
    }

    @Test("random integers stay within their bound and use all of it")
    func integers() {
        var values = Set<UInt64>()
        for _ in 0..<2_000 {
            let value = randomInteger(upTo: 7)
            #expect(value <= 7)
            values.insert(value)
        }
        #expect(values == Set(0...7))
        #expect((0..<1_000).map { _ in randomInteger(upTo: UInt64(Int32.max)) }.contains { $0 > UInt64(Int32.max) / 2 })
    }

    @Test("concurrent draws never hand out the same bytes twice")
    func concurrentDraws() async {
        let ids = await withTaskGroup(of: [String].self) { group in
            for _ in 0..<8 { group.addTask { (0..<2_000).map { _ in randomUUIDString() } } }
            return await group.reduce(into: []) { $0 += $1 }
        }
        #expect(Set(ids).count == 16_000)
    }
}
