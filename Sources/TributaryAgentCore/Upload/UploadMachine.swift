import Foundation

/// The upload's decisions, with no I/O and no clock of its own: which batch the next request carries,
/// what an answer means for the batches after it, and what the collector's answers have taught.
///
/// The driver (``UploadSession``) does the I/O: it asks ``start(maxEvents:now:)`` what the next
/// request is, reads or rebatches rows as told, sends the request, and hands the answer to
/// ``answered(_:batchID:count:refusedRows:using:)``, doing what that returns (an acknowledgement, a
/// retry count, a dead letter after ``haltCheck(_:inARow:heldSeq:)``). Each input is a
/// `mutating func` that returns what to do, like ``LoopMachine``, so that every rule is said in a
/// step-by-step test with a manual clock (`UploadMachineTests`).
///
/// The rules:
/// - **Order** (promise 3): a batch goes only once every earlier batch is acknowledged. A batch read
///   ahead while its predecessor was out is sent only once that one is acknowledged, and only while
///   it is fresh (its `_flush_time` says when it was built) and within the step's size limit.
/// - **Deferred acknowledgements**: with ``Policy/defersAcknowledgements``, a delivered batch whose
///   successor was read ahead is recorded while the successor's request is out (``Start/sendReady``),
///   or before anything else the next step does (``Start/settle``).
/// - **Retries** keep the batch and its id; the wait is the backoff's, at least the collector's
///   `Retry-After`.
/// - **413** halves the batch size (``BatchSizePolicy``); a single event too large alone is refused
///   alone (a dead letter, unless a halt holds it back).
/// - **400/422 bisection**: the refused batch becomes the suspect, and only the first half of a
///   known-bad range is sent at a time, so one poison event in n is isolated in about log₂ n
///   requests. A single suspect inferred from an accepted first half is sent alone once before it is
///   dead-lettered.
/// - **Halts**: 401/403/404 and other 4xx keep every event and wait the backoff cap; so does the
///   ``Policy/haltAfterDeadLetters``-th event refused in a row, which is held back and sent alone
///   again after the wait.
struct UploadMachine<C: Clock, Ahead: UploadAhead> where C.Duration == Duration {
    typealias Instant = C.Instant

    /// The part of the upload's configuration the decisions read.
    struct Policy {
        var backoff = Backoff()
        /// Refused events in a row after which uploads halt rather than dead-letter the next (0: never).
        var haltAfterDeadLetters = 10
        /// How old a batch read ahead may be when its turn comes.
        var readAheadMaxAge: Duration = .seconds(1)
        /// Whether a delivered batch with a successor read ahead is recorded during the successor's
        /// request rather than before it goes.
        var defersAcknowledgements = false
    }

    /// A delivered batch whose rows still wait in the outbox, and its successor, read ahead, which
    /// becomes the batch in flight in the same transaction.
    struct Unsettled: Equatable, Sendable {
        var batchID: String
        var next: Outbox.PreparedBatch
    }

    /// A batch refused by the collector as a whole (400/422), being bisected.
    struct Suspect {
        /// Rows known to contain at least one refused event.
        var rows: [Outbox.Row]
        /// The half being sent (kept, with its batch id, across retries).
        var half: [Outbox.Row]?
        /// The refusal's status and reason, for the dead letter.
        var status: Int
        var reason: String
        /// Whether the collector refused these rows on their own (not inferred from an accepted half).
        var refusedAlone: Bool
    }

    /// An event the collector refused on its own: a dead letter, unless a halt holds it back.
    struct RefusedAlone: Equatable {
        enum Cause: Equatable {
            /// Bisection isolated it (400/422).
            case rejected
            /// A batch of this one event was too large (413).
            case tooLarge
        }
        var row: Outbox.Row
        var status: Int
        var reason: String
        var cause: Cause
    }

