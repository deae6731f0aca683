import AsyncHTTPClient
import Foundation
import Logging
import NIOCore
import NIOHTTP1
import Synchronization
import TributaryStore
import TributaryWire

/// How the agent talks to the collector.
public struct UploadConfiguration: Sendable {
    /// Where batches are POSTed; nil until one is known (the group's settings may give it later:
    /// nothing is sent meanwhile).
    public var serverURL: String?
    /// The body format. Default `.sensors`.
    public var format: WireFormat = .sensors
    /// Most events per batch. Default 500.
    public var batchSize: Int = 500
    /// Most uncompressed event bytes per batch. Default 1 MiB.
    public var maxBatchBytes: Int = 1 << 20
    /// gzip level of request bodies, 1 (fastest) … 9 (smallest). Default 1: see docs/performance.md.
    public var gzipLevel: Int32 = 1
    /// Retry policy for 408, 429, 5xx and transport errors.
    public var backoff = Backoff()
    /// Events dead-lettered in a row (none delivered between them) after which uploads halt instead
    /// of dead-lettering the next one. A collector that refuses every event (a wrong `--format`, a
    /// proxy that answers 400, a body limit below any event) would otherwise move the whole backlog
    /// to dead letters, each after its own bisection. While halted, the refused event is sent alone
    /// again at the backoff cap: delivered, uploads go on; refused again, it is dead-lettered and the
    /// next refused event halts again, so a long run of truly bad events still passes, one per
    /// interval. 0: never halt. Default 10.
    public var haltAfterDeadLetters = 10
    /// How long one request may take. Default 30 s.
    public var requestTimeout: Duration = .seconds(30)
    /// Sent as `Authorization: Bearer …` when set.
    public var bearerToken: String?
    /// How old a batch read ahead may be when its turn comes: an older one is built again, so that
    /// its `_flush_time` and `Date` say when it was sent (it waits for the next upload, which may be
    /// a flush interval away). Default 1 s.
    var readAheadMaxAge: Duration = .seconds(1)

    /// A configuration for `serverURL` with defaults for the rest.
    public init(serverURL: String?) { self.serverURL = serverURL }
}

/// What one request to the collector came to.
public enum UploadOutcome: Sendable, Equatable {
    /// 2xx: the batch is acknowledged.
    case delivered
    /// 408, 429, 5xx, timeout, reset, refused: send the same batch again later.
    case retry(reason: String, retryAfter: Duration?)
    /// 413: the batch is too large.
    case tooLarge(reason: String)
    /// 400 or 422: something in the batch is unacceptable.
    case rejected(status: Int, reason: String)
    /// 401, 403, 404 and other 4xx: keep everything, stop until the configuration is fixed.
    case halt(status: Int, reason: String)

    /// Classifies an HTTP status (with its Retry-After, the response's `Date`, and a snippet of the
    /// response body). A Retry-After date is read against the collector's `Date` when it sent one.
    static func classify(status: Int, retryAfter: String?, date: String? = nil, body: String) -> UploadOutcome {
        let snippet = oneLine(body.prefix(200))
        let reason = "HTTP \(status)" + (snippet.isEmpty ? "" : ": \(snippet)")
        switch status {
        case 200..<300: return .delivered
        case 408, 429, 500..<600:
            return .retry(reason: reason, retryAfter: Backoff.parseRetryAfter(retryAfter, date: date))
        case 413: return .tooLarge(reason: reason)
        case 400, 422: return .rejected(status: status, reason: reason)
        default: return .halt(status: status, reason: reason)
        }
    }
}

/// `text` as one line fit for a log line, a terminal and a tab-separated listing: its whitespace runs
/// (line breaks and tabs among them) become one space, any other control character its `\u{…}` escape,
/// and its ends are trimmed. A collector's answer is foreign text (an HTML error page of a proxy, say,
/// with CRLFs), and its reason is shown in `tributary status` and `tributary dead-letters`.
package func oneLine(_ text: some StringProtocol) -> String {
    var line = ""
    var pendingSpace = false
    for scalar in text.unicodeScalars {
        if scalar.properties.isWhitespace {
            pendingSpace = !line.isEmpty
            continue
        }
        if pendingSpace { line.append(" ") }
        pendingSpace = false
        if scalar.properties.generalCategory == .control {
            line += "\\u{\(String(scalar.value, radix: 16))}"
        } else {
            line.unicodeScalars.append(scalar)
        }
    }
    return line
}

