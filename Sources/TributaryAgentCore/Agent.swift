import AsyncHTTPClient
import Foundation
import GRDB
import Logging
import ServiceLifecycle
import Synchronization
import TributaryStore

/// The sync agent: drains the group's shared store into the outbox, in order, and uploads batches to
/// the collector under the flush policies, until stopped (or, with `once`, until everything stored
/// when it started is sent).
///
/// Run it as a swift-service-lifecycle `Service` (graceful shutdown stops it cleanly after the step
/// in progress), or call ``runOnce()``.
public final class Agent: Service, Sendable {
    /// What a run did.
    public struct Report: Sendable, Equatable {
        public var drained = 0
        public var delivered = 0
        public var requests = 0
    }

    public let configuration: AgentConfiguration
    let store: SharedStore
    public let outbox: Outbox
    private let lock: AgentLock
    private let outboxLock: AgentLock
    private let logger: Logger
    private let wakeup: Wakeup
    private let flushRequested = Atomic<Bool>(false)
    private let stopping = Atomic<Bool>(false)
    /// Set by the first run: an agent releases its locks when its run ends, so it runs once.
    private let started = Atomic<Bool>(false)
    private let budget = BudgetSlot()
    private let heartbeat = Heartbeat()
    /// The events of a delivered batch whose rows are still in the outbox (the upload session's).
    private let unsettledEvents = UnsettledEvents()
    private let notifier = SystemdNotifier()
    private let metrics = AgentMetrics()
    /// The drain's store deletes, on a thread of their own: a producer stopped inside its write
    /// transaction pauses the drain instead of holding the loop.
    private let deletes: StoreDeletes

    /// When this agent was created: ``AgentConfiguration/deadline`` counts from here, so the time its
    /// creation took (opening the store, migrating the outbox) is part of the run's budget.
    private let createdAt = ContinuousClock.now

    /// Validates the configuration, opens (recovering) the store and the outbox, and claims the group.
    public init(configuration: AgentConfiguration, logger: Logger) throws {
        try configuration.validate()
        var configuration = configuration
        if let file = configuration.authTokenFile {
            configuration.upload.bearerToken = try Self.readToken(file)
        }
        self.configuration = configuration
        self.logger = logger
        let wakeup = Wakeup()
        self.wakeup = wakeup
        // A delete the drain stopped waiting for wakes the loop when it ends: draining goes on at once.
        deletes = StoreDeletes(logger: logger, onFinished: { wakeup.signal() })
        let storeFile = configuration.groupDirectory + "/" + SharedStore.fileName
        let storeExisted = access(storeFile, F_OK) == 0
        store = try SharedStore(groupDirectory: configuration.groupDirectory)
        if !storeExisted {
            // Intended when the agent starts before the app; a mistyped --group looks the same, and the
            // agent would wait on it for ever, quietly.
            logger.notice(
                "no shared store in the group directory: created an empty one, which producers will fill (check --group if events were expected here)",
                metadata: ["tributary.group": "\(store.groupDirectory)"])
        }
        lock = try AgentLock.group(store.groupDirectory)
        do {
            outboxLock = try AgentLock.outbox(configuration.outboxPath, groupDirectory: store.groupDirectory)
        } catch {
            lock.release()
            throw error
        }
        do {
            // Before READY=1: a long migration would otherwise meet systemd's start timeout, every start.
            outbox = try Outbox(path: configuration.outboxPath) { migrate in
                try SystemdNotifier().extendingStart(status: "migrating the outbox \(configuration.outboxPath)", migrate)
            }
            if let previous = try outbox.adoptStore(store.storeID) {
                logger.warning(
                    "the shared store is not the one this outbox drained before: it was created anew; draining it from its first event",
                    metadata: [
                        "tributary.group": "\(store.groupDirectory)", "tributary.store_id": "\(store.storeID)",
                        "tributary.previous_store_id": "\(previous.previousStoreID)",
                        "tributary.previous_last_drained_seq": "\(previous.lastDrainedSeq)",
                    ])
            }
        } catch {
            // An I/O error opening, migrating or recounting the outbox is fail-stop as in the loop: the
            // orderly way out (closing the outbox) would checkpoint, and fsync, the WAL that just failed.
            if FatalIO.matches(error) { FatalIO.stop(error, logger: logger) }
            outboxLock.release()
            lock.release()
            // An AgentError says itself (another program's database: a configuration error, 78).
            if error is AgentError { throw error }
            throw AgentError(.startup, "Cannot open the outbox \(configuration.outboxPath): \(error).")
        }
        do {
            try checkDrainPosition()
        } catch {
            // A store error keeps its own code (and exit code); an outbox I/O error is fail-stop; any
            // other outbox error (a full disk, the outbox busy past its timeout) is an outbox error (74),
            // not an internal one.
            if FatalIO.matches(error) { FatalIO.stop(error, logger: logger) }
            outboxLock.release()
            lock.release()
            if error is StoreError || error is AgentError { throw error }
            throw AgentError(.outboxIO, "Cannot check the drain position in the outbox \(configuration.outboxPath): \(error).")
        }
    }

    /// Checks, at the start, where the drain goes on: the outbox that drained the group last, and the
    /// store's numbering against the outbox's position (``Outbox/reconcile(lastAssignedSeq:oldestSeq:identityAt:)``).
    private func checkDrainPosition() throws {
        if let last = AgentChannel.readStatus(groupDirectory: store.groupDirectory)?.outboxPath, last != outbox.path {
            // A manual run with an outbox of its own, then the service's: what the first drained and did
            // not deliver is in its outbox, which this agent never reads.
            logger.warning(
                "the last agent to drain this group used another outbox: events it drained and did not deliver, if any, wait there; `tributary-agent --group \(store.groupDirectory) --outbox \(last) --once` sends them",
                metadata: ["tributary.group": "\(store.groupDirectory)", "tributary.other_outbox": "\(last)"])
        }
        let status = try store.status()
        let rewound = try outbox.reconcile(
            lastAssignedSeq: status.lastAssignedSeq, oldestSeq: status.oldestSeq
        ) { seq in
            try store.rawEvent(seq: seq).map(Outbox.recordIdentity)
        }
        if let rewound {
            logger.warning(
                "the shared store is an earlier copy of the one this outbox drained (restored from a backup or a snapshot?): it numbers new events with seqs drained before; draining all it holds again (events delivered before go again, and the collector drops them as duplicates)",
                metadata: [
                    "tributary.group": "\(store.groupDirectory)", "tributary.last_drained_seq": "\(rewound.before)",
                    "tributary.draining_after": "\(rewound.after)",
                ])
        }
    }

