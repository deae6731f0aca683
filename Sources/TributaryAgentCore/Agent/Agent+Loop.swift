import AsyncHTTPClient
import Foundation
import Logging
import TributaryStore

/// One run of the agent's loop: its decisions (``LoopMachine``) and what the driver keeps beside them
/// for its logs, metrics and status file.
struct LoopRun {
    let clock: any AgentClock
    var machine: LoopMachine<ContinuousClock>
    /// The group's settings as last read (their JSON text; nil: none), once read.
    var settingsText: String??
    /// Why the group's settings as stored are not used, while they are not.
    var settingsProblem: String?
    var lastUploadMillis: Int64?
    var drained = 0
    var requests = 0
    /// What the drain keeps between its chunks; the drain beside an upload works on a copy and hands
    /// it back.
    var drain = DrainBookkeeping()
    /// When the loop rests beside committing producers.
    var pacing: LoopPacing

    struct DrainBookkeeping {
        var outboxFullLogged = false
        /// Whether the drain's ``StoreError/Code/busy`` was logged since the last drain that could read.
        var storeBusyLogged = false
        /// The outbox's count of events drained into it, as last read: the drained metric grows by what
        /// a drain adds to it.
        var outboxDrained: Int64 = 0
        /// How long this turn's drains (the one beside an upload too) and its checkpoint took: the
        /// local disk work a rest beside committing producers follows (``LoopPacing``).
        var busy: Duration = .zero
    }

    init(
        limits: LoopMachine<ContinuousClock>.Limits, settings: EffectiveSettings, clock: any AgentClock,
        drainShare: Double, drainChunk: Int
    ) {
        self.clock = clock
        pacing = LoopPacing(share: drainShare, chunk: drainChunk)
        machine = LoopMachine(limits: limits, settings: settings, now: clock.now)
    }

    var report: Agent.Report { Agent.Report(drained: drained, delivered: machine.delivered, requests: requests) }
}

