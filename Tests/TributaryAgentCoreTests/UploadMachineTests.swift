import Testing
import TributaryCollector

@testable import TributaryAgentCore

/// The upload's rules, step by step on a manual clock (``UploadMachine``): each test hands the machine
/// what the driver saw (a request's answer, the rows of a refused batch, the outbox's run of dead
/// letters) and checks what it decides. No outbox, no HTTP: the upload tests against the reference
/// collector show the driver does what the machine says.
@Suite("Upload decisions")
struct UploadMachineTests {
    /// A batch read ahead, as the machine sees one.
    struct Ahead: UploadAhead, Equatable {
        var batch: Outbox.PreparedBatch
    }

    typealias Machine = UploadMachine<TestClock, Ahead>

    let clock = TestClock()

    /// The machine behind a reference, so that `#expect` can step it.
    @dynamicMemberLookup
    final class Stepped {
        var machine: Machine
        /// The backoff's jitter, seeded.
        var generator = SplitMix64(seed: 7)
        init(_ machine: Machine) { self.machine = machine }
        subscript<T>(dynamicMember path: KeyPath<Machine, T>) -> T { machine[keyPath: path] }

        func start(maxEvents: Int? = nil, at now: TestClock.Instant) -> Machine.Start {
            machine.start(maxEvents: maxEvents, now: now)
        }
        /// Sends what `start` said and answers it: `readAhead` was built beside the request at `now`.
        func answer(
            _ outcome: UploadOutcome, batchID: String, count: Int, readAhead: Ahead? = nil, refusedRows: [Outbox.Row] = [],
            at now: TestClock.Instant
        ) -> Machine.AfterAnswer {
            machine.sent(readAhead: readAhead, builtAt: now)
            return machine.answered(outcome, batchID: batchID, count: count, refusedRows: refusedRows, using: &generator)
        }
        func acknowledged(madeInFlight: Bool) { machine.acknowledged(madeInFlight: madeInFlight) }
        func settled(madeInFlight: Bool) {
            machine.settled(madeInFlight: madeInFlight)
        }
        func settledBeside(madeInFlight: Bool) -> Bool { machine.settledBeside(madeInFlight: madeInFlight) }
        func halfBatched(_ rows: [Outbox.Row]) { machine.halfBatched(rows) }
        func haltCheck(_ refused: Machine.RefusedAlone, inARow: Int, heldSeq: UInt64?) -> Machine.Refusal {
            machine.haltCheck(refused, inARow: inARow, heldSeq: heldSeq)
        }
        func deadLettered(_ refused: Machine.RefusedAlone) { machine.deadLettered(refused) }
        func destinationChanged() { machine.destinationChanged() }
    }

    func machine(batchSize: Int = 500, defers: Bool = false, haltAfter: Int = 10) -> Stepped {
        Stepped(
            Machine(
                batchSize: batchSize,
                policy: .init(
                    backoff: Backoff(base: .seconds(1), cap: .seconds(60)), haltAfterDeadLetters: haltAfter,
                    readAheadMaxAge: .seconds(1), defersAcknowledgements: defers)))
    }

    static func batch(_ id: String, count: Int) -> Ahead {
        Ahead(batch: Outbox.PreparedBatch(id: id, count: count, bytes: count * 100, firstID: 1, lastID: Int64(count), deadLettersWhenRead: 0))
    }

    static func rows(_ seqs: ClosedRange<UInt64>, batchID: String? = nil) -> [Outbox.Row] {
        seqs.map { seq in
            var row = OutboxTests.row(seq)
            row.batchID = batchID
            return row
        }
    }

    // MARK: Which batch goes next

    @Test("a fresh machine reads the outbox, at most the batch size or the step's limit")
    func readsTheOutbox() {
        let upload = machine(batchSize: 500)
        #expect(upload.start(at: clock.now) == .read(limit: 500))
        #expect(upload.start(maxEvents: 120, at: clock.now) == .read(limit: 120))
    }

