import AsyncHTTPClient
import Foundation
import Logging
import NIOCore
import NIOHTTP1
import Synchronization
import TributaryStore
import TributaryWire


/// Sends batches from the outbox, oldest first, one request at a time: the driver of
/// ``UploadMachine``, which makes every decision (which batch, what an answer means, bisection, 413s,
/// halts, read-ahead, deferred acknowledgements); this type does the I/O it asks for: outbox reads
/// and writes, encoding, the request, logs.
///
/// Owned by the agent's loop and used by its task alone: not `Sendable`. What runs beside a request
/// (the deferred acknowledgement, the read-ahead) and the request itself run in child tasks that see
/// only `Sendable` values, and hand back what they came to (``Aside``, ``UploadOutcome``).
final class UploadSession {
    typealias Machine = UploadMachine<ContinuousClock, ReadAhead>
    typealias Step = UploadStep

    let outbox: Outbox
    /// The HTTP clients (one per proxy in use).
    let clients: HTTPClients
    /// What TLS failures mean, and the pins.
    let tlsCheck: TLSCheck
    /// The collector URL whose certificate key last matched a pin, and when: checked again for another
    /// URL, after any answer but a delivery, and after ``pinCheckInterval``.
    var pinnedAt: (serverURL: String, at: ContinuousClock.Instant)?
    private(set) var configuration: UploadConfiguration
    let logger: Logger
    var machine: Machine
    let clock: any AgentClock

    /// HTTP requests sent by this session (a step that dead-letters or finds nothing sends none).
    var requestsSent = 0
    /// ``unsettledCount``, readable from any thread (the loop's drain reads it while a request is out):
    /// set when an acknowledgement is deferred, 0 once it has committed.
    let unsettledEvents: UnsettledEvents

    /// Retries so far for the batch in flight.
    var attempt: Int { machine.attempt }
    /// The last thing that went wrong, for status.
    var lastError: String? { machine.lastError }
    /// Set while the collector refuses us (401/403/404…, or event after event).
    var haltReason: String? { machine.haltReason }
    /// How many events in a row were dead-lettered, when the halt is the one they caused.
    var haltedAfterDeadLetters: Int? { machine.haltedAfterDeadLetters }
    /// The wait the collector asked for with the last retry's `Retry-After`, clamped; nil for none.
    var waitAskedByCollector: Duration? { machine.waitAskedByCollector }
    /// The events of a delivered batch whose rows are still in the outbox (``settle(patience:)``), or 0.
    var unsettledCount: Int { unsettledEvents.value }
    /// The events of the batch the next step sends as it is (read ahead, already in flight), or nil
    /// when the next step reads the outbox.
    var readyBatchCount: Int? { machine.readyBatchCount }

    /// Whether a delivered batch is recorded while the request of the batch after it is out, rather
    /// than before that request goes (``UploadMachine/Unsettled``). The agent's loop sets it, and calls
    /// ``settle(patience:)`` in a turn that sends nothing and when it ends; off, each step leaves the
    /// outbox as its answer says.
    var defersAcknowledgements: Bool {
        get { machine.policy.defersAcknowledgements }
        set { machine.policy.defersAcknowledgements = newValue }
    }

    /// A batch built ahead of its turn.
    struct ReadAhead: Sendable, UploadAhead {
        var batch: Outbox.PreparedBatch
        var encoded: EncodedBatch
        /// The clocks it was built at (its `_flush_time` and `Date` are the wall clock's).
        var clock: WireClock
        /// When it was built, on the machine's clock (how fresh it is when its turn comes).
        var builtAt: ContinuousClock.Instant
    }

    /// A session sending every request with `client`.
    convenience init(
        outbox: Outbox, client: HTTPClient, configuration: UploadConfiguration, logger: Logger,
        unsettledEvents: UnsettledEvents = UnsettledEvents(), clock: any AgentClock = SystemClock()
    ) {
        self.init(
            outbox: outbox, clients: HTTPClients(fixed: client), configuration: configuration, logger: logger,
            unsettledEvents: unsettledEvents, clock: clock)
    }