extension Agent {
    /// The loop's driver: runs the turns ``LoopMachine`` decides, doing their I/O (the drain, the
    /// upload steps, the status file, the checkpoint), until the machine or an error ends the run.
    func loopBody(session: UploadSession, loop: inout LoopRun) async throws -> Report {
        let once = loop.machine.limits.once
        let stallAfter = ProcessInfo.processInfo.environment["TRIBUTARY_TEST_STALL_AFTER_MS"].flatMap(Int.init)
        // A one-shot run sends what is stored when it starts; what producers append meanwhile goes along
        // as the drain meets it, but is not waited for (with a producer appending steadily, the store
        // is never found empty).
        let onceThrough = once ? try store.newestSeq() ?? 0 : 0
        let started = loop.clock.now
        while !Task.isCancelled {
            heartbeat.beat()
            // Not while a store delete waits for the writer lock: a read that had to adopt a map another
            // process grew would wait for that delete (up to ``StoreError/Code/busy``'s bound, every turn).
            if !deletes.isWaiting && settingsMayHaveChanged(loop) { applyGroupSettings(session: session, loop: &loop) }
            if let stallAfter, loop.clock.now - started > .milliseconds(stallAfter) {
                // Test hook: freeze the main loop (as a deadlock would) so the watchdog stops.
                while true { usleep(1_000_000) }
            }
            let task = budget.current
            if loop.machine.deadlineReached(at: loop.clock.now, expiresAt: task?.expiresAt), let task {
                metrics.deadlineExpirations.increment()
                logger.notice("deadline reached; stopping cleanly, every unsent event stays queued", metadata: [
                    "tributary.deadline": "\(task.reason)", "tributary.outbox.pending": "\((try? outbox.pending().count) ?? -1)",
                ])
                break
            }
            let isStopping = self.isStopping
            // Beside committing producers the loop rests between turns that work (``LoopPacing``); a stop
            // does not.
            let resting = !isStopping && !loop.pacing.mayWork(at: loop.clock.now)

            // Stopping claims no new work: events still in the store are safe there for the next run (not
            // in a deleted store's file: see `rescuing` below).
            // With a full batch already waiting and an upload about to start, upload at once: the drain
            // then runs during the request. While uploads wait (a backoff, a Retry-After, a halt, no URL,
            // a bulk size not reached), the drain goes on, up to the outbox's quota.
            let batchWaiting = loop.machine.uploadsFirst(queued: try waiting().count, at: loop.clock.now)
            // A store deleted or created anew: the old file's undrained events are reachable only through
            // this process's mapping, and go with it. A stop drains them first (within its deadline).
            let rescuing = try isStopping && store.isReplaced && oldStoreHoldsUndrained()
            let drained =
                rescuing
                ? try drainRespectingQuota(&loop, maxEvents: .max, whileStopping: true)
                : isStopping || batchWaiting || resting ? 0 : try drainRespectingQuota(&loop)
            loop.drained += drained
            if drained == 0, !isStopping, store.isReplaced, try !oldStoreHoldsUndrained() {
                // The producers now write a file this process does not have open: nothing more would
                // ever be drained. A new start opens the new store (``Outbox/adoptStore(_:)``). Not before
                // the old file is drained (a drain skipped this turn, or held by the drain-ahead bound, is
                // no empty store): its events are reachable only through this process's mapping.
                throw AgentError(
                    .storeReplaced,
                    "The shared store in \(store.groupDirectory) was deleted or created anew while the agent ran; "
                        + "stopping so that the next start drains the new one (events already in the outbox stay "
                        + "and go first).")
            }
            let (pending, pendingBytes, deadLetterBytes) = try waiting()
            metrics.backlog.record(pending)
            // A drain that caught up with the store (its last chunk partial) is no reason to come round at
            // once: with a producer appending steadily, that is a commit (two fsyncs) every few events.
            // What arrives meanwhile is durable in the store, and the next poll drains it in one chunk.
            var progressed = drainedMore(drained)
            let action = loop.machine.decide(
                .init(
                    now: loop.clock.now, pending: pending, heldBytes: pendingBytes + deadLetterBytes,
                    stopping: isStopping, flushRequested: takeFlushRequest(),
                    expiresAt: task?.expiresAt, resting: resting))
            switch action {
            case .finishWithoutURL:
                // Nowhere to send them: a stop does not wait for a URL (the events wait in the outbox).
                logger.notice("stopping with no collector URL; the events stay in the outbox for the next start")
                return loop.report
            case .failWithoutURL:
                throw AgentError(
                    .configuration,
                    "No collector URL for the events this run found: give --server, or have the app set the group's "
                        + "server_url (the events stay in the outbox).")
            case .hold:
                // A delivered batch the next request's step was to record: a turn that sends no request
                // records it itself, so that the outbox's waiting rows are only what is still to be sent
                // while the loop waits. Not while stopping: the run's end does it, within its closing time.
                if !isStopping { try settle(session, patience: nil) }
            case .tooLate(let remaining, let finish):
                // Not even one event would make it before the deadline: stop here.
                logger.info("no time left for another upload before the deadline", metadata: [
                    "tributary.remaining_s": "\(remaining.seconds)",
                ])
                if finish { return loop.report }
            case .upload(let maxEvents, let timeout):
                let uploaded = try await upload(
                    session: session, maxEvents: maxEvents, timeout: timeout, stopping: isStopping, loop: &loop)
                progressed = uploaded || progressed
            }
            // Past the deadline, straight to the top of the loop, which stops: the periodic checkpoint
            // and status write below cost tens to hundreds of ms under load, and the stop checkpoints
            // and writes the status anyway.
            if loop.machine.deadlineReached(at: loop.clock.now, expiresAt: budget.current?.expiresAt) { continue }
            if loop.machine.statusDue(at: loop.clock.now) {
                // The outbox never checkpoints by itself (SQLite would ignore a failed fsync there):
                // checkpoint here, where an I/O error reaches the fail-stop rule (FatalIO). Idle, a large
                // WAL is also cut back (a reader, `tributary status`, may keep that from completing: the
                // next second tries again).
                let truncate = pending == 0 && outbox.walFileBytes > configuration.idleWALBytes
                let checkpointBegan = loop.clock.now
                let completed = try outbox.checkpoint(truncate: truncate, patience: truncate ? .milliseconds(200) : nil)
                loop.drain.busy += checkpointBegan.duration(to: loop.clock.now)
                writeStatus(session: session, state: loop.machine.activity.rawValue, loop: loop)
                loop.machine.statusWritten(at: loop.clock.now, completed: completed || !truncate)
            }
            pace(&loop)
            switch loop.machine.finish(at: loop.clock.now, pending: pending, stopping: isStopping) {
            case .stopped: return loop.report
            case .stoppedAfterFailure:
                logger.notice("stopping without another attempt after a failed upload; every unsent event stays queued", metadata: [
                    "tributary.outbox.pending": "\((try? outbox.pending().count) ?? -1)",
                ])
                return loop.report
            case nil: break
            }
            if once,
                try loop.machine.sentEverything(
                    drainedThrough: { try outbox.lastDrainedSeq() >= onceThrough }, waiting: { try waiting().count })
            {
                break
            }
            if progressed { continue }
            var timeout = loop.machine.waitTimeout(
                at: loop.clock.now, expiresAt: budget.current?.expiresAt,
                mustPoll: deletes.isWaiting || loop.drain.storeBusyLogged, restUntil: loop.pacing.restUntil)
            // The test hook's freeze comes at its time, whether or not anything wakes the loop then.
            if let stallAfter { timeout = min(timeout ?? .seconds(1), started + .milliseconds(stallAfter) - loop.clock.now) }
            let until = timeout.map { loop.clock.now + $0 }
            parking.parked(until: until)
            await heartbeat.sleeping { await wakeup.wait(until: until) }
        }
        return loop.report
    }