    @Test("the batch read ahead goes as it is once its predecessor's acknowledgement made it the batch in flight")
    func readAheadGoesNext() {
        let upload = machine()
        let next = Self.batch("b2", count: 500)
        #expect(upload.answer(.delivered, batchID: "b1", count: 500, readAhead: next, at: clock.now)
            == .acknowledge(batchID: "b1", then: next.batch))
        upload.acknowledged(madeInFlight: true)
        #expect(upload.readyBatchCount == 500)
        #expect(upload.start(at: clock.now) == .sendReady(next, acknowledging: nil, readAheadLimit: 500))
        #expect(upload.readyBatchCount == nil, "taken by the step that sends it")
    }

    @Test("a read-ahead batch the acknowledgement did not make the batch in flight is never sent")
    func readAheadNotInFlight() {
        let upload = machine()
        _ = upload.answer(.delivered, batchID: "b1", count: 10, readAhead: Self.batch("b2", count: 10), at: clock.now)
        upload.acknowledged(madeInFlight: false)
        #expect(upload.readyBatchCount == nil)
        #expect(upload.start(at: clock.now) == .read(limit: 500))
    }

    @Test("a batch read ahead too long ago, or larger than the step's limit, is built again")
    func staleOrLargeReadAhead() {
        let upload = machine()
        _ = upload.answer(.delivered, batchID: "b1", count: 500, readAhead: Self.batch("b2", count: 500), at: clock.now)
        upload.acknowledged(madeInFlight: true)
        #expect(upload.start(maxEvents: 100, at: clock.now) == .read(limit: 100), "a deadline near: the batch is cut down")
        #expect(upload.readyBatchCount == nil)

        _ = upload.answer(.delivered, batchID: "b2", count: 100, readAhead: Self.batch("b3", count: 500), at: clock.now)
        upload.acknowledged(madeInFlight: true)
        clock.advance(by: .milliseconds(1001))
        #expect(upload.start(at: clock.now) == .read(limit: 500), "its _flush_time would lie: built anew")
    }

    // MARK: Deferred acknowledgements

    @Test("deferred: a delivered batch is recorded beside its successor's request, which goes at once")
    func deferredAcknowledgement() {
        let upload = machine(defers: true)
        let next = Self.batch("b2", count: 300)
        #expect(upload.answer(.delivered, batchID: "b1", count: 500, readAhead: next, at: clock.now) == .acknowledgeLater(events: 500))
        let unsettled = Machine.Unsettled(batchID: "b1", next: next.batch)
        #expect(upload.unsettled == unsettled)
        #expect(upload.start(at: clock.now) == .sendReady(next, acknowledging: unsettled, readAheadLimit: 500))
        #expect(upload.unsettled == nil)
        #expect(upload.settledBeside(madeInFlight: true), "recorded: the answer is the batch in flight's")
    }

    @Test("deferred, with no successor read ahead: recorded at once")
    func deferredWithoutSuccessor() {
        let upload = machine(defers: true)
        #expect(upload.answer(.delivered, batchID: "b1", count: 7, at: clock.now) == .acknowledge(batchID: "b1", then: nil))
        #expect(upload.unsettled == nil)
    }

    @Test("deferred, the successor stale when its turn comes: the acknowledgement is recorded first, then the outbox read")
    func deferredThenStale() {
        let upload = machine(defers: true)
        let next = Self.batch("b2", count: 300)
        _ = upload.answer(.delivered, batchID: "b1", count: 500, readAhead: next, at: clock.now)
        clock.advance(by: .seconds(5))
        let unsettled = Machine.Unsettled(batchID: "b1", next: next.batch)
        #expect(upload.start(at: clock.now) == .settle(unsettled))
        upload.settled(madeInFlight: true)
        #expect(upload.start(at: clock.now) == .read(limit: 500))
    }

    @Test("deferred, the outbox changed meanwhile: the answer to the batch sent is not applied, and nothing read ahead goes")
    func deferredOutboxChanged() {
        let upload = machine(defers: true)
        let next = Self.batch("b2", count: 300)
        _ = upload.answer(.delivered, batchID: "b1", count: 500, readAhead: next, at: clock.now)
        _ = upload.start(at: clock.now)
        upload.machine.sent(readAhead: Self.batch("b3", count: 500), builtAt: clock.now)
        #expect(!upload.settledBeside(madeInFlight: false))
        #expect(upload.start(at: clock.now) == .read(limit: 500))
    }

    // MARK: Retries

    @Test("a retry keeps the batch; its wait is the jittered backoff, at least the collector's Retry-After; a delivery starts over")
    func retries() {
        let upload = machine()
        func delay(_ after: Machine.AfterAnswer) -> Duration? {
            if case .retry(let delay, _) = after { delay } else { nil }
        }
        // Full jitter: a uniformly random wait up to base·2ⁿ (1 s, then 2 s, then 4 s).
        let first = delay(upload.answer(.retry(reason: "HTTP 503", retryAfter: nil), batchID: "b1", count: 9, at: clock.now))
        #expect(first.map { $0 >= .zero && $0 <= .seconds(1) } == true)
        let second = delay(upload.answer(.retry(reason: "HTTP 503", retryAfter: nil), batchID: "b1", count: 9, at: clock.now))
        #expect(second.map { $0 >= .zero && $0 <= .seconds(2) } == true)
        #expect(upload.attempt == 2)
        #expect(upload.waitAskedByCollector == nil)
        #expect(upload.answer(.retry(reason: "HTTP 429", retryAfter: .seconds(30)), batchID: "b1", count: 9, at: clock.now)
            == .retry(delay: .seconds(30), reason: "HTTP 429"), "the collector's wait, longer than the jittered 4 s at most")
        #expect(upload.waitAskedByCollector == .seconds(30))
        #expect(upload.lastError == "HTTP 429")
        #expect(upload.answer(.retry(reason: "HTTP 429", retryAfter: .seconds(900)), batchID: "b1", count: 9, at: clock.now)
            == .retry(delay: .seconds(300), reason: "HTTP 429"), "clamped to the longest Retry-After honoured")
        let zero = delay(upload.answer(.retry(reason: "HTTP 429", retryAfter: .seconds(0)), batchID: "b1", count: 9, at: clock.now))
        #expect(zero.map { $0 <= .seconds(16) } == true)
        #expect(upload.waitAskedByCollector == nil, "a Retry-After of 0 asks for no wait")
        _ = upload.answer(.delivered, batchID: "b1", count: 9, at: clock.now)
        #expect(upload.attempt == 0)
    }

    // MARK: 413

    @Test("413 halves the batch size and takes the rows back; one event too large alone is refused alone")
    func tooLarge() {
        let upload = machine(batchSize: 500)
        #expect(upload.answer(.tooLarge(reason: "HTTP 413"), batchID: "b1", count: 500, at: clock.now) == .shrink(batchID: "b1"))
        #expect(upload.batchSize.limit == 250)
        #expect(upload.start(at: clock.now) == .read(limit: 250))

        #expect(Machine.needsRows(for: .tooLarge(reason: ""), count: 1))
        #expect(!Machine.needsRows(for: .tooLarge(reason: ""), count: 2))
        let row = Self.rows(7...7, batchID: "b9")[0]
        let refused = Machine.RefusedAlone(row: row, status: 413, reason: "too large even alone: HTTP 413", cause: .tooLarge)
        #expect(upload.answer(.tooLarge(reason: "HTTP 413"), batchID: "b9", count: 1, refusedRows: [row], at: clock.now) == .refuse(refused))
        #expect(upload.haltCheck(refused, inARow: 0, heldSeq: nil) == .deadLetter)
        upload.deadLettered(refused)
        #expect(upload.batchSize.ceiling == nil, "the 413s were the event's own: the size may grow again")
    }

    // MARK: Bisection

    @Test("400 bisects: only the first half of a known-bad range goes, kept across retries, until the refused event is alone")
    func bisection() {
        let upload = machine()
        let batch = Self.rows(1...8, batchID: "b1")
        #expect(Machine.needsRows(for: .rejected(status: 400, reason: ""), count: 8))
        #expect(upload.answer(.rejected(status: 400, reason: "HTTP 400: bad"), batchID: "b1", count: 8, refusedRows: batch, at: clock.now) == .bisect)
        #expect(upload.start(at: clock.now) == .rebatch(Array(batch[0..<4])))
        let half = Self.rows(1...4, batchID: "h1")
        upload.halfBatched(half)
        #expect(upload.start(at: clock.now) == .sendHalf(half))
        _ = upload.answer(.retry(reason: "reset", retryAfter: nil), batchID: "h1", count: 4, at: clock.now)
        #expect(upload.start(at: clock.now) == .sendHalf(half), "the same half, with its batch id, after a retry")

        // The first half delivered: the refused event is in the second half, which loses its batch id.
        #expect(upload.answer(.delivered, batchID: "h1", count: 4, at: clock.now) == .acknowledge(batchID: "h1", then: nil))
        upload.acknowledged(madeInFlight: true)
        #expect(upload.start(at: clock.now) == .rebatch(Self.rows(5...6)))
        upload.halfBatched(Self.rows(5...6, batchID: "h2"))
        _ = upload.start(at: clock.now)
        _ = upload.answer(.delivered, batchID: "h2", count: 2, at: clock.now)
        upload.acknowledged(madeInFlight: true)
        #expect(upload.start(at: clock.now) == .rebatch(Self.rows(7...7)), "inferred, not refused alone: sent alone first")
        upload.halfBatched(Self.rows(7...7, batchID: "h3"))
        _ = upload.start(at: clock.now)
        let alone = Self.rows(7...7, batchID: "h3")
        #expect(upload.answer(.rejected(status: 400, reason: "HTTP 400: bad"), batchID: "h3", count: 1, refusedRows: alone, at: clock.now) == .bisect)
        let refused = Machine.RefusedAlone(row: alone[0], status: 400, reason: "HTTP 400: bad", cause: .rejected)
        #expect(upload.start(at: clock.now) == .refuse(refused))
        upload.deadLettered(refused)
        #expect(upload.suspect == nil)
        #expect(upload.start(at: clock.now) == .read(limit: 500))
    }

    @Test("a refusal that does not recur when the suspect goes alone dead-letters nothing")
    func refusalThatDoesNotRecur() {
        let upload = machine()
        _ = upload.answer(.rejected(status: 400, reason: "mangled"), batchID: "b1", count: 2, refusedRows: Self.rows(1...2, batchID: "b1"), at: clock.now)
        _ = upload.start(at: clock.now)
        upload.halfBatched(Self.rows(1...1, batchID: "h1"))
        _ = upload.start(at: clock.now)
        _ = upload.answer(.delivered, batchID: "h1", count: 1, at: clock.now)
        upload.acknowledged(madeInFlight: true)
        #expect(upload.start(at: clock.now) == .rebatch(Self.rows(2...2)), "inferred: sent alone before it is dead-lettered")
        upload.halfBatched(Self.rows(2...2, batchID: "h2"))
        #expect(upload.start(at: clock.now) == .sendHalf(Self.rows(2...2, batchID: "h2")))
        _ = upload.answer(.delivered, batchID: "h2", count: 1, at: clock.now)
        upload.acknowledged(madeInFlight: true)
        #expect(upload.suspect == nil)
    }

    @Test("a 413 on a half ends the bisection: its rows go back to the pool")
    func tooLargeHalfEndsBisection() {
        let upload = machine()
        _ = upload.answer(.rejected(status: 422, reason: "bad"), batchID: "b1", count: 8, refusedRows: Self.rows(1...8, batchID: "b1"), at: clock.now)
        upload.halfBatched(Self.rows(1...4, batchID: "h1"))
        #expect(upload.answer(.tooLarge(reason: "HTTP 413"), batchID: "h1", count: 4, at: clock.now) == .shrink(batchID: "h1"))
        #expect(upload.suspect == nil)
        #expect(upload.start(at: clock.now) == .read(limit: 2))
    }

    // MARK: Halts

    @Test("401 halts at the cap, keeping everything; any other answer ends the halt")
    func halt() {
        let upload = machine()
        #expect(upload.answer(.halt(status: 401, reason: "HTTP 401"), batchID: "b1", count: 5, at: clock.now)
            == .halt(status: 401, reason: "HTTP 401", wait: .seconds(60)))
        #expect(upload.haltReason == "HTTP 401")
        #expect(upload.haltedAfterDeadLetters == nil, "the collector's answer, not the dead letters")
        #expect(upload.start(at: clock.now) == .read(limit: 500), "the same batch in flight, read again")
        _ = upload.answer(.retry(reason: "HTTP 503", retryAfter: nil), batchID: "b1", count: 5, at: clock.now)
        #expect(upload.haltReason == nil)
    }

    @Test("the tenth event refused in a row halts instead of becoming a dead letter, once; sent alone again, it is one")
    func haltAfterDeadLetters() {
        let upload = machine(haltAfter: 10)
        let row = Self.rows(42...42, batchID: "b1")[0]
        let refused = Machine.RefusedAlone(row: row, status: 400, reason: "HTTP 400", cause: .rejected)
        #expect(upload.mayHalt)
        #expect(upload.haltCheck(refused, inARow: 9, heldSeq: nil) == .deadLetter)
        #expect(upload.haltReason == nil)
        #expect(upload.haltCheck(refused, inARow: 10, heldSeq: nil) == .hold(seq: 42, wait: .seconds(60)))
        #expect(upload.haltReason?.contains("refused the last 10 events one by one") == true)
        #expect(upload.haltReason?.contains("every 60 s") == true)
        #expect(upload.haltedAfterDeadLetters == 10, "the status says the dead letters caused this halt")
        #expect(upload.haltCheck(refused, inARow: 10, heldSeq: 42) == .deadLetter, "the event the halt held back")
        #expect(!machine(haltAfter: 0).mayHalt, "0: never halt")
    }

    // MARK: Destinations

    @Test("another destination forgets what the old one taught: halt, retries, wait, 413 size, read-ahead")
    func destinationChange() {
        let upload = machine()
        _ = upload.answer(.tooLarge(reason: "HTTP 413"), batchID: "b1", count: 500, at: clock.now)
        _ = upload.answer(.retry(reason: "HTTP 429", retryAfter: .seconds(9)), batchID: "b1", count: 250, at: clock.now)
        _ = upload.answer(.halt(status: 404, reason: "HTTP 404"), batchID: "b1", count: 250, at: clock.now)
        upload.destinationChanged()
        #expect(upload.haltReason == nil)
        #expect(upload.lastError == nil)
        #expect(upload.attempt == 0)
        #expect(upload.waitAskedByCollector == nil)
        #expect(upload.batchSize.limit == 500)
        #expect(upload.start(at: clock.now) == .read(limit: 500))
    }
}

extension UploadMachine.Start: Equatable where Ahead: Equatable {
    public static func == (lhs: Self, rhs: Self) -> Bool {
        switch (lhs, rhs) {
        case let (.sendReady(a, u, l), .sendReady(b, v, m)): a == b && u == v && l == m
        case let (.settle(a), .settle(b)): a == b
        case let (.refuse(a), .refuse(b)): a == b
        case let (.rebatch(a), .rebatch(b)): a == b
        case let (.sendHalf(a), .sendHalf(b)): a == b
        case let (.read(a), .read(b)): a == b
        default: false
        }
    }
}
