import Testing
import TributaryCollector
import TributaryTestSupport

@testable import TributaryAgentCore

/// A model-based property test of the upload's decisions (``UploadMachine``): seeded random runs against
/// an outbox and a collector kept in memory, on a manual clock, with no sleeps. The collector refuses
/// batches holding a poison event (400), batches over its size limit or holding an event too large
/// alone (413), and answers 503 at random; steps get random event limits (a deadline near), and time
/// passes at random (batches read ahead grow stale). After every run: each ordinary event delivered
/// exactly once and in store order, every poison or oversized event dead-lettered and nothing else,
/// and no batch sent before the one before it was acknowledged.
@Suite("Upload decisions against a reference model")
struct UploadMachineModelTests {
    /// A batch read ahead: what the in-memory outbox prepared.
    struct Ahead: UploadAhead {
        var batch: Outbox.PreparedBatch
    }

    typealias Machine = UploadMachine<TestClock, Ahead>

    /// Seeds replayed on every run with a fresh one.
    static let regressionSeeds: [UInt64] = [1, 2, 3, 7, 42]

    @Test("random runs deliver everything in order, exactly once, and dead-letter only what the collector refuses alone",
          arguments: regressionSeeds + [Reliability.seed()])
    func randomRuns(seed: UInt64) {
        var rng = SplitMix64(seed: seed)
        for run in 0..<(20 * Reliability.soak) {
            check(run: run, rng: &rng, comment: "seed \(seed), run \(run): \(Reliability.replay("UploadMachineModelTests", seed: seed))")
        }
    }

    func check(run: Int, rng: inout SplitMix64, comment: String) {
        let clock = TestClock()
        let events = Int.random(in: 1...300, using: &rng)
        var outbox = MemoryOutbox()
        for seq in 1...UInt64(events) {
            let roll = Int.random(in: 0..<100, using: &rng)
            outbox.add(seq: seq, kind: roll < 3 ? .poison : roll < 5 ? .huge : .ordinary)
        }
        let collector = MemoryCollector(
            maxBatch: [7, 40, 1000].randomElement(using: &rng)!, retryPercent: Int.random(in: 0...30, using: &rng))
        var machine = Machine(
            batchSize: [1, 10, 100].randomElement(using: &rng)!,
            policy: .init(
                backoff: Backoff(), haltAfterDeadLetters: 0, readAheadMaxAge: .seconds(1),
                defersAcknowledgements: run % 2 == 0))
        var delivered: [UInt64] = []
        var inFlightSent: String?

        for _ in 0..<20_000 {
            guard !outbox.isEmpty || machine.unsettled != nil else { break }
            clock.advance(by: .milliseconds(Int64.random(in: 0...700, using: &rng)))
            let maxEvents: Int? = Int.random(in: 0..<4, using: &rng) == 0 ? Int.random(in: 1...50, using: &rng) : nil
            // One step, as UploadSession.step drives it.
            var sent: (id: String, rows: [MemoryOutbox.Stored], readAheadLimit: Int?)?
            stepping: while sent == nil {
                switch machine.start(maxEvents: maxEvents, now: clock.now) {
                case .sendReady(let ready, let unsettled, let limit):
                    if let unsettled {
                        let madeInFlight = outbox.acknowledge(unsettled.batchID, then: unsettled.next)
                        delivered += outbox.lastAcknowledged
                        guard machine.settledBeside(madeInFlight: madeInFlight) else { break stepping }
                    }
                    #expect(outbox.inFlight?.id == ready.batch.id, "a ready batch is the outbox's batch in flight (\(comment))")
                    sent = (ready.batch.id, outbox.rows(inBatch: ready.batch.id), limit)
                case .settle(let unsettled):
                    machine.settled(madeInFlight: outbox.acknowledge(unsettled.batchID, then: unsettled.next))
                    delivered += outbox.lastAcknowledged
                case .refuse(let refused):
                    #expect(machine.haltCheck(refused, inARow: 0, heldSeq: nil) == .deadLetter, "\(comment)")
                    outbox.deadLetter(refused.row.seq)
                    machine.deadLettered(refused)
                    break stepping
                case .rebatch(let rows):
                    machine.halfBatched(outbox.rebatch(rows.map(\.seq)).map(\.row))
                case .sendHalf(let half):
                    let id = half[0].batchID!
                    #expect(half.map(\.seq) == outbox.rows(inBatch: id).map(\.seq), "\(comment)")
                    sent = (id, outbox.rows(inBatch: id), nil)
                case .read(let limit):
                    guard let batch = outbox.nextBatch(limit: limit) else { break stepping }
                    sent = (batch.id, batch.rows, limit)
                }
            }
            guard let sent else { continue }
            // Promise 3: a batch goes only once every earlier batch is acknowledged.
            if let first = outbox.pending.first { #expect(sent.rows.first?.seq == first.seq, "sent out of order (\(comment))") }
            if let previous = inFlightSent, previous != sent.id {
                #expect(!outbox.pending.contains { $0.batchID == previous }, "a new batch while another is in flight (\(comment))")
            }
            inFlightSent = sent.id
            let readAhead = sent.readAheadLimit.flatMap { outbox.peekBatch(after: sent.id, limit: $0) }.map(Ahead.init)
            machine.sent(readAhead: readAhead, builtAt: clock.now)
            let outcome = collector.answer(sent.rows, rng: &rng)
            let refused = Machine.needsRows(for: outcome, count: sent.rows.count) ? sent.rows.map(\.row) : []
            switch machine.answered(outcome, batchID: sent.id, count: sent.rows.count, refusedRows: refused, using: &rng) {
            case .acknowledge(let id, let then):
                machine.acknowledged(madeInFlight: outbox.acknowledge(id, then: then))
                delivered += outbox.lastAcknowledged
            case .acknowledgeLater:
                delivered += sent.rows.map(\.seq)  // recorded by a later step; the collector has them
                outbox.deliveredUnrecorded(sent.id)
            case .refuse(let alone):
                #expect(machine.haltCheck(alone, inARow: 0, heldSeq: nil) == .deadLetter, "\(comment)")
                outbox.deadLetter(alone.row.seq)
                machine.deadLettered(alone)
            case .shrink(let id):
                outbox.unbatch(id)
            case .retry, .bisect:
                break
            case .halt:
                Issue.record("\(comment)")  // no answer of this collector halts
            }
        }
        #expect(outbox.isEmpty && machine.unsettled == nil, "the run did not finish (\(comment))")
        let expected = outbox.all.filter { $0.kind == .ordinary }.map(\.seq)
        #expect(delivered == expected, "delivered in store order, each once (\(comment))")
        #expect(outbox.deadLettered.sorted() == outbox.all.filter { $0.kind != .ordinary }.map(\.seq), "\(comment)")
    }
}

/// An outbox in memory, as far as the upload sees it: rows in store order, each with the batch it was
/// last sent in; the batch in flight is the rows at the head that share one id.
struct MemoryOutbox {
    enum Kind { case ordinary, poison, huge }