/// Sends batches from the outbox, oldest first, one request at a time, and applies each outcome.
///
/// Never sends a batch before every earlier batch is acknowledged. A batch keeps its id across
/// retries (the `Idempotency-Key`). 413 halves the batch size (a single event still too large is
/// dead-lettered); 400/422 bisects the batch, sending only the first half of a known-bad range each
/// time, so one poison event in n is isolated in about log₂ n requests and only it is dead-lettered.
/// While a request is out (and no batch is being bisected), the next batch is read and encoded
/// ahead (``readAhead(after:limit:)``); it is sent only once the batch before it is acknowledged.
///
/// Owned by the agent's loop; it is handed to one child task at a time (so that a deadline can cancel
/// the request in flight), never used concurrently — hence `@unchecked Sendable`.
final class UploadSession: @unchecked Sendable {
    private let outbox: Outbox
    private let client: HTTPClient
    private(set) var configuration: UploadConfiguration
    private let logger: Logger

    /// Retries so far for the batch in flight.
    private(set) var attempt = 0
    /// HTTP requests sent by this session (a step that dead-letters or finds nothing sends none).
    private(set) var requestsSent = 0
    /// Rows known to contain at least one rejected event (the collector refused them as a whole).
    private var suspect: [Outbox.Row]?
    /// The half of the suspect currently being sent (kept, with its batch id, across retries).
    private var suspectHalf: [Outbox.Row]?
    /// The suspect's status and reason, for the dead letter.
    private var suspectReason: (status: Int, reason: String) = (0, "")
    /// Whether the collector refused the suspect on its own. A single suspect inferred from an accepted
    /// first half is sent alone once before it is dead-lettered: a refusal of the whole batch that
    /// does not recur (a proxy that mangled one body) then dead-letters nothing.
    private var suspectRefusedAlone = false
    /// Batch size after 413s; grows back on success, up to `sizeCeiling`.
    private var batchLimit: Int
    /// After a 413, the batch size it halved to: the limit grows back no further than this, so that a
    /// collector whose limit lies between the two sizes does not answer every other batch with 413.
    /// Forgotten after ``ceilingDeliveries`` batches delivered, so that a raised limit is found again.
    private var sizeCeiling: Int?
    /// Batches delivered since the last 413.
    private var deliveriesUnderCeiling = 0
    /// How many deliveries `sizeCeiling` lasts.
    static let ceilingDeliveries = 100
    /// The last thing that went wrong, for status.
    private(set) var lastError: String?
    /// Set while the collector refuses us (401/403/404…).
    private(set) var haltReason: String?
    /// The wait the collector asked for with the last retry's `Retry-After` (clamped as the backoff
    /// clamps it), or nil when it asked for none (or for 0).
    private(set) var waitAskedByCollector: Duration?
    /// The batch after the one in flight, read and encoded while that one was out (see ``readAhead``).
    private var readAheadBatch: ReadAhead?
    /// A read-ahead batch that became the batch in flight when its predecessor was acknowledged, or
    /// that becomes it in the next step (``unsettled``): the next step sends it as it is.
    private var ready: ReadAhead?
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
    private var unsettled: (batchID: String, next: Outbox.PreparedBatch)?
    /// ``unsettledCount``, readable from any thread (the loop's drain reads it while a request is out):
    /// set when an acknowledgement is deferred, 0 once it has committed (``acknowledgeUnsettled(_:patience:)``).
    let unsettledEvents: UnsettledEvents

    /// The events of a delivered batch whose rows are still in the outbox (``unsettled``), or 0.
    var unsettledCount: Int { unsettledEvents.value }

