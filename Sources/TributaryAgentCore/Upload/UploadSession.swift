import AsyncHTTPClient
import Foundation
import Logging
import NIOCore
import NIOHTTP1
import Synchronization
import TributaryStore
import TributaryWire


/// Sends batches from the outbox, oldest first, one request at a time, and applies each outcome.
///
/// Never sends a batch before every earlier batch is acknowledged. A batch keeps its id across
/// retries (the `Idempotency-Key`). 413 halves the batch size (a single event still too large is
/// dead-lettered); 400/422 bisects the batch, sending only the first half of a known-bad range each
/// time, so one poison event in n is isolated in about log₂ n requests and only it is dead-lettered.
/// While a request is out (and no batch is being bisected), the next batch is read and encoded
/// ahead (``readAhead(after:limit:outbox:configuration:logger:)``); it is sent only once the batch before it is acknowledged.
///
/// Owned by the agent's loop and used by its task alone: not `Sendable`. What runs beside a request
/// (the deferred acknowledgement, the read-ahead) and the request itself run in child tasks that see
/// only `Sendable` values, and hand back what they came to (``Aside``, ``UploadOutcome``).
final class UploadSession {
    let outbox: Outbox
    let client: HTTPClient
    private(set) var configuration: UploadConfiguration
    let logger: Logger

    /// Retries so far for the batch in flight.
    var attempt = 0
    /// HTTP requests sent by this session (a step that dead-letters or finds nothing sends none).
    var requestsSent = 0
    /// Rows known to contain at least one rejected event (the collector refused them as a whole).
    var suspect: [Outbox.Row]?
    /// The half of the suspect currently being sent (kept, with its batch id, across retries).
    var suspectHalf: [Outbox.Row]?
    /// The suspect's status and reason, for the dead letter.
    var suspectReason: (status: Int, reason: String) = (0, "")
    /// Whether the collector refused the suspect on its own. A single suspect inferred from an accepted
    /// first half is sent alone once before it is dead-lettered: a refusal of the whole batch that
    /// does not recur (a proxy that mangled one body) then dead-letters nothing.
    var suspectRefusedAlone = false
    /// The batch size after the collector's 413s (``BatchSizePolicy``).
    var batchSize: BatchSizePolicy
    /// The last thing that went wrong, for status.
    var lastError: String?
    /// Set while the collector refuses us (401/403/404…, or the dead-letter halt).
    var haltReason: String? { didSet { haltedAfterDeadLetters = nil } }
    /// Set with ``haltReason`` when the halt is the one after ``UploadConfiguration/haltAfterDeadLetters``
    /// events in a row were dead-lettered: how many were (for status: a halt of its own kind, which the
    /// dead letters, not the collector's answer, explain).
    var haltedAfterDeadLetters: Int?
    /// The wait the collector asked for with the last retry's `Retry-After` (clamped as the backoff
    /// clamps it), or nil when it asked for none (or for 0).
    var waitAskedByCollector: Duration?
    /// The batch after the one in flight, read and encoded while that one was out (see ``readAhead``).
    var readAheadBatch: ReadAhead?
    /// A read-ahead batch that became the batch in flight when its predecessor was acknowledged, or
    /// that becomes it in the next step (``unsettled``): the next step sends it as it is.
    var ready: ReadAhead?
    /// Whether a delivered batch is recorded so while the request of the batch after it is out,
    /// rather than before that request goes (see ``unsettled``). The agent's loop sets it, and calls
    /// ``settle()`` in a turn that sends nothing and when it ends; off, each step leaves the outbox as
    /// its answer says.
    var defersAcknowledgements = false
    /// A batch the collector acknowledged whose rows still wait in the outbox, and the batch read ahead
    /// after it (``ready``). The next step sends `next` first and then, while its request is out, ends
    /// the acknowledged rows' wait and makes `next` the batch in flight, in one transaction
    /// (``Outbox/acknowledge(_:then:patience:)``): that write, which may wait for a drain chunk's
    /// commit (5–8 ms on 2 CPUs), is then off the path from one request to the next, and the collector
    /// does not idle through it.
    /// Promise 3 holds: `next` goes only once every earlier batch is acknowledged. A crash before the
    /// transaction commits sends both batches again, and the collector's dedup drops them.
    var unsettled: (batchID: String, next: Outbox.PreparedBatch)?
    /// ``unsettledCount``, readable from any thread (the loop's drain reads it while a request is out):
    /// set when an acknowledgement is deferred, 0 once it has committed (``acknowledgeUnsettled(_:patience:)``).
    let unsettledEvents: UnsettledEvents