    /// A session sending each request with the client `clients` gives for the collector URL.
    init(
        outbox: Outbox, clients: HTTPClients, configuration: UploadConfiguration, logger: Logger,
        unsettledEvents: UnsettledEvents = UnsettledEvents(), clock: any AgentClock = SystemClock()
    ) {
        self.clock = clock
        self.outbox = outbox
        self.clients = clients
        self.tlsCheck = TLSCheck(loaded: configuration.loadedTLS ?? TLSSettings.systemDefault, proxies: configuration.proxy)
        self.configuration = configuration
        self.logger = logger
        self.machine = Machine(
            batchSize: configuration.batchSize,
            policy: .init(
                backoff: configuration.backoff, haltAfterDeadLetters: configuration.haltAfterDeadLetters,
                readAheadMaxAge: configuration.readAheadMaxAge))
        self.unsettledEvents = unsettledEvents
    }

    /// What ran beside a request: the deferred acknowledgement's outcome (whether the batch sent became
    /// the batch in flight), and the batch read ahead.
    struct Aside: Sendable {
        var settled: Result<Bool, any Error>?
        var readAhead: ReadAhead?
    }

    /// Replaces the bearer token (re-read from its file after a 401/403).
    func updateToken(_ token: String?) { configuration.bearerToken = token }

    /// Where batches go and in what format. A change forgets what the old destination's answers
    /// taught (``UploadMachine/destinationChanged()``); the batch in flight goes to the new one with
    /// the same `Idempotency-Key`.
    var destination: (serverURL: String?, format: WireFormat) {
        get { (configuration.serverURL, configuration.format) }
        set {
            guard newValue.serverURL != configuration.serverURL || newValue.format != configuration.format else { return }
            (configuration.serverURL, configuration.format) = newValue
            machine.destinationChanged()
        }
    }

    /// Sends at most one request (of at most `maxEvents` events, ending within `timeout`) and applies
    /// its outcome. A request still running at `timeout` is cancelled; its batch stays in the outbox.
    /// `cancelWhen`, when given, is awaited beside the request, and cancels it when it returns (the
    /// deadline): the batch stays in the outbox with its id, and the step applies a retry.
    func step(
        maxEvents: Int? = nil, timeout: Duration? = nil, cancelWhen: (@Sendable () async -> Void)? = nil
    ) async throws -> Step {
        let timeout = timeout ?? configuration.requestTimeout
        while true {
            switch machine.start(maxEvents: maxEvents, now: clock.now) {
            case .sendReady(let ready, let unsettled, let limit):
                return try await sendReady(
                    ready, acknowledging: unsettled, readAheadLimit: limit, timeout: timeout, cancelWhen: cancelWhen)
            case .settle(let unsettled):
                try settle(unsettled, patience: nil)
            case .refuse(let refused):
                return try refuse(refused)
            case .rebatch(let rows):
                machine.halfBatched(try outbox.rebatch(rows))
            case .sendHalf(let half):
                guard let id = half.first?.batchID else { return .empty }
                let (wireClock, empty) = newBody()
                var body = empty
                for row in half { Self.append(row, at: wireClock, to: &body) }
                return try await send(
                    body, at: wireClock, batchID: id, count: half.count, readAheadLimit: nil, timeout: timeout,
                    cancelWhen: cancelWhen)
            case .read(let limit):
                // The common case: the request body is built straight from the outbox's rows.
                let (wireClock, empty) = newBody()
                var body = empty
                guard let batch = try outbox.nextBatch(maxCount: limit, maxBytes: configuration.maxBatchBytes, each: { event in
                    Self.append(event, at: wireClock, to: &body)
                }) else { return .empty }
                return try await send(
                    body, at: wireClock, batchID: batch.id, count: batch.count, readAheadLimit: limit,
                    timeout: timeout, cancelWhen: cancelWhen)
            }
        }
    }

