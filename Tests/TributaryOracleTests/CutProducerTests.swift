import Foundation
import Testing
import TributaryOracle

/// How the oracle judges producers a power cut ended (reliability scenario 12): their events whose
/// ledger lines never left the machine may arrive; nothing else unlisted may.
@Suite struct CutProducerTests {
    /// A ledger file listing `producer_seq`s of `producer` (event ids `producer-SEQ`), in the order given.
    private func ledger(_ producer: String, _ seqs: [UInt64], in directory: URL) throws -> Oracle.Ledger {
        let path = directory.appendingPathComponent("\(producer).ledger").path
        let text = seqs.map { "\($0) \($0) \(producer)-\($0)\n" }.joined()
        try text.write(toFile: path, atomically: true, encoding: .utf8)
        return Oracle.Ledger(producer: producer, path: path)
    }

    /// What the collector got: `producer`'s events with these `producer_seq`s, in this order.
    private func observed(_ producer: String, _ seqs: [UInt64]) -> Oracle.Observed {
        Oracle.Observed(
            deliveries: seqs.map {
                Oracle.Delivery(eventID: "\(producer)-\($0)", producer: producer, producerSeq: $0, seq: $0)
            },
            wireDuplicates: 0)
    }

    private func withDirectory<T>(_ body: (URL) throws -> T) throws -> T {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("oracle-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        return try body(directory)
    }

    @Test("a cut producer's events past its ledger's last line arrive as its unacknowledged tail, not unexpected")
    func tailPastTheLastLine() throws {
        let verdict = try withDirectory { directory in
            var oracle = Oracle(ledgers: [try ledger("p", [1, 2, 3], in: directory)])
            oracle.cutProducers = ["p"]
            return oracle.judge(observed("p", [1, 2, 3, 4, 5]))
        }
        #expect(verdict.unacknowledgedTail == 2)
        #expect(verdict.unexpected == 0)
        #expect(verdict.passed)
    }

    @Test("an unlisted event below a single caller's last line is unexpected: its lines go out in order")
    func singleCallerHoleIsUnexpected() throws {
        let verdict = try withDirectory { directory in
            var oracle = Oracle(ledgers: [try ledger("p", [1, 2, 4], in: directory)])
            oracle.cutProducers = ["p"]
            return oracle.judge(observed("p", [1, 2, 3, 4]))
        }
        #expect(verdict.unexpected == 1)
        #expect(verdict.unacknowledgedTail == 0)
        #expect(!verdict.passed)
    }

    @Test("with 4 concurrent callers, 3 unlisted events below the last line are allowed (lines still in flight), a 4th is unexpected")
    func concurrentCallersHoles() throws {
        // The callers of 3, 5 and 6 had their events stored, their lines not yet out, when the power went;
        // the callers of 7 and 8 wrote theirs first (the system test's power-loss boot 3, 2026-11-29).
        let allowed = try withDirectory { directory in
            var oracle = Oracle(ledgers: [try ledger("p", [1, 2, 4, 8, 7], in: directory)])
            oracle.cutProducers = ["p"]
            oracle.cutCallers = 4
            return oracle.judge(observed("p", [1, 2, 3, 4, 5, 6, 7, 8, 9]))
        }
        #expect(allowed.unacknowledgedTail == 4)  // 3, 5, 6 below the last line; 9 past it
        #expect(allowed.unexpected == 0)
        #expect(allowed.lost == 0)
        #expect(allowed.passed)

        let tooMany = try withDirectory { directory in
            var oracle = Oracle(ledgers: [try ledger("p", [1, 8], in: directory)])
            oracle.cutProducers = ["p"]
            oracle.cutCallers = 4
            return oracle.judge(observed("p", [1, 2, 3, 4, 5, 8]))
        }
        #expect(tooMany.unacknowledgedTail == 3)
        #expect(tooMany.unexpected == 1)
        #expect(!tooMany.passed)
    }

    @Test("a producer no cut ended gets no allowance: its unlisted events are unexpected wherever they fall")
    func uncutProducer() throws {
        let verdict = try withDirectory { directory in
            var oracle = Oracle(ledgers: [try ledger("p", [1, 2], in: directory)])
            oracle.cutCallers = 4
            return oracle.judge(observed("p", [1, 2, 3]))
        }
        #expect(verdict.unexpected == 1)
        #expect(verdict.unacknowledgedTail == 0)
    }
}