    /// The events of a delivered batch whose rows are still in the outbox (``unsettled``), or 0.
    var unsettledCount: Int { unsettledEvents.value }

    /// The events of the batch the next step sends as it is (read ahead, already in flight), or nil
    /// when the next step reads the outbox.
    var readyBatchCount: Int? { suspect == nil ? ready?.batch.count : nil }

    /// A batch built ahead of its turn.
    struct ReadAhead: Sendable {
        var batch: Outbox.PreparedBatch
        var encoded: EncodedBatch
        /// The clocks it was built at (its `_flush_time` and `Date` are the wall clock's).
        var clock: WireClock

        func isFresh(maxAge: Duration) -> Bool {
            let age = BootClock.nowNanos() &- clock.bootNanos
            return Duration.nanoseconds(Int64(clamping: age)) <= maxAge
        }
    }

    init(
        outbox: Outbox, client: HTTPClient, configuration: UploadConfiguration, logger: Logger,
        unsettledEvents: UnsettledEvents = UnsettledEvents()
    ) {
        self.outbox = outbox
        self.client = client
        self.configuration = configuration
        self.logger = logger
        self.batchSize = BatchSizePolicy(configured: configuration.batchSize)
        self.unsettledEvents = unsettledEvents
    }

    /// What ran beside a request: the deferred acknowledgement's outcome (whether the batch sent became
    /// the batch in flight), and the batch read ahead.
    struct Aside: Sendable {
        var settled: Result<Bool, any Error>?
        var readAhead: ReadAhead?
    }

    /// What one step did.
    enum Step: Equatable {
        /// Nothing to send.
        case empty
        /// Events were acknowledged or dead-lettered; go on.
        case progressed(delivered: Int, deadLettered: Int = 0)
        /// Wait this long before the next step (backoff, or the halted interval).
        case wait(Duration)
    }

    /// Replaces the bearer token (re-read from its file after a 401/403).
    func updateToken(_ token: String?) { configuration.bearerToken = token }

    /// Where batches go and in what format. A change forgets what the old destination's answers
    /// taught: the batch read ahead (built in the old format), the halt, the retry count, a wait it
    /// asked for, the batch size its 413s imposed, and that an event it refused alone is to be
    /// dead-lettered (the new destination is asked first), and its last error. The batch in flight goes to the new one with
    /// the same `Idempotency-Key`.
    var destination: (serverURL: String?, format: WireFormat) {
        get { (configuration.serverURL, configuration.format) }
        set {
            guard newValue.serverURL != configuration.serverURL || newValue.format != configuration.format else { return }
            (configuration.serverURL, configuration.format) = newValue
            ready = nil
            readAheadBatch = nil
            haltReason = nil
            lastError = nil
            attempt = 0
            waitAskedByCollector = nil
            batchSize.reset()
            suspectRefusedAlone = false
        }
    }