    /// The events of the batch the next step sends as it is (read ahead, already in flight), or nil
    /// when the next step reads the outbox.
    var readyBatchCount: Int? { suspect == nil ? ready?.batch.count : nil }

    /// A batch built ahead of its turn.
    private struct ReadAhead {
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
        self.batchLimit = configuration.batchSize
        self.unsettledEvents = unsettledEvents
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
            batchLimit = configuration.batchSize
            sizeCeiling = nil
            suspectRefusedAlone = false
        }
    }

    /// Sends at most one request (of at most `maxEvents` events, ending within `timeout`) and applies
    /// its outcome. A request still running at `timeout` is cancelled; its batch stays in the outbox.
    func step(maxEvents: Int? = nil, timeout: Duration? = nil) async throws -> Step {
        let limit = min(batchLimit, maxEvents ?? .max)
        let timeout = timeout ?? configuration.requestTimeout
        // Read ahead during the previous request and made the batch in flight by its acknowledgement. A
        // ready batch over this step's limit (a deadline near) is dropped here, and `nextBatch` cuts the
        // batch in flight down to the limit; one built too long ago is dropped too, and `nextBatch`
        // builds the same batch again with the clock of now.
        if suspect == nil, let ready = self.ready.take(), ready.batch.count <= limit,
            ready.isFresh(maxAge: configuration.readAheadMaxAge)
        {
            let unsettled = self.unsettled.take()
            let settled = SettleResult()
            let outcome = await post(ready.encoded, batchID: ready.batch.id, sentAt: ready.clock.wallMillis, timeout: timeout) {
                if let unsettled {
                    CrashPoint.hit("upload.before-deferred-ack")
                    settled.record { try self.acknowledgeUnsettled(unsettled) }
                    do {
                        guard try settled.outcome() else { return }
                    } catch {
                        // The fail-stop rule at once: the loop's drain would commit again meanwhile (FatalIO).
                        if FatalIO.matches(error) { FatalIO.stop(error, logger: self.logger) }
                        return
                    }
                }
                self.readAhead(after: ready.batch.id, limit: limit)
            }
            if let unsettled {
                let madeInFlight: Bool
                do {
                    madeInFlight = try settled.outcome()
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
        let outcome = await post(encoded, batchID: batchID, sentAt: clock.wallMillis, timeout: timeout) {
            if !bisecting { self.readAhead(after: batchID, limit: limit) }
        }
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
    private func acknowledgeUnsettled(
        _ unsettled: (batchID: String, next: Outbox.PreparedBatch), patience: Duration? = nil
    ) throws -> Bool {
        let madeInFlight = try outbox.acknowledge(unsettled.batchID, then: unsettled.next, patience: patience)
        unsettledEvents.set(0)
        return madeInFlight
    }

    /// Reads and encodes the batch after `batchID` (in flight, its request out) so that, once it is
    /// acknowledged, the next request goes at once: the agent builds and compresses batch n + 1 while
    /// the collector stores batch n. Batch n + 1 is still sent only after batch n is acknowledged,
    /// and becomes the batch in flight in the acknowledgement's own transaction. A failure here only
    /// means no batch is ready.
    private func readAhead(after batchID: String, limit: Int) {
        readAheadBatch = nil
        let (clock, empty) = newBody()
        var body = empty
        do {
            let maxBytes = configuration.maxBatchBytes
            guard let batch = try outbox.peekBatch(after: batchID, maxCount: limit, maxBytes: maxBytes, each: { event in
                Self.append(event, at: clock, to: &body)
            }) else { return }
            let encoded = try body.finish(gzipLevel: configuration.gzipLevel)
            readAheadBatch = ReadAhead(batch: batch, encoded: encoded, clock: clock)
        } catch {
            logger.debug("could not read the next batch ahead", metadata: ["tributary.reason": "\(error)"])
        }
    }

    /// The clock a request body is built at (`_flush_time`, time correction) and an empty body.
    private func newBody() -> (WireClock, BatchBodyBuilder) {
        (WireClock(wallMillis: BootClock.wallMillis(), bootNanos: BootClock.nowNanos()),
         BatchBodyBuilder(format: configuration.format, capacity: min(configuration.maxBatchBytes, 16 << 20)))
    }

    /// Applies the outcome of the request for `batchID` (`count` events).
    private func apply(_ outcome: UploadOutcome, batchID: String, count: Int) throws -> Step {
        let next = readAheadBatch.take()
        if case .retry = outcome {} else { suspectHalf = nil }
        if case .halt = outcome {} else { haltReason = nil }  // any other answer: not halted any more
        switch outcome {
        case .delivered:
            CrashPoint.hit("upload.after-ack")
            if defersAcknowledgements, suspect == nil, let next {
                (unsettled, ready) = ((batchID, next.batch), next)
                unsettledEvents.set(count)
            } else if try outbox.acknowledge(batchID, then: next?.batch) {
                // (The acknowledgement's transaction sets the outbox's count of dead letters in a row back to 0.)
                ready = next
            }
            if let suspect {
                // The first half was fine, so the rejected event is in the second half (if the refusal
                // recurs: a half left alone is sent alone before it is dead-lettered).
                let rest = suspect.dropFirst(count).map { row in
                    var row = row
                    row.batchID = nil
                    return row
                }
                self.suspect = rest.isEmpty ? nil : rest
                suspectRefusedAlone = false
            }
            attempt = 0
            if sizeCeiling != nil {
                deliveriesUnderCeiling += 1
                if deliveriesUnderCeiling >= Self.ceilingDeliveries { sizeCeiling = nil }
            }
            batchLimit = min(configuration.batchSize, batchLimit.doubledSaturating, sizeCeiling ?? .max)
            logger.debug("batch delivered", metadata: ["tributary.batch.id": "\(batchID)", "tributary.batch.events": "\(count)"])
            return .progressed(delivered: count)

        case .retry(let reason, let retryAfter):
            var rng = SystemRandomNumberGenerator()
            let delay = configuration.backoff.delay(attempt: attempt, retryAfter: retryAfter, using: &rng)
            waitAskedByCollector = retryAfter.map(configuration.backoff.clamped).flatMap { $0 > .zero ? $0 : nil }
            attempt += 1
            lastError = reason
            try outbox.countRetry()
            logger.info("upload failed; will retry the same batch", metadata: [
                "tributary.batch.id": "\(batchID)", "tributary.reason": "\(reason)",
                "tributary.retry.attempt": "\(attempt)", "tributary.retry.delay_s": "\(delay.seconds)",
            ])
            return .wait(delay)

        case .tooLarge(let reason):
            lastError = reason
            if count == 1, let row = try outbox.rows(inBatch: batchID).first {
                // Held back by a halt, the batch in flight (this one event) is what the next step sends.
                if let halt = try haltBeforeDeadLetter(row, reason: reason) { return halt }
                try outbox.deadLetter(row, status: 413, reason: "too large even alone: \(reason)") {
                    CrashPoint.hit("deadletter.before-commit")
                }
                suspect = nil
                // The 413s that halved the size down to one were this event's: the size may grow again.
                sizeCeiling = nil
                return .progressed(delivered: 0, deadLettered: 1)
            }
            batchLimit = max(1, count / 2)
            sizeCeiling = batchLimit
            deliveriesUnderCeiling = 0
            // A half refused as too large ends the bisection: its rows go back to the pool, and batches
            // of the halved size find the refused event again (sending the same half again would get
            // the same 413).
            suspect = nil
            try outbox.unbatch(batchID)
            logger.info("collector said 413; halving the batch size", metadata: [
                "tributary.batch.id": "\(batchID)", "tributary.batch.limit": "\(batchLimit)",
            ])
            return .progressed(delivered: 0)

        case .rejected(let status, let reason):
            lastError = reason
            let refused = try outbox.rows(inBatch: batchID)
            suspect = refused
            suspectRefusedAlone = refused.count == 1
            suspectReason = (status, reason)
            attempt = 0
            return .progressed(delivered: 0)

        case .halt(let status, let reason):
            lastError = reason
            haltReason = reason
            logger.error("collector refuses uploads; keeping every event and retrying at the cap interval", metadata: [
                "tributary.status": "\(status)", "tributary.reason": "\(reason)",
            ])
            return .wait(configuration.backoff.cap)
        }
    }

    /// Halts instead of dead-lettering the refused event `row`, when ``UploadConfiguration/haltAfterDeadLetters``
    /// events were dead-lettered in a row (this run's and the runs' before, to this destination: the count
    /// is the outbox's) and `row` was not already held back by a halt (then sent alone again, by this run
    /// or a later one): nil when it is to be dead-lettered.
    private func haltBeforeDeadLetter(_ row: Outbox.Row, reason: String) throws -> Step? {
        let limit = configuration.haltAfterDeadLetters
        guard limit > 0 else { return nil }
        let (deadLettersInARow, heldSeq) = try outbox.deadLetterRun(destination: destinationFingerprint)
        guard deadLettersInARow >= limit, heldSeq != row.seq else { return nil }
        try outbox.holdAfterHalt(seq: row.seq)
        let cap = configuration.backoff.cap
        let interval = String(format: "%g", cap.seconds)
        haltReason =
            "the collector refused the last \(deadLettersInARow) events one by one (the last: \(reason)); it seems to "
            + "refuse every event: check the collector URL, --format and the collector's limits. The next refused "
            + "event stays in the outbox and is sent again every \(interval) s; the refused ones are dead letters "
            + "(tributary dead-letters; --replay once fixed)"
        lastError = reason
        logger.error(
            "collector refuses event after event; halting uploads instead of dead-lettering the backlog",
            metadata: ["tributary.dead_letters_in_a_row": "\(deadLettersInARow)", "tributary.reason": "\(reason)"])
        return .wait(cap)
    }

    /// The collector URL and wire format, as ``Outbox/deadLetterRun(destination:)`` tells destinations apart.
    private var destinationFingerprint: UInt64 {
        fnv1a64("\(configuration.format.rawValue) \(configuration.serverURL ?? "")".utf8)
    }

    /// POSTs one encoded batch, running `whileWaiting` while the request is out.
    ///
    /// This task hands the request to the HTTP client itself, before anything else, and `whileWaiting`
    /// (reading the next batch ahead: an SQLite read and gzip, several ms) runs beside it as a child
    /// task. The other way round, the request was the child and waited for a thread of the cooperative
    /// pool, which is as wide as the machine has CPUs: on 2 CPUs, one thread held by the loop's drain
    /// and the other by the read-ahead, the request left only once the read-ahead was done, and the
    /// collector idled meanwhile (a 2,000-event batch every 16.4–18.0 ms, medians, against 14.5–15.9 ms
    /// with this change alone: docs/performance.md, "Seventeenth round").
    private func post(
        _ encoded: EncodedBatch, batchID: String, sentAt nowWall: Int64, timeout: Duration,
        whileWaiting: @escaping @Sendable () -> Void
    ) async -> UploadOutcome {
        guard let serverURL = configuration.serverURL else {
            // The loop uploads only with a server URL; this is the same rule where the request is made.
            // What was to run meanwhile (a deferred acknowledgement among it) still runs.
            whileWaiting()
            return .retry(reason: "no collector URL is configured", retryAfter: nil)
        }
        var request = HTTPClientRequest(url: serverURL)
        request.method = .POST
        for header in encoded.headers { request.headers.add(name: header.name, value: header.value) }
        request.headers.add(name: "Idempotency-Key", value: batchID)
        request.headers.add(name: "User-Agent", value: "tributary-agent/\(TributaryAgentVersion.current)")
        if let date = httpDate(nowWall) { request.headers.add(name: "Date", value: date) }
        if let token = configuration.bearerToken { request.headers.add(name: "Authorization", value: "Bearer \(token)") }
        request.body = .bytes(ByteBuffer(bytes: encoded.body))
        requestsSent += 1
        async let aside: Void = whileWaiting()
        let outcome = await send(request, timeout: timeout)
        await aside
        return outcome
    }

    /// Sends `request` and classifies its answer; a transport error or a cancellation is a retry.
    private func send(_ request: HTTPClientRequest, timeout: Duration) async -> UploadOutcome {
        do {
            let response = try await client.execute(request, timeout: .init(timeout))
            CrashPoint.hit("upload.after-send")
            let status = Int(response.status.code)
            // Cancelled (deadline, or the answer not read a second after its timeout) while reading the
            // body, the status line still decides, with no reason: a 2xx is the collector's
            // acknowledgement however slowly the rest comes (taken as a retry, a collector that always
            // dribbles its body got the same batch for ever), a 401 still halts, a 429's Retry-After
            // still holds.
            let reason = (try? await Self.reason(of: response.body)) ?? ""
            return UploadOutcome.classify(
                status: status, retryAfter: response.headers.first(name: "Retry-After"),
                date: response.headers.first(name: "Date"), body: reason)
        } catch is CancellationError {
            return .retry(reason: "cancelled", retryAfter: nil)
        } catch {
            return .retry(reason: "transport error: \(error)", retryAfter: nil)
        }
    }

    /// The start of a response body (the reason a collector gives for its answer), read to its end so
    /// that the connection can be used again. The status decides what the answer means, never the
    /// body's length: a 2xx with a long body is still an acknowledgement, a 400 with an HTML error page
    /// still a rejection. A body that breaks off after the status line only shortens the reason.
    static func reason(of body: HTTPClientResponse.Body) async throws(CancellationError) -> String {
        var head = ByteBuffer()
        do {
            for try await part in body where head.readableBytes < reasonBytes {
                var part = part
                head.writeImmutableBuffer(part.readSlice(length: min(part.readableBytes, reasonBytes - head.readableBytes))!)
            }
        } catch {
            if Task.isCancelled { throw CancellationError() }
        }
        return String(decoding: head.readableBytesView, as: UTF8.self)
    }

    /// How much of a response body ``reason(of:)`` keeps.
    static let reasonBytes = 1024

    /// The event as sent: `_flush_time` added, and `time` corrected if the wall clock moved.
    func wireEvent(_ row: Outbox.Row, nowWall: Int64, nowBoot: UInt64) -> [UInt8] {
        var body = BatchBodyBuilder(format: .sensors)
        Self.append(row, at: WireClock(wallMillis: nowWall, bootNanos: nowBoot), to: &body)
        return Array(body.text.dropFirst())  // the builder's text is "[" and the event
    }

    /// Appends an outbox row as sent, as the event form below does.
    static func append(_ row: Outbox.Row, at clock: WireClock, to body: inout BatchBodyBuilder) {
        row.body.withUnsafeBytes { bytes in
            row.bootID.bytes.withUnsafeBytes { bootID in
                append(
                    Outbox.BatchEvent(wallMillis: row.wallMillis, bootNanos: row.bootNanos, bootID: bootID, body: bytes),
                    at: clock, to: &body)
            }
        }
    }

    /// Whether the kernel gave this boot an id: with the unknown (all-zero) one, which also marks a
    /// reading that cannot be compared, no event is taken for this boot's (decided once, not per event).
    static let bootKnown = BootID.current != .unknown

    /// Appends an event as sent: `_flush_time` added, and `time` corrected if the wall clock moved.
    ///
    /// If the event was recorded in this boot and the wall-clock time since then disagrees with the
    /// `CLOCK_BOOTTIME` time since then by more than a second, the clock was changed in between: `time`
    /// is recomputed from the monotonic reading and `$time_adjustment_ms` records the change. The
    /// unknown (all-zero) boot id is never taken for this boot: it marks a reading that cannot be
    /// compared (no boot id from the kernel, or a hybrid page's time before this boot or after its
    /// recording), so such an event is sent as recorded.
    static func append(_ event: Outbox.BatchEvent, at clock: WireClock, to body: inout BatchBodyBuilder) {
        clock.flushTimeMember.withUnsafeBytes { member in
            if Self.bootKnown, clock.bootNanos >= event.bootNanos, event.bootID.elementsEqual(BootID.current.bytes) {
                let expected = clock.wallMillis - Int64((clock.bootNanos - event.bootNanos) / 1_000_000)
                let adjustment = expected - event.wallMillis
                if abs(adjustment) > 1000, let corrected = correctTime(Array(event.body), to: expected, adjustment: adjustment) {
                    corrected.withUnsafeBytes { body.append($0, member: member) }
                    return
                }
            }
            body.append(event.body, member: member)
        }
    }

    static func correctTime(_ body: [UInt8], to time: Int64, adjustment: Int64) -> [UInt8]? {
        guard var event = try? JSONSerialization.jsonObject(with: Data(body)) as? [String: Any] else { return nil }
        event["time"] = time
        var properties = event["properties"] as? [String: Any] ?? [:]
        properties["$time_adjustment_ms"] = adjustment
        event["properties"] = properties
        return (try? JSONSerialization.data(withJSONObject: event, options: [.withoutEscapingSlashes])).map(Array.init)
    }
}

/// The moment a batch is sent: what each event's `_flush_time` and time correction use.
struct WireClock {
    var wallMillis: Int64
    var bootNanos: UInt64
    /// `"_flush_time":<wallMillis>`.
    let flushTimeMember: [UInt8]

    init(wallMillis: Int64, bootNanos: UInt64) {
        self.wallMillis = wallMillis
        self.bootNanos = bootNanos
        flushTimeMember = Array("\"_flush_time\":\(wallMillis)".utf8)
    }
}

/// The agent's version, sent in `User-Agent`.
public enum TributaryAgentVersion {
    public static let current = "0.1.0"
}

/// An IMF-fixdate (RFC 9110 §5.6.7), e.g. `Sun, 06 Nov 1994 08:49:37 GMT`, of `millis` since the
/// epoch; nil for an instant `gmtime_r` cannot break down (its year overflows).
///
/// Built from `gmtime_r`: a `DateFormatter` per request (ICU's setup) cost 1.7 % of the agent's CPU.
func httpDate(_ millis: Int64) -> String? {
    var seconds = time_t(millis >= 0 ? millis / 1000 : (millis - 999) / 1000)
    var parts = tm()
    guard gmtime_r(&seconds, &parts) != nil else { return nil }
    func two(_ value: Int32) -> String { value < 10 ? "0\(value)" : "\(value)" }
    let year = String(parts.tm_year + 1900)
    return "\(httpDays[Int(parts.tm_wday)]), \(two(parts.tm_mday)) \(httpMonths[Int(parts.tm_mon)]) "
        + String(repeating: "0", count: max(0, 4 - year.count)) + year + " "
        + "\(two(parts.tm_hour)):\(two(parts.tm_min)):\(two(parts.tm_sec)) GMT"
}

/// `tm_wday` and `tm_mon` as an IMF-fixdate names them.
private let httpDays = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"]
private let httpMonths = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]

/// What a deferred acknowledgement (``UploadSession/settle()``'s work, done while the next request is
/// out) came to, handed from the child task that ran it to the step that waits for it.
private final class SettleResult: @unchecked Sendable {
    // Written by the child task before the step awaits it, read by the step after: never at once.
    private var result: Result<Bool, any Error> = .success(false)

    func record(_ acknowledge: () throws -> Bool) { result = Result { try acknowledge() } }

    /// Whether the batch sent became the batch in flight; the acknowledgement's error, if it failed.
    func outcome() throws -> Bool { try result.get() }
}

/// How many events of delivered batches still have their rows in the outbox (``UploadSession/settle()``),
/// readable from any thread: the agent's counts of events waiting to be sent leave them out.
final class UnsettledEvents: Sendable {
    private let count = Atomic<Int>(0)

    var value: Int { count.load(ordering: .acquiring) }

    func set(_ value: Int) { count.store(value, ordering: .releasing) }
}
