import AsyncHTTPClient
import Foundation
import Logging
import GRDB
import NIOCore
import NIOPosix
import Synchronization
import TributaryStore

extension Agent {
    /// The run, on the agent's own threads (``IOExecutor``): its SQLite and LMDB calls block them, not
    /// Swift's cooperative pool.
    func runLoop(once: Bool) async throws -> Report {
        try await withTaskExecutorPreference(IOExecutor.shared) { try await run(once: once) }
    }

    private func run(once: Bool) async throws -> Report {
        guard markStarted() else {
            throw AgentError(
                .startup, "This Agent has run already and released its group; create a new Agent to run again.")
        }
        defer { parking.ended() }
        if once, let deadline = configuration.deadline {
            // A stop requested before the loop started (SIGTERM at once) keeps its budget if it ends sooner.
            budget.update { current in
                let run = BackgroundTask(budget: deadline, grace: configuration.grace, reason: .once, start: createdAt)
                if current == nil || run.expiresAt < current!.expiresAt { current = run }
            }
        }
        let clients = HTTPClients(configuration.upload)
        let session = UploadSession(
            outbox: outbox, clients: clients, configuration: configuration.upload, logger: logger, unsettledEvents: unsettledEvents,
            clock: configuration.clock)
        session.defersAcknowledgements = true
        var limits = LoopMachine<ContinuousClock>.Limits(configuration)
        limits.once = once
        var loop = newLoopRun(limits: limits)
        var listener: WakeSources?
        // The watchdog's pinger is a child task of the run: it pings from the start of the loop until the
        // run's closing steps are over.
        let result = await withTaskGroup(of: Void.self) { group -> Result<Report, any Error> in
            defer { group.cancelAll() }
            do {
                listener = try WakeSources(
                    groupDirectory: store.groupDirectory, coalesce: configuration.pollInterval,
                    onFlush: { [weak self] in self?.requestFlush() }, onStoreChange: { [weak self] in self?.storeChanged() })
                loop.machine.storeWatched = listener?.watchesStore ?? false
                applyGroupSettings(session: session, loop: &loop)
                let pending = try outbox.pending().count
                // Nothing to send needs no URL: a fetch timer's run on a device whose app has not set one yet.
                if once && loop.machine.settings.serverURL == nil, try pending + store.status().pendingEvents > 0 {
                    throw AgentError(
                        .configuration,
                        "No collector URL: give --server, or have the app set the group's server_url (`tributary config set "
                            + "--group \(store.groupDirectory) server_url=URL`)."
                            + (loop.settingsProblem.map { " The group's settings are not used: \($0)" } ?? ""))
                }
                loop.drain.outboxDrained = try outbox.counters().drained
                heartbeat.beat()  // the migration and the opening before it are done: the loop starts now
                notifier.ready(status: "draining \(store.groupDirectory); \(pending) events in the outbox")
                logger.info("agent started", metadata: [
                    "tributary.group": "\(store.groupDirectory)", "tributary.outbox": "\(outbox.path)",
                    "tributary.server": "\(loop.machine.settings.serverURL ?? "none")", "tributary.format": "\(loop.machine.settings.format)",
                    "tributary.outbox.pending": "\(pending)",
                ])
                if store.isMemoryBacked {
                    logger.warning(
                        "the group directory is on tmpfs (memory): the store's fsyncs promise nothing, and every event in it is lost at the next reboot; put it on a disk",
                        metadata: ["tributary.group": "\(store.groupDirectory)"])
                }
                if let interval = notifier.watchdogInterval {
                    group.addTask { await self.pingWatchdog(every: interval) }
                }
                let report = try await loopBody(session: session, loop: &loop)
                // What is left before the deadline (the grace the loop kept, or less: a task's grace is at most
                // half its budget) is shared by the steps below: a fifth of it to recording the last delivered
                // batch in the outbox; 0.4 each of what remains then to the store delete and the checkpoint; then a
                // fifth of what remains to the HTTP client's shutdown.
                try settle(session, patience: closingTime() * 0.2)
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
                return .success(report)
            } catch {
                // Fail-stop: nothing more is written, not even the status (FatalIO).
                if FatalIO.matches(error) || outbox.fatalIO.error != nil {
                    return .failure(outbox.fatalIO.trip(error, keeping: outbox))
                }
                // A run that ends in an error (a store created anew, a halt in a one-shot run) still deletes
                // what the collector acknowledged.
                do {
                    try settle(session, patience: closingTime() * 0.2)
                } catch {
                    return .failure(outbox.fatalIO.trip(error, keeping: outbox))
                }
                return .failure(Self.stopError(error, outbox: outbox.path))
            }
        }
        // Release everything in the group directory first: nothing below may delay it.
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
        await shutdown(clients.all, within: closingTime() * 0.2)
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

    /// Shuts the HTTP clients down, waiting at most `limit`: a connection whose request was cancelled
    /// against a collector that never answers can hold `shutdown()` open, and the process is stopping
    /// within its grace period anyway.
    ///
    /// No task waits on it: a child task would hold its group open as long as the shutdown hangs. The
    /// client calls back when it is done (on a dispatch queue: async-http-client's only way, and the
    /// process's first libdispatch worker if the run never had one, which is why it comes last), and an
    /// event-loop timer ends the wait at `limit`.
    func shutdown(_ clients: [HTTPClient], within limit: Duration) async {
        guard !clients.isEmpty else { return }
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let once = ResumeOnce(continuation)
            let left = Mutex(clients.count)
            for client in clients {
                client.shutdown(queue: .global()) { _ in
                    if left.withLock({ left in
                        left -= 1
                        return left == 0
                    }) { once.resume() }
                }
            }
            MultiThreadedEventLoopGroup.singleton.any().scheduleTask(in: TimeAmount(max(.zero, limit))) { once.resume() }
        }
    }