    /// Sends at most one request (of at most `maxEvents` events, ending within `timeout`) and applies
    /// its outcome. A request still running at `timeout` is cancelled; its batch stays in the outbox.
    /// `cancelWhen`, when given, is awaited beside the request, and cancels it when it returns (the
    /// deadline): the batch stays in the outbox with its id, and the step applies a retry.
    func step(
        maxEvents: Int? = nil, timeout: Duration? = nil, cancelWhen: (@Sendable () async -> Void)? = nil
    ) async throws -> Step {
        let limit = min(batchSize.limit, maxEvents ?? .max)
        let timeout = timeout ?? configuration.requestTimeout
        // Read ahead during the previous request and made the batch in flight by its acknowledgement. A
        // ready batch over this step's limit (a deadline near) is dropped here, and `nextBatch` cuts the
        // batch in flight down to the limit; one built too long ago is dropped too, and `nextBatch`
        // builds the same batch again with the clock of now.
        if suspect == nil, let ready = self.ready.take(), ready.batch.count <= limit,
            ready.isFresh(maxAge: configuration.readAheadMaxAge)
        {
            let unsettled = self.unsettled.take()
            let (outbox, configuration, logger, unsettledEvents) = (outbox, configuration, logger, unsettledEvents)
            let (outcome, aside) = await post(
                ready.encoded, batchID: ready.batch.id, sentAt: ready.clock.wallMillis, timeout: timeout,
                cancelWhen: cancelWhen
            ) {
                var aside = Aside()
                if let unsettled {
                    CrashPoint.hit("upload.before-deferred-ack")
                    let settled = Result {
                        try Self.acknowledge(unsettled, outbox: outbox, unsettledEvents: unsettledEvents)
                    }
                    aside.settled = settled
                    switch settled {
                    case .success(true): break
                    case .success(false): return aside
                    case .failure(let error):
                        // The fail-stop rule at once: the loop's drain would commit again meanwhile (FatalIO).
                        if FatalIO.matches(error) { FatalIO.stop(error, logger: logger) }
                        return aside
                    }
                }
                aside.readAhead = Self.readAhead(
                    after: ready.batch.id, limit: limit, outbox: outbox, configuration: configuration, logger: logger)
                return aside
            }
            readAheadBatch = aside.readAhead
            if let unsettled {
                let madeInFlight: Bool
                do {
                    madeInFlight = try aside.settled?.get() ?? false
                } catch {
                    self.unsettled = unsettled  // still to do: a settle() tries again (the end of the run's)
                    throw error
                }
                if !madeInFlight {
                    // The outbox changed meanwhile (rows edited by hand, say), and the batch just sent is
                    // not the one in flight: its answer changes nothing here. Its rows go in a batch built
                    // anew, and the collector's dedup drops them if it stored them already.
                    readAheadBatch = nil
                    logger.notice("the batch sent was not the outbox's batch in flight; its events are sent again", metadata: [
                        "tributary.batch.id": "\(ready.batch.id)",
                    ])
                    return .progressed(delivered: 0)
                }
            }
            return try apply(outcome, batchID: ready.batch.id, count: ready.batch.count)
        }
        try settle()
        let (clock, empty) = newBody()
        var body = empty
        let batchID: String
        let count: Int
        if let suspect {
            if suspect.count == 1 && suspectRefusedAlone {
                if let halt = try haltBeforeDeadLetter(suspect[0], reason: suspectReason.reason) {
                    suspectRefusedAlone = false  // sent alone again after the halt's wait
                    return halt
                }
                try outbox.deadLetter(suspect[0], status: suspectReason.status, reason: suspectReason.reason) {
                    CrashPoint.hit("deadletter.before-commit")
                }
                logger.warning("event rejected by the collector; moved to dead letters", metadata: [
                    "tributary.event_id": "\(suspect[0].eventID)", "tributary.seq": "\(suspect[0].seq)",
                    "tributary.reason": "\(suspectReason.reason)",
                ])
                self.suspect = nil
                return .progressed(delivered: 0, deadLettered: 1)
            }
            let half: [Outbox.Row]
            if let suspectHalf {
                half = suspectHalf
            } else {
                half = try outbox.rebatch(Array(suspect.prefix(max(1, suspect.count / 2))))
                suspectHalf = half
            }
            guard let id = half.first?.batchID else { return .empty }
            for row in half { Self.append(row, at: clock, to: &body) }
            (batchID, count) = (id, half.count)
        } else {
            // The common case: the request body is built straight from the outbox's rows.
            guard let batch = try outbox.nextBatch(maxCount: limit, maxBytes: configuration.maxBatchBytes, each: { event in
                Self.append(event, at: clock, to: &body)
            }) else { return .empty }
            (batchID, count) = (batch.id, batch.count)
        }

        let encoded: EncodedBatch
        do {
            encoded = try body.finish(gzipLevel: configuration.gzipLevel)
        } catch {
            let failure = UploadOutcome.retry(reason: "could not encode the batch: \(error)", retryAfter: nil)
            return try apply(failure, batchID: batchID, count: count)
        }
        let bisecting = suspect != nil
        let (outbox, configuration, logger) = (outbox, configuration, logger)
        let (outcome, aside) = await post(
            encoded, batchID: batchID, sentAt: clock.wallMillis, timeout: timeout, cancelWhen: cancelWhen
        ) {
            bisecting
                ? Aside()
                : Aside(
                    readAhead: Self.readAhead(
                        after: batchID, limit: limit, outbox: outbox, configuration: configuration, logger: logger))
        }
        if !bisecting { readAheadBatch = aside.readAhead }
        return try apply(outcome, batchID: batchID, count: count)
    }