    struct Stored {
        var seq: UInt64
        var kind: Kind
        var batchID: String?
        var row: Outbox.Row {
            var row = OutboxTests.row(seq)
            row.id = Int64(seq)
            row.batchID = batchID
            return row
        }
    }

    private(set) var pending: [Stored] = []
    private(set) var all: [Stored] = []
    private(set) var deadLettered: [UInt64] = []
    /// The seqs the last acknowledgement removed (those the collector acknowledged earlier, deferred, excepted).
    private(set) var lastAcknowledged: [UInt64] = []
    /// Batches the collector acknowledged whose rows wait for a deferred acknowledgement.
    private var unrecorded: Set<String> = []
    private var nextID = 0

    var isEmpty: Bool { pending.isEmpty }
    var inFlight: (id: String, count: Int)? {
        guard let id = pending.first?.batchID else { return nil }
        return (id, pending.prefix { $0.batchID == id }.count)
    }

    mutating func add(seq: UInt64, kind: Kind) {
        pending.append(Stored(seq: seq, kind: kind))
        all.append(Stored(seq: seq, kind: kind))
    }

    private mutating func newID() -> String {
        nextID += 1
        return "batch-\(nextID)"
    }

    func rows(inBatch id: String) -> [Stored] { pending.filter { $0.batchID == id } }

    /// The batch in flight, or, when there is none or it is over `limit`, a new one of the first
    /// `limit` rows (the rest back in the pool).
    mutating func nextBatch(limit: Int) -> (id: String, rows: [Stored])? {
        guard !pending.isEmpty else { return nil }
        if let (id, count) = inFlight, count <= limit { return (id, Array(pending.prefix(count))) }
        let id = newID()
        for i in pending.indices { pending[i].batchID = i < limit ? id : nil }
        return (id, Array(pending.prefix(limit)))
    }

    /// The batch after the one in flight, as it would be built now.
    mutating func peekBatch(after id: String, limit: Int) -> Outbox.PreparedBatch? {
        let rest = pending.drop { $0.batchID == id }.prefix(limit)
        guard let first = rest.first, let last = rest.last, rest.allSatisfy({ $0.batchID == nil }) else { return nil }
        return Outbox.PreparedBatch(
            id: newID(), count: rest.count, bytes: 0, firstID: Int64(first.seq), lastID: Int64(last.seq), deadLettersWhenRead: 0)
    }

    /// Removes batch `id`'s rows and makes `then` the batch in flight if its rows are still what it holds.
    mutating func acknowledge(_ id: String, then: Outbox.PreparedBatch?) -> Bool {
        lastAcknowledged = unrecorded.remove(id) == nil ? rows(inBatch: id).map(\.seq) : []
        pending.removeAll { $0.batchID == id }
        guard let then else { return false }
        let rows = pending.prefix(then.count)
        guard rows.count == then.count, rows.first?.seq == UInt64(then.firstID), rows.last?.seq == UInt64(then.lastID),
            rows.allSatisfy({ $0.batchID == nil })
        else { return false }
        for i in 0..<then.count { pending[i].batchID = then.id }
        return true
    }

    mutating func deliveredUnrecorded(_ id: String) { unrecorded.insert(id) }

    mutating func rebatch(_ seqs: [UInt64]) -> [Stored] {
        let id = newID()
        for i in pending.indices { pending[i].batchID = seqs.contains(pending[i].seq) ? id : nil }
        return rows(inBatch: id)
    }

    mutating func unbatch(_ id: String) {
        for i in pending.indices where pending[i].batchID == id { pending[i].batchID = nil }
    }

    mutating func deadLetter(_ seq: UInt64) {
        pending.removeAll { $0.seq == seq }
        deadLettered.append(seq)
    }
}

/// A collector in memory: 400 for a batch with a poison event, 413 for one over its size or with an
/// event too large alone, 503 at random, else 200.
struct MemoryCollector {
    var maxBatch: Int
    var retryPercent: Int

    func answer(_ rows: [MemoryOutbox.Stored], rng: inout SplitMix64) -> UploadOutcome {
        if Int.random(in: 0..<100, using: &rng) < retryPercent { return .retry(reason: "HTTP 503", retryAfter: nil) }
        if rows.count > maxBatch || rows.contains(where: { $0.kind == .huge }) { return .tooLarge(reason: "HTTP 413") }
        if rows.contains(where: { $0.kind == .poison }) { return .rejected(status: 400, reason: "HTTP 400: poison") }
        return .delivered
    }
}