    /// What the next step does.
    enum Start {
        /// Send the batch read ahead as it is. Beside its request, record `acknowledging` (the deferred
        /// acknowledgement of the batch before it: ``settledBeside(madeInFlight:)``), then read the
        /// batch after it ahead, at most `readAheadLimit` events.
        case sendReady(Ahead, acknowledging: Unsettled?, readAheadLimit: Int)
        /// Record the deferred acknowledgement first (``settled(madeInFlight:)``), then ask again.
        case settle(Unsettled)
        /// The event refused alone: a dead letter, or a halt (``haltCheck(_:inARow:heldSeq:)``).
        case refuse(RefusedAlone)
        /// Put these rows, the first half of the suspect, in a batch of their own
        /// (``halfBatched(_:)``), then ask again.
        case rebatch([Outbox.Row])
        /// Send this half of a batch being bisected, with no read-ahead beside it.
        case sendHalf([Outbox.Row])
        /// Read the next batch from the outbox (at most `limit` events) and send it, reading the batch
        /// after it ahead beside its request.
        case read(limit: Int)
    }

    /// What an answer leads to.
    enum AfterAnswer: Equatable {
        /// Record the batch as delivered, making `then` the batch in flight (``acknowledged(madeInFlight:)``).
        case acknowledge(batchID: String, then: Outbox.PreparedBatch?)
        /// Delivered; recorded by a later step (``Unsettled``): `events` are delivered but still in the outbox.
        case acknowledgeLater(events: Int)
        /// Count a retry of the same batch and wait `delay`.
        case retry(delay: Duration, reason: String)
        /// The event alone is refused: ``haltCheck(_:inARow:heldSeq:)``, then a dead letter or a halt.
        case refuse(RefusedAlone)
        /// Take the batch's rows back into the pool (``Outbox/unbatch(_:)``): batches of the halved size
        /// follow.
        case shrink(batchID: String)
        /// The batch is the suspect now; its first half goes next.
        case bisect
        /// The collector refuses us: keep everything, wait `wait` and try again.
        case halt(status: Int, reason: String, wait: Duration)
    }

    /// What to do with an event refused alone.
    enum Refusal: Equatable {
        /// Hold it back (``Outbox/holdAfterHalt(seq:)``) and wait: the collector seems to refuse every event.
        case hold(seq: UInt64, wait: Duration)
        /// Move it to the dead letters (then ``deadLettered(_:)``).
        case deadLetter
    }

    var policy: Policy
    /// Retries so far for the batch in flight.
    private(set) var attempt = 0
    /// The batch size after the collector's 413s.
    private(set) var batchSize: BatchSizePolicy
    /// The last thing that went wrong, for status.
    private(set) var lastError: String?
    /// Set while the collector refuses us (401/403/404…, or event after event).
    private(set) var haltReason: String? { didSet { haltedAfterDeadLetters = nil } }
    /// Set with ``haltReason`` when the halt is the one after ``Policy/haltAfterDeadLetters`` events in
    /// a row were dead-lettered: how many were (for status: a halt the dead letters explain, not the
    /// collector's answer).
    private(set) var haltedAfterDeadLetters: Int?
    /// The wait the collector asked for with the last retry's `Retry-After` (clamped as the backoff
    /// clamps it), or nil when it asked for none (or for 0).
    private(set) var waitAskedByCollector: Duration?
    private(set) var suspect: Suspect?
    /// The batch after the one in flight, read ahead while that one was out.
    private var readAhead: (ahead: Ahead, builtAt: Instant)?
    /// A read-ahead batch that became (or becomes, with ``unsettled``) the batch in flight.
    private var ready: (ahead: Ahead, builtAt: Instant)?
    private(set) var unsettled: Unsettled?
    /// The batch read ahead beside a delivered batch, until the acknowledgement says whether it became
    /// the batch in flight (``acknowledged(madeInFlight:)``).
    private var pendingReady: (ahead: Ahead, builtAt: Instant)?

    init(batchSize: Int, policy: Policy) {
        self.policy = policy
        self.batchSize = BatchSizePolicy(configured: batchSize)
    }

    /// The events of the batch the next step sends as it is (read ahead, already in flight), or nil
    /// when the next step reads the outbox.
    var readyBatchCount: Int? { suspect == nil ? ready?.ahead.batch.count : nil }

    // MARK: A step