    static func readToken(_ path: String) throws -> String {
        let text: String
        do {
            text = try String(contentsOfFile: path, encoding: .utf8)
        } catch {
            // Why: missing, not this user's to read, a directory, not UTF-8.
            var info = stat()
            let reason: String
            if stat(path, &info) != 0 || access(path, R_OK) != 0 {
                reason = String(cString: strerror(errno))
            } else if info.st_mode & S_IFMT == S_IFDIR {
                reason = "it is a directory"
            } else {
                reason = "it could not be read as UTF-8 text (\(error.localizedDescription))"
            }
            throw AgentError(.configuration, "Cannot read the auth token file \(path): \(reason).")
        }
        let token = text.trimmingCharacters(in: .whitespacesAndNewlines)
        guard !token.isEmpty, !token.contains(where: \.isNewline) else {
            throw AgentError(.configuration, "The auth token file \(path) must hold one non-empty line.")
        }
        // The HTTP client refuses a header value with a control character or a non-ASCII byte on every
        // request, which looked like a transport error to retry for ever.
        guard token.utf8.allSatisfy({ (0x20...0x7E).contains($0) }) else {
            throw AgentError(
                .configuration,
                "The token in \(path) holds a control character or a non-ASCII byte, which an HTTP header cannot "
                    + "carry; a bearer token is printable ASCII.")
        }
        return token
    }

    /// Asks the running loop to flush now (the "app entered background" moment). The flush gets its
    /// own budget (``AgentConfiguration/backgroundBudget``) to upload everything it can.
    public func requestFlush() {
        flushRequested.store(true, ordering: .releasing)
        wakeup.signal()
    }

    /// Starts a clean stop: the agent keeps uploading for at most ``AgentConfiguration/stopTimeout``
    /// (less the grace period), then stops claiming work and returns. Idempotent.
    public func requestStop() {
        let started = budget.update { budget -> Bool in
            guard !stopping.load(ordering: .acquiring) else { return false }
            stopping.store(true, ordering: .releasing)
            let stop = BackgroundTask(budget: configuration.stopTimeout, grace: configuration.grace, reason: .stop)
            if budget == nil || stop.expiresAt < budget!.expiresAt { budget = stop }
            return true
        }
        if started {
            notifier.stopping(extendBy: configuration.stopTimeout + .seconds(1))
            logger.info("stop requested; finishing within the stop timeout", metadata: [
                "tributary.stop_timeout_s": "\(configuration.stopTimeout.seconds)",
            ])
        }
        wakeup.signal()
    }

    /// `Service`: runs until graceful shutdown (SIGTERM starts the stop budget), or with `once` until
    /// everything is sent or the deadline expires.
    public func run() async throws {
        _ = try await withGracefulShutdownHandler {
            try await self.runLoop(once: self.configuration.once)
        } onGracefulShutdown: {
            self.requestStop()
        }
    }

    /// Drains and uploads everything stored when it starts (within ``AgentConfiguration/deadline`` if
    /// set), then returns.
    public func runOnce() async throws -> Report {
        try await runLoop(once: true)
    }

    private func runLoop(once: Bool) async throws -> Report {
        guard !started.exchange(true, ordering: .acquiringAndReleasing) else {
            throw AgentError(
                .startup, "This Agent has run already and released its group; create a new Agent to run again.")
        }
        if once, let deadline = configuration.deadline {
            // A stop requested before the loop started (SIGTERM at once) keeps its budget if it ends sooner.
            budget.update { current in
                let run = BackgroundTask(budget: deadline, grace: configuration.grace, reason: .once, start: createdAt)
                if current == nil || run.expiresAt < current!.expiresAt { current = run }
            }
        }
        let client = HTTPClientFactory.make(readTimeout: configuration.upload.requestTimeout)
        let session = UploadSession(
            outbox: outbox, client: client, configuration: configuration.upload, logger: logger, unsettledEvents: unsettledEvents)
        session.defersAcknowledgements = true
        var loop = LoopState(clock: ContinuousClock(), settings: configuration.effective(AgentSettings()))
        loop.flushing = once
        loop.once = once
        var listener: FlushListener?
        var watchdog: Task<Void, Never>?
        let result: Result<Report, any Error>
        do {
            listener = try FlushListener(groupDirectory: store.groupDirectory) { [weak self] in self?.requestFlush() }
            applyGroupSettings(session: session, loop: &loop)
            let pending = try outbox.pending().count
            // Nothing to send needs no URL: a fetch timer's run on a device whose app has not set one yet.
            if once && loop.settings.serverURL == nil, try pending + store.status().pendingEvents > 0 {
                throw AgentError(
                    .configuration,
                    "No collector URL: give --server, or have the app set the group's server_url (`tributary config set "
                        + "--group \(store.groupDirectory) server_url=URL`)."
                        + (loop.settingsProblem.map { " The group's settings are not used: \($0)" } ?? ""))
            }
            loop.outboxDrained = try outbox.counters().drained
            heartbeat.beat()  // the migration and the opening before it are done: the loop starts now
            notifier.ready(status: "draining \(store.groupDirectory); \(pending) events in the outbox")
            logger.info("agent started", metadata: [
                "tributary.group": "\(store.groupDirectory)", "tributary.outbox": "\(outbox.path)",
                "tributary.server": "\(loop.settings.serverURL ?? "none")", "tributary.format": "\(loop.settings.format)",
                "tributary.outbox.pending": "\(pending)",
            ])
            if store.isMemoryBacked {
                logger.warning(
                    "the group directory is on tmpfs (memory): the store's fsyncs promise nothing, and every event in it is lost at the next reboot; put it on a disk",
                    metadata: ["tributary.group": "\(store.groupDirectory)"])
            }
            watchdog = startWatchdog()
            let report = try await loopBody(session: session, loop: &loop, once: once)
            // What is left before the deadline (the grace the loop kept, or less: a task's grace is at most
            // half its budget) is shared by the steps below: a fifth of it to recording the last delivered
            // batch in the outbox; 0.4 each of what remains then to the store delete and the checkpoint; then a
            // fifth of what remains to the HTTP client's shutdown.
            settle(session, patience: closingTime() * 0.2)
            let closing = closingTime()
            // A store delete still waiting (a slow fsync, a writer stopped inside its transaction) gets its
            // share to end; one that failed meanwhile ends the run as it would have in the loop.
            if !deletes.awaitPending(upTo: closing * 0.4) {
                logger.notice(
                    "stopping with a store delete still waiting for the store's write lock: the next drain deletes those events (they are in the outbox)")
            }
            try deletes.rethrowLateFailure()
            // A reader holding the WAL must not delay the stop.
            if try !outbox.checkpoint(patience: closing * 0.4) {
                logger.info("outbox checkpoint left for the next start: a reader was using the outbox")
            }
            result = .success(report)
        } catch {
            if FatalIO.matches(error) { FatalIO.stop(error, logger: logger) }
            // A run that ends in an error (a store created anew, a halt in a one-shot run) still deletes
            // what the collector acknowledged. An I/O error has stopped the process above.
            settle(session, patience: closingTime() * 0.2)
            result = .failure(Self.stopError(error, outbox: outbox.path))
        }
        // Release everything in the group directory first: nothing below may delay it.
        watchdog?.cancel()
        listener?.stop()
        // A run that ended in an error says so, with that error.
        switch result {
        case .success: writeStatus(session: session, state: "stopped", loop: loop)
        case .failure(let error):
            writeStatus(
                session: session, state: "failed", loop: loop,
                error: (error as? AgentError)?.message ?? (error as? StoreError)?.message ?? "\(error)")
        }
        outboxLock.release()
        lock.release()
        await shutdown(client, within: closingTime() * 0.2)
        let report = try result.get()
        logger.info("agent stopped", metadata: [
            "tributary.drained": "\(report.drained)", "tributary.delivered": "\(report.delivered)",
            "tributary.outbox.pending": "\((try? outbox.pending().count) ?? -1)",
        ])
        return report
    }