    /// Records a batch the collector acknowledged whose recording was deferred (``unsettled``),
    /// making the batch read ahead after it the batch in flight; nothing when there is none. The
    /// outbox then holds exactly what is still to be sent.
    /// `patience`: how long to wait for another process's write lock on the outbox (nil: the outbox's
    /// own 10 s).
    func settle(patience: Duration? = nil) throws {
        guard let unsettled = unsettled.take() else { return }
        do {
            if try !acknowledgeUnsettled(unsettled, patience: patience) { ready = nil }
        } catch {
            self.unsettled = unsettled  // still to do: a later settle() tries again
            throw error
        }
    }

    /// Records `unsettled`'s acknowledged batch as delivered, making its successor the batch in flight
    /// (``Outbox/acknowledge(_:then:patience:)``), and only then stops counting it as delivered but
    /// not recorded. Returns whether the successor became the batch in flight.
    func acknowledgeUnsettled(
        _ unsettled: (batchID: String, next: Outbox.PreparedBatch), patience: Duration? = nil
    ) throws -> Bool {
        try Self.acknowledge(unsettled, outbox: outbox, unsettledEvents: unsettledEvents, patience: patience)
    }

    /// ``acknowledgeUnsettled(_:patience:)`` with what it needs given, for the task beside a request.
    static func acknowledge(
        _ unsettled: (batchID: String, next: Outbox.PreparedBatch), outbox: Outbox, unsettledEvents: UnsettledEvents,
        patience: Duration? = nil
    ) throws -> Bool {
        let madeInFlight = try outbox.acknowledge(unsettled.batchID, then: unsettled.next, patience: patience)
        unsettledEvents.set(0, batch: nil)
        return madeInFlight
    }

    /// Reads and encodes the batch after `batchID` (in flight, its request out) so that, once it is
    /// acknowledged, the next request goes at once: the agent builds and compresses batch n + 1 while
    /// the collector stores batch n. Batch n + 1 is still sent only after batch n is acknowledged,
    /// and becomes the batch in flight in the acknowledgement's own transaction. A failure here only
    /// means no batch is ready (nil). Run beside the request, with what it needs given.
    static func readAhead(
        after batchID: String, limit: Int, outbox: Outbox, configuration: UploadConfiguration, logger: Logger
    ) -> ReadAhead? {
        let (clock, empty) = newBody(configuration)
        var body = empty
        do {
            let maxBytes = configuration.maxBatchBytes
            guard let batch = try outbox.peekBatch(after: batchID, maxCount: limit, maxBytes: maxBytes, each: { event in
                Self.append(event, at: clock, to: &body)
            }) else { return nil }
            let encoded = try body.finish(gzipLevel: configuration.gzipLevel)
            return ReadAhead(batch: batch, encoded: encoded, clock: clock)
        } catch {
            logger.debug("could not read the next batch ahead", metadata: ["tributary.reason": "\(error)"])
            return nil
        }
    }

    /// The clock a request body is built at (`_flush_time`, time correction) and an empty body.
    func newBody() -> (WireClock, BatchBodyBuilder) { Self.newBody(configuration) }

    /// The clock of now and an empty body for `configuration`'s format.
    static func newBody(_ configuration: UploadConfiguration) -> (WireClock, BatchBodyBuilder) {
        (WireClock(wallMillis: BootClock.wallMillis(), bootNanos: BootClock.nowNanos()),
         BatchBodyBuilder(format: configuration.format, capacity: min(configuration.maxBatchBytes, 16 << 20)))
    }
}

/// How many events of delivered batches still have their rows in the outbox (``UploadSession/settle()``),
/// readable from any thread: the agent's counts of events waiting to be sent leave them out.
final class UnsettledEvents: Sendable {
    private let state = Mutex<(batchID: String?, count: Int)>((nil, 0))

    var value: Int { state.withLock { $0.count } }

    /// The delivered batch whose rows still wait, and its events (nil when there is none): the status
    /// file checks in its own read of the outbox whether that batch is still the one in flight.
    var batch: (batchID: String, count: Int)? {
        state.withLock { current in current.batchID.map { ($0, current.count) } }
    }

    /// Sets the batch (nil and 0 once its acknowledgement has committed).
    func set(_ count: Int, batch batchID: String?) { state.withLock { $0 = (batchID, count) } }
}