    /// What the next request carries, at most `maxEvents` events (nil: the batch size).
    mutating func start(maxEvents: Int?, now: Instant) -> Start {
        let limit = min(batchSize.limit, maxEvents ?? .max)
        // A ready batch over this step's limit (a deadline near) is dropped, and the outbox's batch in
        // flight is cut down to the limit; one built too long ago is dropped too, and built again with
        // the clock of now.
        if suspect == nil, let ready = self.ready.take(), ready.ahead.batch.count <= limit,
            ready.builtAt.duration(to: now) <= policy.readAheadMaxAge
        {
            return .sendReady(ready.ahead, acknowledging: unsettled.take(), readAheadLimit: limit)
        }
        if let unsettled = unsettled.take() { return .settle(unsettled) }
        guard let suspect else { return .read(limit: limit) }
        if suspect.rows.count == 1 && suspect.refusedAlone {
            return .refuse(RefusedAlone(row: suspect.rows[0], status: suspect.status, reason: suspect.reason, cause: .rejected))
        }
        if let half = suspect.half { return .sendHalf(half) }
        return .rebatch(Array(suspect.rows.prefix(max(1, suspect.rows.count / 2))))
    }

    /// The deferred acknowledgement ``Start/settle`` asked for was recorded: `madeInFlight` says
    /// whether its successor became the batch in flight (no: the outbox changed meanwhile, and the
    /// batch read ahead is not what the outbox holds).
    mutating func settled(madeInFlight: Bool) {
        if !madeInFlight { ready = nil }
    }

    /// The deferred acknowledgement could not be recorded: it is still to do (the driver throws).
    mutating func settleFailed(_ unsettled: Unsettled) { self.unsettled = unsettled }

    /// The first half of the suspect is in a batch of its own: the next start sends it.
    mutating func halfBatched(_ rows: [Outbox.Row]) { suspect?.half = rows }

    /// The request of a ``Start/sendReady`` step is answered, and beside it the batch before was
    /// recorded: `madeInFlight` false means the outbox changed meanwhile, so the answer concerns no batch
    /// in flight: nothing is applied (its rows go again in a batch built anew; the collector's dedup
    /// drops what it stored). Returns whether to apply the answer.
    mutating func settledBeside(madeInFlight: Bool) -> Bool {
        guard !madeInFlight else { return true }
        ready = nil
        readAhead = nil
        return false
    }

    /// Beside a request, the batch after it was read ahead (`nil`: none could be, or none was tried),
    /// at `builtAt`. Called before the answer is applied.
    mutating func sent(readAhead ahead: Ahead?, builtAt: Instant) {
        readAhead = ahead.map { ($0, builtAt) }
    }

    /// The deferred acknowledgement, taken to be recorded now (a turn that sends nothing, the run's
    /// end): then ``settled(madeInFlight:)`` or ``settleFailed(_:)``. Nil when there is none.
    mutating func settleNow() -> Unsettled? { unsettled.take() }

    // MARK: An answer

    /// Whether ``answered(_:batchID:count:refusedRows:using:)`` needs the rows of the batch the answer
    /// refers to (a refusal it may bisect or dead-letter).
    static func needsRows(for outcome: UploadOutcome, count: Int) -> Bool {
        switch outcome {
        case .rejected: true
        case .tooLarge: count == 1
        case .delivered, .retry, .halt: false
        }
    }

    /// The collector answered the request for `batchID` (`count` events) with `outcome`. `refusedRows`
    /// are the batch's rows when ``needsRows(for:count:)`` said so.
    mutating func answered(
        _ outcome: UploadOutcome, batchID: String, count: Int, refusedRows: [Outbox.Row] = [],
        using generator: inout some RandomNumberGenerator
    ) -> AfterAnswer {
        let next = readAhead.take()
        if case .retry = outcome {} else { suspect?.half = nil }
        if case .halt = outcome {} else { haltReason = nil }  // any other answer: not halted any more
        switch outcome {
        case .delivered:
            attempt = 0
            batchSize.delivered()
            if let suspect {
                // The first half was fine, so the refused event is in the second half (if the refusal
                // recurs: a half left alone is sent alone before it is dead-lettered).
                let rest = suspect.rows.dropFirst(count).map { row in
                    var row = row
                    row.batchID = nil
                    return row
                }
                self.suspect =
                    rest.isEmpty
                    ? nil : Suspect(rows: rest, status: suspect.status, reason: suspect.reason, refusedAlone: false)
            } else if policy.defersAcknowledgements, let next {
                (unsettled, ready) = (Unsettled(batchID: batchID, next: next.ahead.batch), next)
                return .acknowledgeLater(events: count)
            }
            pendingReady = next
            return .acknowledge(batchID: batchID, then: next?.ahead.batch)

        case .retry(let reason, let retryAfter):
            let delay = policy.backoff.delay(attempt: attempt, retryAfter: retryAfter, using: &generator)
            waitAskedByCollector = retryAfter.map(policy.backoff.clamped).flatMap { $0 > .zero ? $0 : nil }
            attempt += 1
            lastError = reason
            return .retry(delay: delay, reason: reason)

        case .tooLarge(let reason):
            lastError = reason
            if count == 1, let row = refusedRows.first {
                return .refuse(RefusedAlone(row: row, status: 413, reason: "too large even alone: \(reason)", cause: .tooLarge))
            }
            batchSize.tooLarge(count: count)
            // A half refused as too large ends the bisection: its rows go back to the pool, and batches
            // of the halved size find the refused event again (sending the same half again would get
            // the same 413).
            suspect = nil
            return .shrink(batchID: batchID)

        case .rejected(let status, let reason):
            lastError = reason
            suspect = Suspect(rows: refusedRows, status: status, reason: reason, refusedAlone: refusedRows.count == 1)
            attempt = 0
            return .bisect

        case .halt(let status, let reason):
            lastError = reason
            haltReason = reason
            return .halt(status: status, reason: reason, wait: policy.backoff.cap)
        }
    }