    /// Sends the batch read ahead, recording the batch before it (`unsettled`) and reading the batch
    /// after it ahead while its request is out, then applies the answer.
    private func sendReady(
        _ ready: ReadAhead, acknowledging unsettled: Machine.Unsettled?, readAheadLimit limit: Int,
        timeout: Duration, cancelWhen: (@Sendable () async -> Void)?
    ) async throws -> Step {
        let (outbox, configuration, logger, unsettledEvents, clock) = (outbox, configuration, logger, unsettledEvents, clock)
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
                case .failure:
                    // An I/O error has tripped the outbox's fail-stop latch: nothing writes it any more.
                    return aside
                }
            }
            aside.readAhead = Self.readAhead(
                after: ready.batch.id, limit: limit, outbox: outbox, configuration: configuration, logger: logger, clock: clock)
            return aside
        }
        machine.sent(readAhead: aside.readAhead, builtAt: aside.readAhead?.builtAt ?? clock.now)
        if let unsettled {
            let madeInFlight: Bool
            do {
                madeInFlight = try aside.settled?.get() ?? false
            } catch {
                machine.settleFailed(unsettled)  // still to do: a settle() tries again (the end of the run's)
                throw error
            }
            guard machine.settledBeside(madeInFlight: madeInFlight) else {
                // The outbox changed meanwhile (rows edited by hand, say), and the batch just sent is not
                // the one in flight: its answer changes nothing here. Its rows go in a batch built anew,
                // and the collector's dedup drops them if it stored them already.
                logger.notice("the batch sent was not the outbox's batch in flight; its events are sent again", metadata: [
                    "tributary.batch.id": "\(ready.batch.id)",
                ])
                return .progressed(delivered: 0)
            }
        }
        return try apply(outcome, batchID: ready.batch.id, count: ready.batch.count)
    }

    /// Encodes `body` and sends it as `batchID`, reading the batch after it ahead beside the request
    /// when `readAheadLimit` is given, then applies the answer.
    private func send(
        _ body: BatchBodyBuilder, at wireClock: WireClock, batchID: String, count: Int, readAheadLimit limit: Int?,
        timeout: Duration, cancelWhen: (@Sendable () async -> Void)?
    ) async throws -> Step {
        let encoded: EncodedBatch
        do {
            encoded = try body.finish(gzipLevel: configuration.gzipLevel)
        } catch {
            let failure = UploadOutcome.retry(reason: "could not encode the batch: \(error)", retryAfter: nil)
            return try apply(failure, batchID: batchID, count: count)
        }
        let (outbox, configuration, logger, clock) = (outbox, configuration, logger, clock)
        let (outcome, aside) = await post(
            encoded, batchID: batchID, sentAt: wireClock.wallMillis, timeout: timeout, cancelWhen: cancelWhen
        ) {
            guard let limit else { return Aside() }
            return Aside(
                readAhead: Self.readAhead(
                    after: batchID, limit: limit, outbox: outbox, configuration: configuration, logger: logger, clock: clock))
        }
        machine.sent(readAhead: aside.readAhead, builtAt: aside.readAhead?.builtAt ?? clock.now)
        return try apply(outcome, batchID: batchID, count: count)
    }

    /// Records a batch the collector acknowledged whose recording was deferred, making the batch read
    /// ahead after it the batch in flight; nothing when there is none. The outbox then holds exactly
    /// what is still to be sent.
    /// `patience`: how long to wait for another process's write lock on the outbox (nil: the outbox's
    /// own 10 s).
    func settle(patience: Duration? = nil) throws {
        guard let unsettled = machine.settleNow() else { return }
        try settle(unsettled, patience: patience)
    }

    private func settle(_ unsettled: Machine.Unsettled, patience: Duration?) throws {
        do {
            machine.settled(madeInFlight: try acknowledgeUnsettled(unsettled, patience: patience))
        } catch {
            machine.settleFailed(unsettled)  // still to do: a later settle() tries again
            throw error
        }
    }

    /// Records `unsettled`'s acknowledged batch as delivered, making its successor the batch in flight
    /// (``Outbox/acknowledge(_:then:patience:)``), and only then stops counting it as delivered but
    /// not recorded. Returns whether the successor became the batch in flight.
    func acknowledgeUnsettled(
        _ unsettled: Machine.Unsettled, patience: Duration? = nil
    ) throws -> Bool {
        try Self.acknowledge(unsettled, outbox: outbox, unsettledEvents: unsettledEvents, patience: patience)
    }

    /// ``acknowledgeUnsettled(_:patience:)`` with what it needs given, for the task beside a request.
    static func acknowledge(
        _ unsettled: Machine.Unsettled, outbox: Outbox, unsettledEvents: UnsettledEvents,
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
        after batchID: String, limit: Int, outbox: Outbox, configuration: UploadConfiguration, logger: Logger,
        clock machineClock: any AgentClock
    ) -> ReadAhead? {
        let (clock, empty) = newBody(configuration)
        var body = empty
        do {
            let maxBytes = configuration.maxBatchBytes
            guard let batch = try outbox.peekBatch(after: batchID, maxCount: limit, maxBytes: maxBytes, each: { event in
                Self.append(event, at: clock, to: &body)
            }) else { return nil }
            let encoded = try body.finish(gzipLevel: configuration.gzipLevel)
            return ReadAhead(batch: batch, encoded: encoded, clock: clock, builtAt: machineClock.now)
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
