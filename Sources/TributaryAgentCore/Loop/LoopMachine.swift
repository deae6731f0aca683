/// The agent loop's decisions, with no I/O and no clock of its own: when to flush, when an upload may
/// go and how large, when the loop waits and for how long, and when the run is over.
///
/// The driver (``Agent``) runs the loop a turn at a time and hands each decision point what it
/// observed: the time on its clock, the outbox's counts, whether a stop or a flush was asked for. Each
/// input is a `mutating func` that returns what to do, in the shape of swift-nio's `NIOAsyncWriter`
/// state machine, so that every rule is tested step by step with a manual clock
/// (`LoopMachineTests`). A turn, in order:
///
/// 1. ``deadlineReached(at:expiresAt:)``: past the deadline, the run stops cleanly.
/// 2. ``uploadsFirst(queued:at:)``: whether the drain waits (a full batch is ready to go).
/// 3. The driver drains, then ``decide(_:)`` with what the outbox holds: upload (how many events,
///    with what timeout), or not, or finish.
/// 4. After an upload, ``uploaded(_:answer:at:)``, then ``endFlushIfBelowBulk(waiting:)``.
/// 5. ``finish(at:pending:stopping:)`` and, in a one-shot run, ``sentEverything(drainedThrough:waiting:)``;
///    otherwise the loop waits at most ``waitTimeout(at:expiresAt:mustPoll:)`` (idle: until woken),
///    or comes round at once when the turn made progress.
///
/// Generic over the clock so that tests move time by hand; the agent runs it on `ContinuousClock`
/// (`CLOCK_BOOTTIME`), so a wall-clock jump neither starts nor delays a flush.
struct LoopMachine<C: Clock> where C.Duration == Duration {
    typealias Instant = C.Instant

    /// What the loop is doing, as the status file and `systemctl status` say it.
    enum Activity: String, Sendable {
        case idle, uploading, stopping, waiting, halted, backoff
    }

    /// The part of the agent's configuration the decisions read.
    struct Limits: Sendable {
        /// `--once`: a run that ends, rather than waits, when nothing it could do would make progress.
        var once = false
        var batchSize = 500
        var requestTimeout: Duration = .seconds(30)
        /// How long a flush request keeps the agent flushing.
        var backgroundBudget: Duration = .seconds(30)
        var pollInterval: Duration = .milliseconds(200)
        var outboxQuotaBytes = 512 << 20

        init() {}

        init(_ configuration: AgentConfiguration) {
            once = configuration.once
            batchSize = configuration.upload.batchSize
            requestTimeout = configuration.upload.requestTimeout
            backgroundBudget = configuration.backgroundBudget
            pollInterval = configuration.pollInterval
            outboxQuotaBytes = configuration.outboxQuotaBytes
        }

        /// How many events the next request may carry and how long it may take, with `remaining` left
        /// before the deadline (nil: none): without a deadline the batch size and the request timeout;
        /// under one, what `planner` says fits in the time left (0: not even one event), with a timeout
        /// that ends at the expiration. Also the time left.
        func plan(_ planner: UploadPlanner, remaining: Duration?) -> (
            maxEvents: Int, timeout: Duration, remaining: Duration
        ) {
            let remaining = remaining ?? .seconds(1 << 30)
            let maxEvents = planner.maxEvents(within: remaining, limit: batchSize)
            return (maxEvents, min(requestTimeout, remaining), remaining)
        }
    }

    /// What the driver saw when a turn's drain was over.
    struct Observation {
        var now: Instant
        /// Events in the outbox still to be sent.
        var pending: Int
        /// The outbox's bytes held against its quota: events waiting and dead letters.
        var heldBytes: Int
        /// A stop has been asked for.
        var stopping: Bool
        /// A flush was asked for since the last turn (the driver takes the request).
        var flushRequested: Bool
        /// When the run's background task expires, if it has one.
        var expiresAt: Instant?
        /// The loop rests beside committing producers (``LoopPacing``): no upload this turn.
        var resting = false
    }

