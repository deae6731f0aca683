import Foundation
import Testing
import TributaryStore

@Suite("Randomness")
struct RandomnessTests {
    @Test("event ids are version-4 UUIDs in lowercase canonical form, all distinct across pool refills")
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