    /// What ends a run, as the command reports it: the outbox's SQLite errors that are not fail-stop
    /// become ``AgentError/Code/outboxIO``, with what to do about each kind.
    static func stopError(_ error: any Error, outbox path: String) -> any Error {
        guard let error = error as? DatabaseError else { return error }
        let advice: String
        switch error.resultCode {
        case .SQLITE_FULL: advice = "its disk is full: free space and start the agent again"
        case .SQLITE_BUSY, .SQLITE_LOCKED:
            advice = "another process held it locked for longer than the agent waits (a `tributary dead-letters` "
                + "run, or a tool with the file open): end it and start the agent again"
        case .SQLITE_READONLY, .SQLITE_PERM, .SQLITE_CANTOPEN:
            advice = "the agent may not write it or its directory: check their owner and permissions"
        case .SQLITE_CORRUPT, .SQLITE_NOTADB:
            advice = "it is damaged: move it aside (it holds events not yet delivered; `tributary dead-letters "
                + "--outbox` and sqlite3 can read what is left) and start the agent again"
        default: advice = "start the agent again; if this recurs, check the disk"
        }
        return AgentError(
            .outboxIO,
            "The outbox \(path) could not be written (\(error.resultCode): \(error.message ?? "no message")): \(advice). "
                + "Events not in it yet are still in the store.",
            cause: error)
    }