    /// A new run of the loop with `limits`. A one-shot run (a timer's background fetch) uses its budget
    /// and never rests; a run that paces takes its first look at the store's newest seq here, before
    /// its first turn, so that producers already committing as the agent starts are seen after its
    /// first chunk, not after a first turn of ten (``LoopPacing``).
    func newLoopRun(limits: LoopMachine<ContinuousClock>.Limits) -> LoopRun {
        var loop = LoopRun(
            limits: limits, settings: configuration.effective(AgentSettings()), clock: configuration.clock,
            drainShare: limits.once ? 1 : configuration.drainShare, drainChunk: configuration.drainChunk)
        pace(&loop)
        return loop
    }

    /// Ends a turn for ``LoopPacing``: its drains' and checkpoint's time (`busy`, then cleared) sets
    /// the rest that follows it while producers commit.
    private func pace(_ loop: inout LoopRun) {
        let busy = loop.drain.busy
        loop.drain.busy = .zero
        guard loop.pacing.paces else { return }
        let restBefore = loop.pacing.restUntil
        let now = loop.clock.now
        loop.pacing.turnEnded(worked: busy > .zero ? busy : nil, newest: try? store.newestSeq(), at: now)
        if let rest = loop.pacing.restUntil, rest != restBefore {
            logger.trace("resting beside committing producers", metadata: [
                "tributary.busy_ms": "\(busy.seconds * 1000)", "tributary.rest_ms": "\(now.duration(to: rest).seconds * 1000)",
            ])
        }
    }