    /// What a turn does after its drain.
    enum Action: Equatable {
        /// Send nothing this turn.
        case hold
        /// Send up to `maxEvents` events, the request bounded by `timeout`.
        case upload(maxEvents: Int, timeout: Duration)
        /// Not even one event would reach the collector before the deadline: the loop waits for it
        /// (or, `finish`, stopping, ends now).
        case tooLate(remaining: Duration, finish: Bool)
        /// Events wait and there is nowhere to send them: a stop ends here (they wait in the outbox).
        case finishWithoutURL
        /// Events wait and there is nowhere to send them: a one-shot run has nothing it could do.
        case failWithoutURL
    }

    /// How an upload's steps ended, as the upload session says after them.
    struct Answer: Equatable {
        /// Why uploads halt (401, 403, a run of refused events), while they do.
        var haltReason: String?
        /// The wait the collector asked for (its `Retry-After`), if it did.
        var waitAskedByCollector: Duration?
        /// A stop was asked for while the request was out: it was the stop's one attempt.
        var stoppedMeanwhile = false
    }

    /// What an upload's steps came to.
    enum UploadVerdict: Equatable {
        /// They delivered or dead-lettered events: the loop comes round at once.
        case progressed
        /// Nothing left, or a wait is due.
        case stalled
        /// Uploads halt in a one-shot run, which then ends in an error.
        case haltedOnce(reason: String)
    }

    /// Why a run is over.
    enum Finish: Equatable {
        /// Stopping, and nothing waits.
        case stopped
        /// Stopping after a failed upload (or a collector that refuses us, or asked us to wait): the
        /// events wait in the outbox for the next start.
        case stoppedAfterFailure
    }

    let limits: Limits
    /// The settings in force: the command line's, and the group's where it leaves them to the group.
    private(set) var settings: EffectiveSettings
    private(set) var activity: Activity = .idle
    /// Whether uploads are due (a flush trigger fired and has not been satisfied).
    private(set) var flushing: Bool
    /// Until when a flush request keeps the agent flushing.
    private(set) var flushUntil: Instant?
    /// No upload before this (a backoff, the collector's wait, a halt, the deadline).
    private(set) var notBefore: Instant?
    /// Until when the collector asked us to wait (its `Retry-After`, or the cap interval of a refusal
    /// that halts uploads): what a flush request or a stop does not cut short of `notBefore`.
    private(set) var collectorsWaitUntil: Instant?
    /// Whether the stop has been seen by the loop (it then sends what it can, once), or by a request
    /// that was out when it came (that request was the stop's attempt).
    private(set) var stopSeen = false
    private(set) var nextIntervalFlush: Instant
    /// Whether the last upload was answered (not backing off, not halted): the drain-ahead bound
    /// applies only then.
    private(set) var uploadsAnswered = true
    private(set) var planner = UploadPlanner()
    /// Events this run delivered.
    private(set) var delivered = 0
    /// Outbox rows this run delivered or dead-lettered: rows leave the outbox oldest first.
    private(set) var rowsSent = 0
    /// `--once`: once the drain has reached what the store held at the start, the rows then waiting
    /// and `rowsSent` then; the run is over when that many more rows have been sent.
    private(set) var onceMark: (waiting: Int, sentBefore: Int)?
    /// When the status file was last written.
    private(set) var lastStatusWrite: Instant
    /// Whether a turn changed what the status file says (or a checkpoint did not complete) since the
    /// status was last written: the loop then comes round to write it, within a second.
    private(set) var statusOwed = true
    /// Whether the driver is told of every change to the store (``WakeSources``): the loop then sleeps
    /// until woken while nothing is due; without, it polls the store every poll interval.
    var storeWatched = false
    /// What the last turn saw: the outbox's pending events, and whether it was at its quota.
    private(set) var seenPending = 0
    private(set) var seenOutboxFull = false

