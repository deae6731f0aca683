import AsyncHTTPClient
import Foundation
import Logging
import TributaryStore

extension Agent {
    /// Drains chunk by chunk while `condition` holds (at most 10 chunks, as one loop's drain), until a
    /// chunk comes back partial (the drain caught up with the store), the outbox reaches its quota or
    /// the agent stops; one chunk only while producers are committing (``LoopPacing``).
    func drainWhile(_ condition: () -> Bool, _ loop: inout LoopRun) throws -> Int {
        var drained = 0
        while condition(), drained < configuration.drainChunk * 10, mayDrain() {
            let moved = try drainRespectingQuota(&loop, maxEvents: configuration.drainChunk)
            drained += moved
            // A partial chunk caught up with the store: stop rather than commit a tiny transaction per new event.
            guard drainedMore(moved), !producersCommitting(loop.pacing, at: loop.clock.now) else { break }
        }
        return drained
    }

    /// Whether producers are committing at `now`, as `pacing` judges from the store's newest seq; the
    /// store is not read when pacing is off (``LoopPacing/paces``).
    func producersCommitting(_ pacing: LoopPacing, at now: ContinuousClock.Instant) -> Bool {
        pacing.paces && pacing.producersCommitting(newest: try? store.newestSeq(), at: now)
    }

    /// Whether a drain that moved `drained` events may have left more in the store: it ended on a full
    /// chunk (a partial chunk means it caught up).
    func drainedMore(_ drained: Int) -> Bool {
        drained > 0 && drained % configuration.drainChunk == 0
    }

    /// Whether the store this process has open holds an event above the outbox's `last_drained_seq`: one
    /// the drain has not moved yet (events drained but not yet deleted from it are not counted).
    func oldStoreHoldsUndrained() throws -> Bool {
        (try store.newestSeq() ?? 0) > (try outbox.lastDrainedSeq())
    }

    /// The outbox's events still to be sent and their bytes, and its dead letters' bytes: the outbox's
    /// own counts, less a delivered batch recorded so while the next request is out
    /// (``UploadSession/settle()``). Its bytes stay counted until then, against the quota as all that
    /// waits. (The status file reads its figures in one transaction: ``Outbox/statusFigures(settling:)``.)
    func waiting() throws -> (count: Int, bytes: Int, deadLetterBytes: Int) {
        let pending = try outbox.pending()
        // Not below 0: that batch's rows may have gone by another hand (the outbox edited).
        let count = max(0, pending.count - unsettledEvents.value)
        return (count, pending.bytes, pending.deadLetterBytes)
    }

    /// Whether the drain may take another chunk: not once a stop is requested (the events are safe in
    /// the store for the next run; `whileStopping`: but not in a deleted store's file) nor past the deadline.
    func mayDrain(whileStopping: Bool = false) -> Bool {
        (whileStopping || !isStopping) && (budget.current.map { $0.remaining() > .zero } ?? true)
    }

    /// Drains what the store holds, unless the outbox is at its quota, or (while the collector answers)
    /// holds ``AgentConfiguration/drainAhead`` events. Stops between chunks when a stop is requested,
    /// the deadline passes or the outbox reaches its quota, and after one chunk while producers are
    /// committing (``LoopPacing``). `whileStopping`: a deleted store's last
    /// events, drained during a stop, up to the quota and the deadline only.
    func drainRespectingQuota(_ loop: inout LoopRun, maxEvents: Int? = nil, whileStopping: Bool = false) throws -> Int {
        let (count, bytes, deadBytes) = try waiting()
        let ahead = max(configuration.effectiveDrainAhead, loop.machine.settings.bulkSize)
        let bounded = !whileStopping && loop.machine.drainAheadApplies
        if bounded && count >= ahead { return 0 }
        if bytes + deadBytes >= configuration.outboxQuotaBytes {
            // Dead letters alone fill the quota: no upload can make room, and a --once run would wait
            // for ever. It ends here, saying what to do; a daemon waits (an operator may act).
            if count == 0 && loop.machine.limits.once {
                throw AgentError(
                    .outboxFull,
                    "The outbox's dead letters (\(deadBytes) bytes) fill its quota (\(configuration.outboxQuotaBytes) "
                        + "bytes): nothing more can be drained. `tributary dead-letters` lists them, --replay sends them "
                        + "again (once the collector accepts them), --discard deletes them. The events not drained wait "
                        + "in the store.")
            }
            if !loop.drain.outboxFullLogged {
                logger.warning(
                    "outbox at its quota; draining paused until uploads make room (dead letters count too: see `tributary dead-letters`, which can replay or discard them)",
                    metadata: [
                        "tributary.outbox.bytes": "\(bytes)", "tributary.outbox.dead_letter_bytes": "\(deadBytes)",
                        "tributary.outbox.quota": "\(configuration.outboxQuotaBytes)",
                    ])
                loop.drain.outboxFullLogged = true
            }
            return 0
        }
        loop.drain.outboxFullLogged = false
        let drainer = Drainer(
            store: store, outbox: outbox, chunkSize: configuration.drainChunk, logger: logger, deletes: deletes)
        var limit = maxEvents ?? configuration.drainChunk * 10
        if bounded { limit = min(limit, ahead - count) }
        // The quota is checked again before every chunk: the outbox goes past it by one chunk at most.
        let quota = configuration.outboxQuotaBytes
        // Beside committing producers a drain takes one chunk (``LoopPacing``); a stop's drain of a deleted
        // store's last events takes what it can.
        let pacing = whileStopping || !loop.pacing.paces ? nil : loop.pacing
        let began = loop.clock.now
        defer { loop.drain.busy += began.duration(to: loop.clock.now) }
        var chunks = 0
        let drained: Int
        do {
            drained = try drainer.drainAvailable(maxEvents: limit) {
                guard self.mayDrain(whileStopping: whileStopping) else { return false }
                if chunks > 0, let pacing, self.producersCommitting(pacing, at: loop.clock.now) { return false }
                chunks += 1
                self.heartbeat.beat()  // each chunk committed is progress
                guard let held = try? self.outbox.pending() else { return true }
                return held.bytes + held.deadLetterBytes < quota
            }
            loop.drain.storeBusyLogged = false
        } catch let error as StoreError where error.code == .busy {
            // A producer holds the store's writer lock (stopped, or slow) while this process's delete waits
            // for it: the drain waits too, the loop goes on uploading and keeping its deadlines.
            if !loop.drain.storeBusyLogged {
                logger.notice("drain paused: the store cannot be read until the store delete ends", metadata: [
                    "tributary.group": "\(store.groupDirectory)", "tributary.reason": "\(error.message)",
                ])
                loop.drain.storeBusyLogged = true
            }
            return 0
        }
        // The events new to the outbox: not the records skipped as drained already (a drain stopped
        // between its outbox commit and its store delete), nor corrupt ones (counted as dead letters).
        if drained > 0 {
            let total = try outbox.counters().drained
            metrics.drained.increment(by: Int(total - loop.drain.outboxDrained))
            loop.drain.outboxDrained = total
        }
        return drained
    }
}