    /// The acknowledgement ``AfterAnswer/acknowledge(batchID:then:)`` asked for is recorded; `madeInFlight`
    /// says whether the batch read ahead became the batch in flight (sent as it is by the next step).
    mutating func acknowledged(madeInFlight: Bool) {
        if madeInFlight { ready = pendingReady }
        pendingReady = nil
    }

    // MARK: An event refused alone

    /// Whether an event refused alone may halt the uploads, so that the driver reads the outbox's run
    /// of dead letters for ``haltCheck(_:inARow:heldSeq:)``.
    var mayHalt: Bool { policy.haltAfterDeadLetters > 0 }

    /// Decides about `refused`, given the events dead-lettered in a row to this destination (this run's
    /// and the runs' before: the outbox's count) and the seq of the event a halt last held back. A halt
    /// comes after ``Policy/haltAfterDeadLetters`` in a row, unless `refused` is the event it held back
    /// (then sent alone again, and refused again: a dead letter).
    mutating func haltCheck(_ refused: RefusedAlone, inARow: Int, heldSeq: UInt64?) -> Refusal {
        guard mayHalt, inARow >= policy.haltAfterDeadLetters, heldSeq != refused.row.seq else { return .deadLetter }
        let cap = policy.backoff.cap
        let interval = String(format: "%g", cap.seconds)
        haltReason =
            "the collector refused the last \(inARow) events one by one (the last: \(refused.reason)); it seems to "
            + "refuse every event: check the collector URL, --format and the collector's limits. The next refused "
            + "event stays in the outbox and is sent again every \(interval) s; the refused ones are dead letters "
            + "(tributary dead-letters; --replay once fixed)"
        haltedAfterDeadLetters = inARow
        lastError = refused.reason
        if refused.cause == .rejected { suspect?.refusedAlone = false }  // sent alone again after the wait
        return .hold(seq: refused.row.seq, wait: cap)
    }

    /// `refused` is a dead letter now.
    mutating func deadLettered(_ refused: RefusedAlone) {
        suspect = nil
        // The 413s that halved the size down to one were this event's: the size may grow again.
        if refused.cause == .tooLarge { batchSize.forgetCeiling() }
    }

    // MARK: The destination

    /// Batches go to another collector URL or format: what the old destination's answers taught is
    /// forgotten (the batch read ahead in the old format, the halt, the retries, its wait, its 413s'
    /// batch size, that an event it refused alone is to be dead-lettered: the new one is asked first),
    /// and the last error. The batch in flight goes to the new one with the same `Idempotency-Key`.
    mutating func destinationChanged() {
        ready = nil
        readAhead = nil
        haltReason = nil
        lastError = nil
        attempt = 0
        waitAskedByCollector = nil
        batchSize.reset()
        suspect?.refusedAlone = false
    }
}

/// A batch read and encoded ahead of its turn, as ``UploadMachine`` sees it.
protocol UploadAhead {
    var batch: Outbox.PreparedBatch { get }
}