    /// Runs the upload the machine decided on (``uploadSteps``), draining beside it while the collector
    /// works, and hands the machine the outcome; returns whether the upload made progress.
    private func upload(
        session: UploadSession, maxEvents: Int, timeout: Duration, stopping isStopping: Bool, loop: inout LoopRun
    ) async throws -> Bool {
        // Halted by a refusal: read the token file before each retry, so a token fixed during the wait is
        // what the retry sends.
        if session.haltReason != nil, let file = configuration.authTokenFile, let token = try? Self.readToken(file) {
            session.updateToken(token)
        }
        heartbeat.requestStarted(timeout: timeout)
        // Read before the upload task starts: it counts its requests as it sends them.
        let requestsBefore = session.requestsSent
        let uploaded = DoneFlag()
        let drainOver = DoneFlag()
        // Read before the upload task starts, which sets the session's halt and last error.
        let tickerFields = statusFields(session: session, state: loop.machine.activity.rawValue, loop: loop)
        // While the collector works on the batch, a child task keeps draining, chunk by chunk, until it
        // answers (and the next batches, if they follow at once, are answered too). The upload stays in
        // this task, which owns the session.
        let (run, planner, limits) = (loop, loop.machine.planner, loop.machine.limits)
        let lastWrite = loop.machine.lastStatusWrite
        let (outcome, drained) = await withTaskGroup(of: Void.self) { group in
            // The status stays fresh (and says uploading or stopping) while the answer is awaited. The
            // ticker ends with this group, before anything else writes the status (a failure's, the
            // stop's): the two writers share one temporary file.
            group.addTask { await self.keepStatusFresh(tickerFields, lastWrite: lastWrite) }
            async let drainedBeside = drainBeside(run, stopping: isStopping, until: uploaded, over: drainOver)
            let outcome: Result<[(step: UploadSession.Step, took: Duration)], any Error>
            do {
                outcome = .success(
                    try await uploadSteps(
                        session, maxEvents: maxEvents, timeout: timeout, planner: planner, limits: limits,
                        while: { !drainOver.isSet }, done: uploaded))
            } catch {
                outcome = .failure(error)
            }
            let drained: Result<(drained: Int, run: LoopRun), any Error>
            do {
                drained = .success(try await drainedBeside)
            } catch {
                drained = .failure(error)
            }
            group.cancelAll()
            return (outcome, drained)
        }
        let drain = try drained.get()
        loop.drain = drain.run.drain
        loop.drained += drain.drained
        let drainedDuring = drain.drained
        let steps = try outcome.get()
        // Requests, not steps: a step that dead-letters the event bisection isolated sends none.
        let requests = session.requestsSent - requestsBefore
        loop.requests += requests
        metrics.requests.increment(by: requests)
        metrics.halted.record(session.haltReason == nil ? 0 : 1)
        heartbeat.requestEnded()
        record(steps, session: session, loop: &loop)
        // A stop asked for while this request was out: it was the stop's one attempt, and its failure ends
        // the stop instead of a backoff cut short for another.
        let answer = LoopMachine<ContinuousClock>.Answer(
            haltReason: session.haltReason, waitAskedByCollector: session.waitAskedByCollector,
            stoppedMeanwhile: self.isStopping)
        switch loop.machine.uploaded(steps, answer: answer, at: loop.clock.now) {
        case .haltedOnce(let reason):
            throw AgentError(.halted, "The collector refuses uploads (\(reason)); every event is kept.")
        case .stalled:
            return drainedMore(drainedDuring)
        case .progressed:
            if steps.contains(where: { if case .progressed(let count, _) = $0.step { count > 0 } else { false } }) {
                try loop.machine.endFlushIfBelowBulk(stopping: isStopping) { try waiting().count }
            }
            return true
        }
    }

    /// The drain beside an upload (``drainWhile(_:_:)`` until `uploaded` is set; none while stopping),
    /// on a copy of the run's drain bookkeeping, which it returns with the events it moved. Sets `over`
    /// when it ends, so that the upload steps stop following each other at once.
    private func drainBeside(
        _ run: LoopRun, stopping: Bool, until uploaded: DoneFlag, over: DoneFlag
    ) throws -> (drained: Int, run: LoopRun) {
        defer { over.set() }
        guard !stopping else { return (0, run) }
        var run = run
        do {
            return (try drainWhile({ !uploaded.isSet }, &run), run)
        } catch where FatalIO.matches(error) {
            // At once, here: the upload beside this drain must not commit to the outbox any more.
            throw outbox.fatalIO.trip(error, keeping: outbox)
        }
    }