    init(limits: Limits, settings: EffectiveSettings, now: Instant) {
        self.limits = limits
        self.settings = settings
        flushing = limits.once
        nextIntervalFlush = now.advanced(by: settings.flushInterval)
        lastStatusWrite = now.advanced(by: .seconds(-10))
    }

    // MARK: Inputs

    /// Tick: the deadline, if any, has passed, and the run stops cleanly.
    func deadlineReached(at now: Instant, expiresAt: Instant?) -> Bool {
        expiresAt.map { now >= $0 } ?? false
    }

    /// Whether an upload may go at `now`: there is a collector URL, and no wait is due.
    func mayUpload(at now: Instant) -> Bool {
        settings.serverURL != nil && (notBefore.map { now >= $0 } ?? true)
    }

    /// Whether this turn's drain waits so that an upload starts at once: a full batch of `queued`
    /// events is ready and an upload may start (the drain then runs during the request). The rules as
    /// they stand before the turn updates them: a flush request it is about to read waits a turn.
    func uploadsFirst(queued: Int, at now: Instant) -> Bool {
        guard queued >= limits.batchSize, mayUpload(at: now) else { return false }
        return flushing || now >= nextIntervalFlush || queued >= settings.bulkSize
    }

    /// Whether the drain is bounded by the drain-ahead (``AgentConfiguration/drainAhead``): only while
    /// the collector answers. With no collector URL yet the store would fill as it does during an
    /// outage, so the drain goes on the same way.
    var drainAheadApplies: Bool { uploadsAnswered && settings.serverURL != nil }

    /// The turn after its drain: takes the flush triggers and the stop, and says whether to upload.
    mutating func decide(_ seen: Observation) -> Action {
        let now = seen.now
        let activityBefore = activity
        defer {
            if activity != activityBefore { statusOwed = true }
        }
        let outboxFull = seen.heldBytes >= limits.outboxQuotaBytes
        if seen.pending != seenPending || outboxFull != seenOutboxFull || seen.flushRequested || seen.stopping {
            statusOwed = true
        }
        seenPending = seen.pending
        seenOutboxFull = outboxFull
        if seen.pending > 0 && settings.serverURL == nil {
            if seen.stopping { return .finishWithoutURL }
            if limits.once { return .failWithoutURL }
        }
        if seen.flushRequested {
            flushing = true
            flushUntil = now.advanced(by: limits.backgroundBudget)
            // A flush request retries at once, as the iOS SDK does, unless the collector asked for the
            // wait: every producer entering the background sends one, and a 429's Retry-After or a 401
            // would otherwise be answered with a request per producer.
            cutOwnBackoff(at: now)
        }
        if seen.stopping && !stopSeen {
            // The stop sends what it can, once: a backoff of our own (an outage that may be over) does
            // not keep it from trying; a failure then ends it.
            stopSeen = true
            cutOwnBackoff(at: now)
        }
        // A flush request's budget that has run out ends its flush first: a trigger that fires in the
        // same turn (the flush interval ending) still flushes. The other way round, the interval's
        // flush was lost to the budget's end and waited a whole interval more (found by
        // `LoopMachineModelTests`).
        if let until = flushUntil, now >= until {
            flushUntil = nil
            if !(seen.pending >= settings.bulkSize || limits.once || seen.stopping) { flushing = false }
        }
        // An outbox at its quota drains no more, so a bulk size it cannot hold would never be reached.
        if seen.pending >= settings.bulkSize || (seen.pending > 0 && (now >= nextIntervalFlush || outboxFull))
            || seen.stopping
        {
            flushing = true
        }
        if now >= nextIntervalFlush { nextIntervalFlush = now.advanced(by: settings.flushInterval) }

        guard flushing && seen.pending > 0 && mayUpload(at: now) && !seen.resting else {
            if seen.pending > 0 && settings.serverURL == nil {
                activity = .waiting
            } else if seen.pending == 0 {
                activity = seen.stopping ? .stopping : .idle
                if flushing && !limits.once && !seen.stopping { flushing = false }
            }
            return .hold
        }
        let plan = limits.plan(planner, remaining: seen.expiresAt.map { now.duration(to: $0) })
        guard plan.maxEvents > 0 else {
            if !seen.stopping { notBefore = seen.expiresAt }
            return .tooLate(remaining: plan.remaining, finish: seen.stopping)
        }
        activity = seen.stopping ? .stopping : .uploading
        return .upload(maxEvents: plan.maxEvents, timeout: plan.timeout)
    }