    /// Removes the last batch delivered from the outbox's waiting rows, if it is still there
    /// (``UploadSession/settle()``): in a turn that sends nothing, and as a run ends (where it waits
    /// at most a fifth of ``closingTime()`` for another process's write lock on the outbox). A failure
    /// other than an I/O error (which it throws: fail-stop) leaves them for a later turn, or the next
    /// start, which sends them again (the collector's dedup drops them); it ends no run.
    func settle(_ session: UploadSession, patience: Duration?) throws {
        do {
            try session.settle(patience: patience)
        } catch where FatalIO.matches(error) {
            throw error
        } catch {
            logger.notice("could not record the last batch delivered in the outbox yet; a later turn or the next start does", metadata: [
                "tributary.error": "\(error)",
            ])
        }
    }

    /// The time the steps after the main loop share: the configured grace, or what is left before the
    /// deadline when that is less.
    func closingTime() -> Duration {
        guard let task = budget.current else { return configuration.grace }
        return max(.zero, min(configuration.grace, task.deadline - configuration.clock.now))
    }

    /// Pings systemd's watchdog, but only while the main loop shows progress: it is asleep between turns,
    /// its heartbeat is recent, or a request it started is still within its timeout and answer time.
    ///
    /// It pings every half interval (`WATCHDOG_USEC`/2, as sd_watchdog_enabled(3) advises, and no
    /// faster: an idle agent wakes for nothing else). A look that finds the loop in a slow turn (drain
    /// commits on a slow disk) looks again every eighth of the interval, and pings as soon as the loop
    /// beats: the gap stays under the interval unless the loop is stuck for most of it.
    func pingWatchdog(every interval: Duration) async {
        while !Task.isCancelled {
            let alive = heartbeat.isAlive(within: interval / 2)
            if alive { notifier.watchdog() }
            try? await EventLoopSleep.sleep(until: .now + (alive ? interval / 2 : interval / 8))
        }
    }
}