    /// The metrics and the last upload's time for an upload's steps.
    private func record(_ steps: [(step: UploadSession.Step, took: Duration)], session: UploadSession, loop: inout LoopRun) {
        for (step, took) in steps {
            switch step {
            case .empty: break
            case .progressed(let delivered, let deadLettered):
                metrics.uploaded.increment(by: delivered)
                metrics.deadLetters.increment(by: deadLettered)
                guard delivered > 0 else { continue }
                loop.lastUploadMillis = BootClock.wallMillis()
                metrics.batchLatency.recordNanoseconds(Int64(took.seconds * 1e9))
            case .wait:
                // As the outbox's count, which `tributary status` shows: a halt's wait is no retry of its own.
                if session.haltReason == nil { metrics.retries.increment() }
            }
        }
    }

    /// Runs upload steps (``stepCancelledAtExpiry(_:maxEvents:timeout:)``) while the drain goes on
    /// beside them (``drainBeside(_:stopping:until:over:)``), then sets `done`; returns each step with
    /// how long it took.
    ///
    /// After the first step, the next follows at once while the last one delivered, the batch after
    /// it was read ahead (and became the batch in flight when it was acknowledged) and `more` holds
    /// (the drain beside is still going): the next request need not wait for the drain to finish its
    /// chunk (an LMDB and an SQLite commit) and the loop to come round. The drain stops after 10
    /// chunks, so the loop still comes round several times a second. Under a deadline, the next
    /// request goes only if `planner` (a copy of the loop's, fed with these steps) and `limits` say its
    /// batch can finish in the time left, and its timeout ends at the expiration, as the loop plans
    /// its own.
    func uploadSteps(
        _ session: UploadSession, maxEvents: Int, timeout: Duration, planner: UploadPlanner,
        limits: LoopMachine<ContinuousClock>.Limits, while more: @Sendable () -> Bool, done: DoneFlag
    ) async throws -> [(step: UploadSession.Step, took: Duration)] {
        defer { done.set() }
        let clock = configuration.clock
        var planner = planner
        var steps: [(step: UploadSession.Step, took: Duration)] = []
        var timeout = timeout
        while true {
            let began = clock.now
            let step: UploadSession.Step
            do {
                step = try await stepCancelledAtExpiry(session, maxEvents: maxEvents, timeout: timeout)
            } catch where FatalIO.matches(error) {
                // At once, here: the loop's drain, beside this task, must not commit its chunk any more.
                throw outbox.fatalIO.trip(error, keeping: outbox)
            }
            let took = clock.now - began
            steps.append((step, took))
            guard case .progressed(let delivered, _) = step, delivered > 0, let next = session.readyBatchCount,
                more(), !Task.isCancelled
            else { return steps }
            planner.record(events: delivered, took: took)
            let planned = limits.plan(planner, remaining: budget.current?.remaining(at: clock.now))
            guard planned.maxEvents >= next else { return steps }
            timeout = planned.timeout
            heartbeat.requestStarted(timeout: timeout)
        }
    }

    /// Runs one upload step, cancelling its request if a deadline (present, or started by a SIGTERM
    /// while the request runs) expires first, or if the request's answer has not been read a second
    /// after its timeout: the HTTP client's timeout may end with the response head, and a collector
    /// that then sends its body a byte at a time would hold the upload for as long as it likes. A
    /// cancelled request's batch stays in the outbox with its id, for the next attempt.
    func stepCancelledAtExpiry(
        _ session: UploadSession, maxEvents: Int, timeout: Duration
    ) async throws -> UploadSession.Step {
        let answerBy = configuration.clock.now + timeout + Heartbeat.answerGrace
        return try await session.step(maxEvents: maxEvents, timeout: timeout) { [budget] in
            _ = await budget.waitForExpiry(orUntil: answerBy)
        }
    }
}