    /// Upload result: the steps of one upload, each with how long it took, and how the session stood
    /// after them.
    mutating func uploaded(
        _ steps: [(step: UploadSession.Step, took: Duration)], answer: Answer, at now: Instant
    ) -> UploadVerdict {
        statusOwed = true
        if answer.stoppedMeanwhile {
            stopSeen = true
            activity = .stopping
        }
        var verdict = UploadVerdict.stalled
        for (step, took) in steps {
            switch step {
            case .empty:
                flushing = limits.once || answer.stoppedMeanwhile || stopSeen
            case .progressed(let count, let deadLettered):
                uploadsAnswered = true
                delivered += count
                rowsSent += count + deadLettered
                if count > 0 { planner.record(events: count, took: took) }
                notBefore = nil
                collectorsWaitUntil = nil
                verdict = .progressed
            case .wait(let delay):
                uploadsAnswered = false
                notBefore = now.advanced(by: delay)
                collectorsWaitUntil =
                    answer.haltReason != nil ? notBefore : answer.waitAskedByCollector.map { now.advanced(by: $0) }
                if let reason = answer.haltReason {
                    activity = .halted
                    if limits.once { return .haltedOnce(reason: reason) }
                } else {
                    activity = .backoff
                }
            }
        }
        return verdict
    }

    /// After an upload that delivered: a flush the bulk size or the interval started ends once fewer
    /// than the bulk size are left, and the rest waits for the next trigger. Going on until the
    /// outbox is found empty, which a producer appending steadily never lets happen, sent a request
    /// (and committed a drain) every few events. Stopping, one-shot runs and flush requests send
    /// everything. `waiting` is read only when it matters.
    mutating func endFlushIfBelowBulk(stopping: Bool, waiting: () throws -> Int) rethrows {
        guard !limits.once && !stopping && flushUntil == nil else { return }
        if try waiting() < settings.bulkSize { flushing = false }
    }

    /// Whether the status file (and the outbox's checkpoint) is due: a turn changed what it says, and
    /// it was last written a second ago or more. Nothing changed, nothing is written: an idle agent
    /// writes nothing to disk.
    func statusDue(at now: Instant) -> Bool { statusOwed && lastStatusWrite.duration(to: now) >= .seconds(1) }

    /// The status file was written at `now`, and the checkpoint beside it `completed` (false: a reader
    /// kept it from completing, and the loop comes round in a second to try again).
    mutating func statusWritten(at now: Instant, completed: Bool = true) {
        lastStatusWrite = now
        statusOwed = !completed
    }

    /// Something the status file says changed outside a turn's decisions (the group's settings found
    /// not valid).
    mutating func statusChanged() { statusOwed = true }

    /// Whether a stop ends the run at the end of this turn: nothing waits, or an upload failed (the
    /// collector down, refusing us, or asking us to wait). A stop does not wait to try again: with the
    /// collector down, the retries filled the whole stop timeout (80 s by default), holding every
    /// shutdown of the machine that long, and failed all the same. The events are as safe in the
    /// outbox, and the next start sends them first.
    func finish(at now: Instant, pending: Int, stopping: Bool) -> Finish? {
        guard stopping else { return nil }
        if pending == 0 { return .stopped }
        if let notBefore, notBefore > now { return .stoppedAfterFailure }
        return nil
    }