    /// Shuts the HTTP client down, waiting at most `limit`: a connection whose request was cancelled
    /// against a collector that never answers can hold `shutdown()` open, and the process is stopping
    /// within its grace period anyway.
    private func shutdown(_ client: HTTPClient, within limit: Duration) async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let once = ResumeOnce(continuation)
            Task {
                try? await client.shutdown()
                once.resume()
            }
            Task {
                try? await Task.sleep(for: limit)
                once.resume()
            }
        }
    }

    /// Removes the last batch delivered from the outbox's waiting rows, if it is still there
    /// (``UploadSession/settle()``): in a turn that sends nothing, and as a run ends (where it waits
    /// at most a fifth of ``closingTime()`` for another process's write lock on the outbox). A failure
    /// other than an I/O error (which stops the process at once) leaves them for a later turn, or the
    /// next start, which sends them again (the collector's dedup drops them); it ends no run.
    private func settle(_ session: UploadSession, patience: Duration?) {
        do {
            try session.settle(patience: patience)
        } catch where FatalIO.matches(error) {
            FatalIO.stop(error, logger: logger)
        } catch {
            logger.notice("could not record the last batch delivered in the outbox yet; a later turn or the next start does", metadata: [
                "tributary.error": "\(error)",
            ])
        }
    }

    /// The time the steps after the main loop share: the configured grace, or what is left before the
    /// deadline when that is less.
    private func closingTime() -> Duration {
        guard let task = budget.current else { return configuration.grace }
        return max(.zero, min(configuration.grace, task.deadline - .now))
    }

    /// Pings systemd's watchdog, but only while the main loop shows progress: its heartbeat is recent,
    /// or a request it started is still within its timeout and answer time.
    ///
    /// It looks every quarter interval for a beat within the last half: a look that finds none skips
    /// one ping, and the next look a quarter later may ping again, so a loop slow for a moment (a turn
    /// of drain commits on a slow disk) leaves a gap of at most three quarters of the interval. Looking
    /// every half interval, one skipped ping made a gap of a whole interval, which systemd may take for
    /// a hang.
    private func startWatchdog() -> Task<Void, Never>? {
        guard let interval = notifier.watchdogInterval else { return nil }
        return Task.detached { [heartbeat, notifier] in
            while !Task.isCancelled {
                if heartbeat.isAlive(within: interval / 2) { notifier.watchdog() }
                try? await Task.sleep(for: interval / 4)
            }
        }
    }

    private struct LoopState {
        let clock: ContinuousClock
        /// The settings in force: the command line's, and the group's where it leaves them to the group.
        var settings: EffectiveSettings
        /// The group's settings as last read (their JSON text; nil: none), once read.
        var settingsText: String??
        /// Why the group's settings as stored are not used, while they are not.
        var settingsProblem: String?
        var flushing = false
        var flushUntil: ContinuousClock.Instant?
        var notBefore: ContinuousClock.Instant?
        /// Until when the collector asked us to wait (its `Retry-After`, or the cap interval of a refusal
        /// that halts uploads): what a flush request or a stop does not cut short of `notBefore`.
        var collectorsWaitUntil: ContinuousClock.Instant?
        /// Whether the stop has been seen by the loop (it then sends what it can, once), or by a request
        /// that was out when it came (that request was the stop's attempt).
        var stopSeen = false

        /// Ends a wait of the agent's own backoff now; what the collector asked for still holds.
        mutating func cutOwnBackoff(now: ContinuousClock.Instant) {
            notBefore = collectorsWaitUntil.flatMap { $0 > now ? $0 : nil }
        }
        var nextIntervalFlush: ContinuousClock.Instant
        var lastStatusWrite: ContinuousClock.Instant
        var lastUploadMillis: Int64?
        var state = "idle"
        var report = Report()
        var outboxFullLogged = false
        /// Whether the drain's ``StoreError/Code/busy`` was logged since the last drain that could read.
        var storeBusyLogged = false
        /// The outbox's count of events drained into it, as last read: the drained metric grows by what
        /// a drain adds to it.
        var outboxDrained: Int64 = 0
        /// `--once`: a run that ends, rather than waits, when nothing it could do would make progress.
        var once = false
        /// Whether the last upload was answered (not backing off, not halted): the drain-ahead bound
        /// applies only then.
        var uploadsAnswered = true
        var planner = UploadPlanner()
        /// Outbox rows this run delivered or dead-lettered: rows leave the outbox oldest first.
        var rowsSent = 0
        /// `--once`: once the drain has reached what the store held at the start, the rows then waiting
        /// and `rowsSent` then; the run is over when that many more rows have been sent.
        var onceMark: (waiting: Int, sentBefore: Int)?

        /// Whether an upload may go at `now`: there is a collector URL, and no wait is due.
        func mayUpload(at now: ContinuousClock.Instant) -> Bool {
            settings.serverURL != nil && (notBefore.map { now >= $0 } ?? true)
        }

        init(clock: ContinuousClock, settings: EffectiveSettings) {
            self.clock = clock
            self.settings = settings
            nextIntervalFlush = clock.now.advanced(by: settings.flushInterval)
            lastStatusWrite = clock.now.advanced(by: .seconds(-10))
        }
    }

    private func loopBody(session: UploadSession, loop: inout LoopState, once: Bool) async throws -> Report {
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
            if !deletes.isWaiting { applyGroupSettings(session: session, loop: &loop) }
            if let stallAfter, loop.clock.now - started > .milliseconds(stallAfter) {
                // Test hook: freeze the main loop (as a deadlock would) so the watchdog stops.
                while true { usleep(1_000_000) }
            }
            let task = budget.current
            if let task, task.remaining(at: loop.clock.now) <= .zero {
                metrics.deadlineExpirations.increment()
                logger.notice("deadline reached; stopping cleanly, every unsent event stays queued", metadata: [
                    "tributary.deadline": "\(task.reason)", "tributary.outbox.pending": "\((try? outbox.pending().count) ?? -1)",
                ])
                break
            }
            let isStopping = stopping.load(ordering: .acquiring)

            // Stopping claims no new work: events still in the store are safe there for the next run (not
            // in a deleted store's file: see `rescuing` below).
            // With a full batch already waiting and an upload about to start, upload at once: the drain
            // then runs during the request. While uploads wait (a backoff, a Retry-After, a halt, no URL,
            // a bulk size not reached), the drain goes on, up to the outbox's quota.
            let queued = try waiting().count
            let batchWaiting = queued >= configuration.upload.batchSize && uploadMayStart(loop, pending: queued)
            // A store deleted or created anew: the old file's undrained events are reachable only through
            // this process's mapping, and go with it. A stop drains them first (within its deadline).
            let rescuing = try isStopping && store.isReplaced && oldStoreHoldsUndrained()
            let drained =
                rescuing
                ? try drainRespectingQuota(&loop, maxEvents: .max, whileStopping: true)
                : isStopping || batchWaiting ? 0 : try drainRespectingQuota(&loop)
            loop.report.drained += drained
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
            let now = loop.clock.now
            if pending > 0 && loop.settings.serverURL == nil {
                // Nowhere to send them: a stop does not wait for a URL (the events wait in the outbox), and
                // a one-shot run has nothing it could do.
                if isStopping {
                    logger.notice("stopping with no collector URL; the events stay in the outbox for the next start")
                    break
                }
                if once {
                    throw AgentError(
                        .configuration,
                        "No collector URL for the events this run found: give --server, or have the app set the group's "
                            + "server_url (the events stay in the outbox).")
                }
            }

            if flushRequested.exchange(false, ordering: .acquiringAndReleasing) {
                loop.flushing = true
                loop.flushUntil = now.advanced(by: configuration.backgroundBudget)
                // A flush request retries at once, as the iOS SDK does, unless the collector asked for the
                // wait: every producer entering the background sends one, and a 429's Retry-After or a
                // 401 would otherwise be answered with a request per producer.
                loop.cutOwnBackoff(now: now)
            }
            if isStopping && !loop.stopSeen {
                // The stop sends what it can, once: a backoff of our own (an outage that may be over) does
                // not keep it from trying; a failure then ends it (below).
                loop.stopSeen = true
                loop.cutOwnBackoff(now: now)
            }
            // An outbox at its quota drains no more, so a bulk size it cannot hold would never be reached.
            let outboxFull = pendingBytes + deadLetterBytes >= configuration.outboxQuotaBytes
            if pending >= loop.settings.bulkSize || (pending > 0 && (now >= loop.nextIntervalFlush || outboxFull)) || isStopping {
                loop.flushing = true
            }
            if let until = loop.flushUntil, now >= until {
                loop.flushUntil = nil
                if !(pending >= loop.settings.bulkSize || once || isStopping) { loop.flushing = false }
            }
            if now >= loop.nextIntervalFlush { loop.nextIntervalFlush = now.advanced(by: loop.settings.flushInterval) }

            // A drain that caught up with the store (its last chunk partial) is no reason to come round at
            // once: with a producer appending steadily, that is a commit (two fsyncs) every few events.
            // What arrives meanwhile is durable in the store, and the next poll drains it in one chunk.
            var progressed = drainedMore(drained)
            // With no collector URL (none given, and none in the group's settings yet) the events wait.
            let uploads = loop.flushing && pending > 0 && loop.mayUpload(at: now)
            // A delivered batch the next request's step was to record: a turn that sends no request
            // records it itself, so that the outbox's waiting rows are only what is still to be sent while
            // the loop waits. Not while stopping: the run's end does it, within its closing time.
            if !uploads && !isStopping { settle(session, patience: nil) }
            if uploads {
                let (maxEvents, timeout, remaining) = plan(loop.planner, task: task, at: now)
                if maxEvents == 0 {
                    // Not even one event would make it before the deadline: stop here.
                    logger.info("no time left for another upload before the deadline", metadata: [
                        "tributary.remaining_s": "\(remaining.seconds)",
                    ])
                    if isStopping { break }
                    loop.notBefore = task?.expiresAt
                } else {
                    loop.state = isStopping ? "stopping" : "uploading"
                    // Halted by a refusal: read the token file before each retry, so a token fixed during the
                    // wait is what the retry sends.
                    if session.haltReason != nil, let file = configuration.authTokenFile,
                        let token = try? Self.readToken(file)
                    {
                        session.updateToken(token)
                    }
                    heartbeat.requestStarted(timeout: timeout)
                    // Read before the upload task starts: it counts its requests as it sends them.
                    let requestsBefore = session.requestsSent
                    let uploaded = DoneFlag()
                    let drainOver = DoneFlag()
                    // Read before the upload task starts, which sets the session's halt and last error.
                    let tickerFields = statusFields(session: session, state: loop.state, loop: loop)
                    async let upload = uploadSteps(
                        session, maxEvents: maxEvents, timeout: timeout, planner: loop.planner, while: { !drainOver.isSet },
                        done: uploaded)
                    // While the collector works on the batch, keep draining, chunk by chunk, until it answers
                    // (and the next batches, if they follow at once, are answered too).
                    let drainedDuring = isStopping ? 0 : try drainWhile({ !uploaded.isSet }, &loop)
                    drainOver.set()
                    loop.report.drained += drainedDuring
                    // The status stays fresh (and says uploading or stopping) while the answer is awaited.
                    let statusTicker = keepStatusFresh(tickerFields, lastWrite: loop.lastStatusWrite)
                    let outcome: Result<[(step: UploadSession.Step, took: Duration)], any Error>
                    do {
                        outcome = .success(try await upload)
                    } catch {
                        outcome = .failure(error)
                    }
                    // Ended before anything else writes the status (a failure's, the stop's): the two
                    // writers share one temporary file.
                    statusTicker.cancel()
                    await statusTicker.value
                    let steps = try outcome.get()
                    // A stop asked for while this request was out: it was the stop's one attempt, and its
                    // failure ends the stop (below) instead of a backoff cut short for another.
                    if stopping.load(ordering: .acquiring) {
                        loop.stopSeen = true
                        loop.state = "stopping"
                    }
                    // Requests, not steps: a step that dead-letters the event bisection isolated sends none.
                    let requests = session.requestsSent - requestsBefore
                    loop.report.requests += requests
                    metrics.requests.increment(by: requests)
                    heartbeat.requestEnded()
                    progressed = drainedMore(drainedDuring)
                    var delivered = false
                    for (step, took) in steps {
                        progressed = try apply(step, took: took, session: session, loop: &loop, once: once) || progressed
                        if case .progressed(let count, _) = step, count > 0 { delivered = true }
                    }
                    // A flush the bulk size or the interval started ends once fewer than the bulk size are
                    // left: the rest waits for the next trigger. Going on until the outbox is found empty,
                    // which a producer appending steadily never lets happen, sent a request (and committed
                    // a drain) every few events. Stopping, one-shot runs and flush requests send everything.
                    if delivered && !once && !isStopping && loop.flushUntil == nil,
                        try waiting().count < loop.settings.bulkSize
                    {
                        loop.flushing = false
                    }
                }
            } else if pending > 0 && loop.settings.serverURL == nil {
                loop.state = "waiting"
            } else if pending == 0 {
                loop.state = isStopping ? "stopping" : "idle"
                if loop.flushing && !once && !isStopping { loop.flushing = false }
            }

            // Past the deadline, straight to the top of the loop, which stops: the periodic checkpoint
            // and status write below cost tens to hundreds of ms under load, and the stop checkpoints
            // and writes the status anyway.
            if let task = budget.current, task.remaining(at: loop.clock.now) <= .zero { continue }
            if loop.clock.now - loop.lastStatusWrite >= .seconds(1) {
                // The outbox never checkpoints by itself (SQLite would ignore a failed fsync there):
                // checkpoint here, where an I/O error reaches the fail-stop rule (FatalIO). Idle, a large
                // WAL is also cut back (a reader, `tributary status`, may keep that from completing: the
                // next second tries again).
                let truncate = pending == 0 && outbox.walFileBytes > configuration.idleWALBytes
                try outbox.checkpoint(truncate: truncate, patience: truncate ? .milliseconds(200) : nil)
                writeStatus(session: session, state: loop.state, loop: loop)
                loop.lastStatusWrite = loop.clock.now
            }
            if isStopping && pending == 0 { break }
            if isStopping, let notBefore = loop.notBefore, notBefore > loop.clock.now {
                // An upload failed (or the collector refuses us, or asked us to wait): a stop does not wait
                // to try again. With the collector down, the retries filled the whole stop timeout (80 s by
                // default), holding every shutdown of the machine that long, and failed all the same. The
                // events are as safe in the outbox, and the next start sends them first.
                logger.notice("stopping without another attempt after a failed upload; every unsent event stays queued", metadata: [
                    "tributary.outbox.pending": "\((try? outbox.pending().count) ?? -1)",
                ])
                break
            }
            if once, try sent(through: onceThrough, &loop) { break }
            if progressed { continue }
            var timeout = configuration.pollInterval
            if let notBefore = loop.notBefore, loop.flushing { timeout = min(timeout, notBefore - loop.clock.now) }
            if let task { timeout = min(timeout, task.remaining(at: loop.clock.now)) }
            // With a watchdog, the loop beats at least four times per interval even when idle.
            if let watchdog = notifier.watchdogInterval { timeout = min(timeout, watchdog / 4) }
            await wakeup.wait(timeout: max(timeout, .milliseconds(1)))
        }
        return loop.report
    }

    /// Runs upload steps (``stepCancelledAtExpiry(_:maxEvents:timeout:)``) beside the loop's drain,
    /// then sets `done`; returns each step with how long it took.
    ///
    /// After the first step, the next follows at once while the last one delivered, the batch after
    /// it was read ahead (and became the batch in flight when it was acknowledged) and `more` holds
    /// (the loop is still draining): the next request need not wait for the loop to finish its drain
    /// chunk (an LMDB and an SQLite commit) and come round. The loop's drain stops after 10 chunks, so
    /// the loop still comes round several times a second. Under a deadline, the next request goes
    /// only if `planner` (a copy of the loop's, fed with these steps) says its batch can finish in the
    /// time left, and its timeout ends at the expiration, as the loop plans its own.
    private func uploadSteps(
        _ session: UploadSession, maxEvents: Int, timeout: Duration, planner: UploadPlanner,
        while more: @Sendable () -> Bool, done: DoneFlag
    ) async throws -> [(step: UploadSession.Step, took: Duration)] {
        defer { done.set() }
        let clock = ContinuousClock()
        var planner = planner
        var steps: [(step: UploadSession.Step, took: Duration)] = []
        var timeout = timeout
        while true {
            let began = clock.now
            let step: UploadSession.Step
            do {
                step = try await stepCancelledAtExpiry(session, maxEvents: maxEvents, timeout: timeout)
            } catch where FatalIO.matches(error) {
                // At once, here: the loop's drain, beside this task, would commit its chunk meanwhile.
                FatalIO.stop(error, logger: logger)
            }
            let took = clock.now - began
            steps.append((step, took))
            guard case .progressed(let delivered, _) = step, delivered > 0, let next = session.readyBatchCount,
                more(), !Task.isCancelled
            else { return steps }
            planner.record(events: delivered, took: took)
            let planned = plan(planner, task: budget.current, at: clock.now)
            guard planned.maxEvents >= next else { return steps }
            timeout = planned.timeout
            heartbeat.requestStarted(timeout: timeout)
        }
    }

    /// How many events the next request may carry and how long it may take: without a deadline the
    /// batch size and the request timeout; under one, what `planner` says fits in the time left (0:
    /// not even one event), with a timeout that ends at the expiration. Also the time left.
    private func plan(_ planner: UploadPlanner, task: BackgroundTask?, at now: ContinuousClock.Instant)
        -> (maxEvents: Int, timeout: Duration, remaining: Duration)
    {
        let remaining = task?.remaining(at: now) ?? .seconds(1 << 30)
        let maxEvents = planner.maxEvents(within: remaining, limit: configuration.upload.batchSize)
        return (maxEvents, min(configuration.upload.requestTimeout, remaining), remaining)
    }

    /// Runs one upload step, cancelling its request if a deadline (present, or started by a SIGTERM
    /// while the request runs) expires first, or if the request's answer has not been read a second
    /// after its timeout: the HTTP client's timeout may end with the response head, and a collector
    /// that then sends its body a byte at a time would hold the upload for as long as it likes. A
    /// cancelled request's batch stays in the outbox with its id, for the next attempt.
    private func stepCancelledAtExpiry(
        _ session: UploadSession, maxEvents: Int, timeout: Duration
    ) async throws -> UploadSession.Step {
        let answerBy = ContinuousClock.now + timeout + Heartbeat.answerGrace
        return try await withThrowingTaskGroup(of: UploadSession.Step?.self) { group in
            group.addTask { try await session.step(maxEvents: maxEvents, timeout: timeout) }
            group.addTask { [budget] in
                while true {
                    try await Task.sleep(for: .milliseconds(20))
                    if let task = budget.current, task.remaining() <= .zero { return nil }
                    if ContinuousClock.now >= answerBy { return nil }
                }
            }
            var result: UploadSession.Step = .wait(.zero)
            while let next = try await group.next() {
                group.cancelAll()
                if let next {
                    result = next
                    break
                }
            }
            return result
        }
    }

    /// Applies the result of one upload step; returns whether it made progress.
    private func apply(
        _ step: UploadSession.Step, took: Duration, session: UploadSession, loop: inout LoopState, once: Bool
    ) throws -> Bool {
        switch step {
        case .empty:
            loop.flushing = once || stopping.load(ordering: .acquiring)
            return false
        case .progressed(let delivered, let deadLettered):
            loop.uploadsAnswered = true
            loop.report.delivered += delivered
            loop.rowsSent += delivered + deadLettered
            metrics.uploaded.increment(by: delivered)
            metrics.deadLetters.increment(by: deadLettered)
            if delivered > 0 {
                loop.lastUploadMillis = BootClock.wallMillis()
                loop.planner.record(events: delivered, took: took)
                metrics.batchLatency.recordNanoseconds(Int64(took.seconds * 1e9))
            }
            loop.notBefore = nil
            loop.collectorsWaitUntil = nil
            return true
        case .wait(let delay):
            loop.uploadsAnswered = false
            // As the outbox's count, which `tributary status` shows: a halt's wait is no retry of its own.
            if session.haltReason == nil { metrics.retries.increment() }
            loop.notBefore = loop.clock.now.advanced(by: delay)
            loop.collectorsWaitUntil =
                session.haltReason != nil ? loop.notBefore : session.waitAskedByCollector.map { loop.clock.now + $0 }
            if let reason = session.haltReason {
                loop.state = "halted"
                if once {
                    throw AgentError(.halted, "The collector refuses uploads (\(reason)); every event is kept.")
                }
            } else {
                loop.state = "backoff"
            }
            return false
        }
    }

    /// Drains chunk by chunk while `condition` holds (at most 10 chunks, as one loop's drain), until a
    /// chunk comes back partial (the drain caught up with the store), the outbox reaches its quota or
    /// the agent stops.
    private func drainWhile(_ condition: () -> Bool, _ loop: inout LoopState) throws -> Int {
        var drained = 0
        while condition(), drained < configuration.drainChunk * 10, mayDrain() {
            let moved = try drainRespectingQuota(&loop, maxEvents: configuration.drainChunk)
            drained += moved
            // A partial chunk caught up with the store: stop rather than commit a tiny transaction per new event.
            guard drainedMore(moved) else { break }
        }
        return drained
    }

    /// Whether a drain that moved `drained` events may have left more in the store: it ended on a full
    /// chunk (a partial chunk means it caught up).
    private func drainedMore(_ drained: Int) -> Bool {
        drained > 0 && drained % configuration.drainChunk == 0
    }

    /// Whether every event up to store sequence number `seq` has been drained and then delivered (or
    /// dead-lettered).
    ///
    /// Once the drain has reached `seq`, every row then in the outbox (the ones waiting when the run
    /// started too) must be sent; rows leave oldest first, so that is a count (``LoopState/onceMark``).
    /// Neither seqs (a store created anew numbers from 1 again) nor row ids (SQLite gives id 1 again
    /// once the table is empty) would do.
    private func sent(through seq: UInt64, _ loop: inout LoopState) throws -> Bool {
        if loop.onceMark == nil {
            guard try outbox.lastDrainedSeq() >= seq else { return false }
            // Rows delivered but not yet recorded so (``UploadSession/settle()``) are counted in `rowsSent`.
            loop.onceMark = (try waiting().count, loop.rowsSent)
        }
        guard let mark = loop.onceMark else { return false }
        return loop.rowsSent - mark.sentBefore >= mark.waiting
    }

    /// Reads the group's agent settings (``AgentSettings``, written by the main app) and applies what
    /// changed: where batches go, their format, the bulk size, the flush interval. Settings that are not
    /// valid are logged once, shown in the status, and leave what is in force.
    private func applyGroupSettings(session: UploadSession, loop: inout LoopState) {
        let text: String?
        do {
            text = try store.configurationValue(AgentSettings.configurationKey)
        } catch {
            logger.debug("could not read the group's settings", metadata: ["tributary.reason": "\(error)"])
            return
        }
        if let seen = loop.settingsText, seen == text { return }
        let first = loop.settingsText == nil
        loop.settingsText = .some(text)
        let settings: AgentSettings
        do throws(StoreError) {
            settings = try text.map { json throws(StoreError) in try AgentSettings(json: json) } ?? AgentSettings()
            loop.settingsProblem = nil
        } catch {
            loop.settingsProblem = error.message
            logger.error("the group's agent settings are not valid; the settings in force stay", metadata: [
                "tributary.reason": "\(error.message)", "tributary.group": "\(store.groupDirectory)",
            ])
            return
        }
        let effective = configuration.effective(settings)
        let old = loop.settings
        if effective.serverURL == nil && (first || old.serverURL != nil) && !loop.once {
            logger.warning(
                "no collector URL yet: events wait in the store and the outbox until --server or the group's server_url gives one")
        }
        guard effective != old else { return }
        loop.settings = effective
        if effective.serverURL != old.serverURL || effective.format != old.format {
            // Another collector, or another format: the old destination's backoff or refusal says nothing
            // about the new one.
            session.destination = (effective.serverURL, effective.format)
            loop.notBefore = nil
            loop.collectorsWaitUntil = nil
            loop.uploadsAnswered = true
            if loop.state == "halted" || loop.state == "backoff" { loop.state = "idle" }
        }
        if effective.flushInterval != old.flushInterval {
            loop.nextIntervalFlush = min(loop.nextIntervalFlush, loop.clock.now.advanced(by: effective.flushInterval))
        }
        logger.notice(first ? "using the agent settings the app set for the group" : "the app changed the group's agent settings", metadata: [
            "tributary.server": "\(effective.serverURL ?? "none")", "tributary.format": "\(effective.format)",
            "tributary.bulk_size": "\(effective.bulkSize)", "tributary.flush_interval_s": "\(effective.flushInterval.seconds)",
        ])
    }

    /// Whether the store this process has open holds an event above the outbox's `last_drained_seq`: one
    /// the drain has not moved yet (events drained but not yet deleted from it are not counted).
    private func oldStoreHoldsUndrained() throws -> Bool {
        (try store.newestSeq() ?? 0) > (try outbox.lastDrainedSeq())
    }

    /// The outbox's events still to be sent and their bytes, and its dead letters' bytes: the outbox's
    /// own counts, less a delivered batch recorded so while the next request is out
    /// (``UploadSession/settle()``). Its bytes stay counted until then, against the quota as all that
    /// waits. `unsettled`: that batch's events as the caller read them (default: read now).
    private func waiting(unsettled: Int? = nil) throws -> (count: Int, bytes: Int, deadLetterBytes: Int) {
        let pending = try outbox.pending()
        // Not below 0: that batch's rows may have gone by another hand (the outbox edited).
        let count = max(0, pending.count - (unsettled ?? unsettledEvents.value))
        return (count, pending.bytes, pending.deadLetterBytes)
    }

    /// Whether the drain may take another chunk: not once a stop is requested (the events are safe in
    /// the store for the next run; `whileStopping`: but not in a deleted store's file) nor past the deadline.
    private func mayDrain(whileStopping: Bool = false) -> Bool {
        (whileStopping || !stopping.load(ordering: .acquiring)) && (budget.current.map { $0.remaining() > .zero } ?? true)
    }

    /// Drains what the store holds, unless the outbox is at its quota, or (while the collector answers)
    /// holds ``AgentConfiguration/drainAhead`` events. Stops between chunks when a stop is requested,
    /// the deadline passes or the outbox reaches its quota. `whileStopping`: a deleted store's last
    /// events, drained during a stop, up to the quota and the deadline only.
    private func drainRespectingQuota(_ loop: inout LoopState, maxEvents: Int? = nil, whileStopping: Bool = false) throws -> Int {
        let (count, bytes, deadBytes) = try waiting()
        let ahead = max(configuration.effectiveDrainAhead, loop.settings.bulkSize)
        // The bound keeps the outbox small while uploads flow; with none (no collector URL yet) the store
        // would fill as it does during an outage, so the drain goes on the same way.
        let bounded = !whileStopping && loop.uploadsAnswered && loop.settings.serverURL != nil
        if bounded && count >= ahead { return 0 }
        if bytes + deadBytes >= configuration.outboxQuotaBytes {
            // Dead letters alone fill the quota: no upload can make room, and a --once run would wait
            // for ever. It ends here, saying what to do; a daemon waits (an operator may act).
            if count == 0 && loop.once {
                throw AgentError(
                    .outboxFull,
                    "The outbox's dead letters (\(deadBytes) bytes) fill its quota (\(configuration.outboxQuotaBytes) "
                        + "bytes): nothing more can be drained. `tributary dead-letters` lists them, --replay sends them "
                        + "again (once the collector accepts them), --discard deletes them. The events not drained wait "
                        + "in the store.")
            }
            if !loop.outboxFullLogged {
                logger.warning(
                    "outbox at its quota; draining paused until uploads make room (dead letters count too: see `tributary dead-letters`, which can replay or discard them)",
                    metadata: [
                        "tributary.outbox.bytes": "\(bytes)", "tributary.outbox.dead_letter_bytes": "\(deadBytes)",
                        "tributary.outbox.quota": "\(configuration.outboxQuotaBytes)",
                    ])
                loop.outboxFullLogged = true
            }
            return 0
        }
        loop.outboxFullLogged = false
        let drainer = Drainer(
            store: store, outbox: outbox, chunkSize: configuration.drainChunk, logger: logger, deletes: deletes)
        var limit = maxEvents ?? configuration.drainChunk * 10
        if bounded { limit = min(limit, ahead - count) }
        // The quota is checked again before every chunk: the outbox goes past it by one chunk at most.
        let quota = configuration.outboxQuotaBytes
        let drained: Int
        do {
            drained = try drainer.drainAvailable(maxEvents: limit) {
                guard self.mayDrain(whileStopping: whileStopping) else { return false }
                self.heartbeat.beat()  // each chunk committed is progress
                guard let held = try? self.outbox.pending() else { return true }
                return held.bytes + held.deadLetterBytes < quota
            }
            loop.storeBusyLogged = false
        } catch let error as StoreError where error.code == .busy {
            // A producer holds the store's writer lock (stopped, or slow) while this process's delete waits
            // for it: the drain waits too, the loop goes on uploading and keeping its deadlines.
            if !loop.storeBusyLogged {
                logger.notice("drain paused: the store cannot be read until the store delete ends", metadata: [
                    "tributary.group": "\(store.groupDirectory)", "tributary.reason": "\(error.message)",
                ])
                loop.storeBusyLogged = true
            }
            return 0
        }
        // The events new to the outbox: not the records skipped as drained already (a drain stopped
        // between its outbox commit and its store delete), nor corrupt ones (counted as dead letters).
        if drained > 0 {
            let total = try outbox.counters().drained
            metrics.drained.increment(by: Int(total - loop.outboxDrained))
            loop.outboxDrained = total
        }
        return drained
    }

    /// Whether this turn of the loop may start an upload of the `pending` events the outbox holds: there
    /// is a collector URL, no wait is due, and a flush is under way or due (``loopBody``'s rules, as they
    /// stand before the turn updates them: a flush request it is about to read waits for the next turn).
    private func uploadMayStart(_ loop: LoopState, pending: Int) -> Bool {
        let now = loop.clock.now
        guard loop.mayUpload(at: now) else { return false }
        return loop.flushing || now >= loop.nextIntervalFlush || pending >= loop.settings.bulkSize
    }

    /// What the status file says besides the outbox's figures, as the loop knows it now.
    private struct StatusFields: Sendable {
        var state: String
        var haltReason: String?
        var lastError: String?
        var lastUploadMillis: Int64?
        var serverURL: String?
        var settingsProblem: String?
    }

    /// What the loop knows for the status file now; `error`, when the run ended in one, is its last error.
    private func statusFields(session: UploadSession, state: String, loop: LoopState, error: String? = nil) -> StatusFields {
        StatusFields(
            state: state, haltReason: session.haltReason, lastError: error ?? session.lastError,
            lastUploadMillis: loop.lastUploadMillis, serverURL: loop.settings.serverURL,
            settingsProblem: loop.settingsProblem)
    }

    /// Writes the agent's status file; `error`, when the run ended in one, is its last error.
    private func writeStatus(session: UploadSession, state: String, loop: LoopState, error: String? = nil) {
        writeStatus(statusFields(session: session, state: state, loop: loop, error: error))
    }

    /// Rewrites the status file once a second (the first time a second after `lastWrite`) until
    /// cancelled, with `fields` (read before the request started: the upload task changes the
    /// session's; `stopping` once a stop is asked for) and the outbox's figures as they are then:
    /// while the loop awaits a request, which only its timeout bounds. Cancelled, it returns at once.
    private func keepStatusFresh(_ fields: StatusFields, lastWrite: ContinuousClock.Instant) -> Task<Void, Never> {
        let first = lastWrite.advanced(by: .seconds(1))
        return Task { [self] in
            var next = first
            var fields = fields
            while (try? await Task.sleep(until: next, clock: .continuous)) != nil {
                // A stop asked for meanwhile waits for this answer (within its deadline): say so.
                if stopping.load(ordering: .acquiring) { fields.state = "stopping" }
                writeStatus(fields)
                next = max(next.advanced(by: .seconds(1)), .now)
            }
        }
    }

    private func writeStatus(_ fields: StatusFields) {
        let state = fields.state
        do {
            // A delivered batch not yet recorded so counts as delivered, not as pending.
            let unsettled = unsettledEvents.value
            let counters = try outbox.counters()
            let pending = try waiting(unsettled: unsettled)
            var status = AgentStatus(
                pid: getpid(), state: state, haltReason: fields.haltReason, lastError: fields.lastError,
                outboxPath: outbox.path, outboxPending: pending.count,
                delivered: counters.delivered + Int64(unsettled), deadLetters: counters.deadLetters,
                batches: counters.batches + (unsettled > 0 ? 1 : 0), retries: counters.retries,
                corruptRecords: counters.corruptRecords, lastUploadMillis: fields.lastUploadMillis,
                updatedMillis: BootClock.wallMillis())
            status.outboxBytes = pending.bytes
            status.deadLetterBytes = pending.deadLetterBytes
            status.outboxQuota = configuration.outboxQuotaBytes
            status.serverURL = fields.serverURL
            status.settingsProblem = fields.settingsProblem
            try status.write(groupDirectory: store.groupDirectory)
            var line = "\(state): \(status.outboxPending) events queued, \(status.delivered) delivered"
            if status.deadLetters > 0 { line += ", \(status.deadLetters) dead letters" }
            if let halt = status.haltReason { line += "; halted: \(halt)" }
            notifier.status(line)
        } catch {
            logger.warning("could not write the status file", metadata: ["tributary.reason": "\(error)"])
        }
    }
}

