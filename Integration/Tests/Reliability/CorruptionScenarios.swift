import Foundation
import Testing
import TributaryCollector
import TributaryStore
import TributaryTestSupport

extension ReliabilityScenarios {
    /// Scenario 10: bits flipped in stored records (Jepsen's file-corruption nemesis, aimed at records).
    /// Each record's CRC-32 detects the flip; the agent keeps the record as a dead letter with the reason,
    /// never uploads it, and delivers every other event in order.
    @Suite("Reliability: corruption", .serialized, .timeLimit(.minutes(4 * Reliability.soak)))
    struct CorruptionScenarios {
        @Test("bit flips in stored records: detected by the CRC, dead-lettered with a reason, never uploaded, the rest delivered")
        func flippedRecords() async throws {
            let seed = Reliability.seed()
            var rng = SplitMix64(seed: seed)
            let rounds = Reliability.soak
            try await withTemporaryGroup { group in
                try await Collector.withRunning(CollectorConfiguration()) { collector in
                    var oracle = Oracle(ledgers: [])
                    oracle.batchSize = Scenario.batchSize
                    var flippedSeqs: Set<UInt64> = []
                    for round in 0..<rounds {
                        let ledgers = try await Scenario.produce(group, [("flip-\(round)", 300)], extra: ["--concurrency", "0"])
                        oracle.ledgers += ledgers
                        let entries = ledgers[0].entries()
                        // Three victims, each flipped wherever its bytes lie in the file (live page or old copy).
                        for _ in 0..<3 {
                            let victim = entries[Int(rng.next() % UInt64(entries.count))]
                            guard !flippedSeqs.contains(victim.seq) else { continue }
                            let flips = try Self.flipBit(in: group + "/" + SharedStore.fileName, near: Array(victim.eventID.utf8),
                                                         bit: Int(rng.next() % 8))
                            #expect(flips > 0, "event \(victim.eventID) not found in the store file")
                            flippedSeqs.insert(victim.seq)
                            oracle.expectedUndelivered.insert(victim.eventID)
                        }
                        try await Scenario.drain(group, collector)
                    }
                    let letters = try await ChildProcess.run("tributary", ["dead-letters", "--outbox", Scenario.outbox(group), "--json"])
                    let quarantined = try Self.corruptSeqs(letters.stdout)
                    #expect(quarantined == flippedSeqs, "dead-lettered \(quarantined.sorted()), flipped \(flippedSeqs.sorted())")
                    let delivered = Set(try await collector.events().map(\.eventID))
                    #expect(oracle.expectedUndelivered.isDisjoint(with: delivered), "a corrupt record was uploaded")
                    try await Scenario.conclude(
                        "10 bit flips in stored records (\(flippedSeqs.count) quarantined)", test: "CorruptionScenarios/flippedRecords",
                        iterations: rounds, oracle: oracle, collector: collector, group: group, seed: seed)
                }
            }
        }

        /// Flips `bit` of the byte just after every occurrence of `needle` in the file; returns how many.
        static func flipBit(in path: String, near needle: [UInt8], bit: Int) throws -> Int {
            var bytes = [UInt8](try Data(contentsOf: URL(fileURLWithPath: path)))
            var flips = 0
            var i = 0
            while i + needle.count < bytes.count {
                if bytes[i] == needle[0], Array(bytes[i..<(i + needle.count)]) == needle {
                    bytes[i + needle.count] ^= UInt8(1 << bit)
                    flips += 1
                    i += needle.count
                } else {
                    i += 1
                }
            }
            if flips > 0 { try Data(bytes).write(to: URL(fileURLWithPath: path)) }
            return flips
        }

        /// The `seq` of every dead letter whose reason says the store record was corrupt.
        static func corruptSeqs(_ json: String) throws -> Set<UInt64> {
            let letters = try JSONSerialization.jsonObject(with: Data(json.utf8)) as? [[String: Any]] ?? []
            return Set(letters.compactMap { letter -> UInt64? in
                guard let reason = letter["reason"] as? String, reason.contains("corrupt"),
                    let seq = (letter["seq"] as? NSNumber)?.uint64Value
                else { return nil }
                return seq
            })
        }
    }
}