    /// `--once`: whether every event up to what the store held at the start has been drained
    /// (`drainedThrough`) and then delivered or dead-lettered.
    ///
    /// Once the drain has reached it, every row then in the outbox (`waiting`, the ones waiting when
    /// the run started too) must be sent; rows leave oldest first, so that is a count. Neither seqs
    /// (a store created anew numbers from 1 again) nor row ids (SQLite gives id 1 again once the table
    /// is empty) would do.
    mutating func sentEverything(drainedThrough: () throws -> Bool, waiting: () throws -> Int) rethrows -> Bool {
        if onceMark == nil {
            guard try drainedThrough() else { return false }
            // Rows delivered but not yet recorded so (``UploadSession/settle()``) are counted in `rowsSent`.
            onceMark = (try waiting(), rowsSent)
        }
        guard let mark = onceMark else { return false }
        return rowsSent - mark.sentBefore >= mark.waiting
    }

    /// Wait until: how long the loop may sleep before its next turn unless woken (a store change, a
    /// flush request, a stop, a delete ending), or nil: until woken. An idle loop sleeps: nothing waits
    /// in the outbox, no deadline, nothing owed to the status file. Otherwise until the first of
    ///
    /// - the flush interval's end, when events wait in the outbox;
    /// - the end of a wait (a backoff, the collector's `Retry-After`, a halt) while flushing;
    /// - the deadline;
    /// - the end of the loop's rest beside committing producers (`restUntil`, ``LoopPacing``);
    /// - a second after the last status write, while a change is owed to it;
    /// - the poll interval, where nothing would wake the loop in time: no store watch, a one-shot run
    ///   or a stop (both short), an outbox at its quota (an operator's discarding of dead letters
    ///   makes room without a signal), `mustPoll` (the driver's store delete is waiting, or the store
    ///   could not be read), or a flush that may go and did not.
    ///
    /// systemd's watchdog is no cause: the pinger counts a sleeping loop as alive
    /// (``Heartbeat/sleeping(_:)``).
    func waitTimeout(
        at now: Instant, expiresAt: Instant?, mustPoll: Bool = false, restUntil: Instant? = nil
    ) -> Duration? {
        var until: Instant?
        func wake(at instant: Instant) { until = until.map { min($0, instant) } ?? instant }
        if !storeWatched || limits.once || stopSeen || seenOutboxFull || mustPoll {
            wake(at: now.advanced(by: limits.pollInterval))
        }
        if seenPending > 0 && !flushing {
            wake(at: nextIntervalFlush)
        } else if seenPending > 0, let notBefore, notBefore > now {
            wake(at: notBefore)
        } else if seenPending > 0 && settings.serverURL != nil {
            wake(at: now.advanced(by: limits.pollInterval))
        }
        if let expiresAt { wake(at: expiresAt) }
        if let restUntil, restUntil > now { wake(at: restUntil) }
        if statusOwed { wake(at: lastStatusWrite.advanced(by: .seconds(1))) }
        return until.map { max(now.duration(to: $0), .milliseconds(1)) }
    }

    /// The group's settings changed to `effective`. Another collector, or another format: the old
    /// destination's backoff or refusal says nothing about the new one. Returns whether the
    /// destination changed.
    mutating func adopt(_ effective: EffectiveSettings, at now: Instant) -> Bool {
        let old = settings
        settings = effective
        statusOwed = true
        if effective.flushInterval != old.flushInterval {
            nextIntervalFlush = min(nextIntervalFlush, now.advanced(by: effective.flushInterval))
        }
        guard effective.serverURL != old.serverURL || effective.format != old.format else { return false }
        notBefore = nil
        collectorsWaitUntil = nil
        uploadsAnswered = true
        if activity == .halted || activity == .backoff { activity = .idle }
        return true
    }

    /// Ends a wait of the agent's own backoff now; what the collector asked for still holds.
    private mutating func cutOwnBackoff(at now: Instant) {
        notBefore = collectorsWaitUntil.flatMap { $0 > now ? $0 : nil }
    }
}