/// The main loop's pulse, read by the watchdog pinger.
final class Heartbeat: Sendable {
    private let lastBeat = Atomic<UInt64>(BootClock.nowNanos())
    private let requestDeadline = Atomic<UInt64>(0)

    func beat() { lastBeat.store(BootClock.nowNanos(), ordering: .releasing) }

    /// How long after its timeout a request's answer may still be read before the step cancels it.
    static let answerGrace: Duration = .seconds(1)

    /// A request with `timeout` is out: the loop counts as alive until the step ends it, at most
    /// ``answerGrace`` after the timeout, and applies its outcome (a second more for that: a synced
    /// outbox write on a loaded machine). A watchdog ping that found it dead in between would leave a
    /// gap of a whole watchdog interval.
    func requestStarted(timeout: Duration, at now: UInt64 = BootClock.nowNanos()) {
        let until = max(.zero, timeout) + Self.answerGrace + .seconds(1)
        requestDeadline.store(now + UInt64(until.seconds * 1e9), ordering: .releasing)
    }

    func requestEnded() {
        requestDeadline.store(0, ordering: .releasing)
        beat()
    }

    /// The loop beat within `window` before `now` (boot-clock nanoseconds), or is awaiting a request that
    /// has not yet timed out.
    func isAlive(within window: Duration, at now: UInt64 = BootClock.nowNanos()) -> Bool {
        let beat = lastBeat.load(ordering: .acquiring)
        return now - min(now, beat) <= UInt64(window.seconds * 1e9) || now < requestDeadline.load(ordering: .acquiring)
    }
}

/// Set once when some work has finished, for the work running beside it: the upload steps (the drain
/// stops after its chunk) and the drain (the upload steps stop after the request in flight).
final class DoneFlag: Sendable {
    private let done = Atomic<Bool>(false)
    var isSet: Bool { done.load(ordering: .acquiring) }
    func set() { done.store(true, ordering: .releasing) }
}

/// The agent's current background task, shared by the loop, the stop handler and the request watcher.
final class BudgetSlot: Sendable {
    private let slot = Mutex<BackgroundTask?>(nil)
    var current: BackgroundTask? { slot.withLock { $0 } }
    func update<R>(_ body: (inout BackgroundTask?) -> R) -> R { slot.withLock { body(&$0) } }
}

/// Resumes a continuation the first time ``resume()`` is called; later calls do nothing.
final class ResumeOnce: Sendable {
    private let continuation: Mutex<CheckedContinuation<Void, Never>?>
    init(_ continuation: CheckedContinuation<Void, Never>) { self.continuation = Mutex(continuation) }
    func resume() { continuation.withLock { c in defer { c = nil }; return c }?.resume() }
}
