import AsyncHTTPClient
import Foundation
import Logging
import Synchronization
import TributaryStore

/// What the agent last wrote to its status file, but for the time it was written: a report that would
/// say the same again is not written (an idle agent writes nothing to disk).
final class LastStatus: Sendable {
    private let written = Mutex<AgentStatus?>(nil)

    /// Whether `status` says something the last report did not; records it as written if so.
    func isNews(_ status: AgentStatus) -> Bool {
        var timeless = status
        timeless.updatedMillis = 0
        return written.withLock { last in
            guard last != timeless else { return false }
            last = timeless
            return true
        }
    }

    /// The next report is written whatever it says (one that failed to be written).
    func forget() { written.withLock { $0 = nil } }
}

extension Agent {
    /// What the status file says besides the outbox's figures, as the loop knows it now.
    struct StatusFields: Sendable {
        var state: String
        var haltReason: String?
        var haltedAfterDeadLetters: Int?
        var lastError: String?
        var lastUploadMillis: Int64?
        var serverURL: String?
        var settingsProblem: String?
    }

    /// What the loop knows for the status file now; `error`, when the run ended in one, is its last error.
    func statusFields(session: UploadSession, state: String, loop: LoopRun, error: String? = nil) -> StatusFields {
        StatusFields(
            state: state, haltReason: session.haltReason, haltedAfterDeadLetters: session.haltedAfterDeadLetters, lastError: error ?? session.lastError,
            lastUploadMillis: loop.lastUploadMillis, serverURL: loop.machine.settings.serverURL,
            settingsProblem: loop.settingsProblem)
    }

    /// Writes the agent's status file; `error`, when the run ended in one, is its last error.
    func writeStatus(session: UploadSession, state: String, loop: LoopRun, error: String? = nil) {
        writeStatus(statusFields(session: session, state: state, loop: loop, error: error))
    }

    /// Rewrites the status file once a second (the first time a second after `lastWrite`), when it
    /// would say something new, until cancelled, with `fields` (read before the request started: the
    /// upload changes the session's; `stopping` once a stop is asked for) and the outbox's figures as
    /// they are then: while the loop awaits a request, which only its timeout bounds. Cancelled, it
    /// returns at once.
    func keepStatusFresh(_ fields: StatusFields, lastWrite: ContinuousClock.Instant) async {
        var next = lastWrite.advanced(by: .seconds(1))
        var fields = fields
        let clock = configuration.clock
        while (try? await clock.sleep(until: next)) != nil {
            // A stop asked for meanwhile waits for this answer (within its deadline): say so.
            if isStopping { fields.state = "stopping" }
            writeStatus(fields)
            next = max(next.advanced(by: .seconds(1)), clock.now)
        }
    }

    func writeStatus(_ fields: StatusFields) {
        let state = fields.state
        // Past a fail-stop error the agent writes nothing more (FatalIO).
        guard outbox.fatalIO.error == nil else { return }
        do {
            // A delivered batch not yet recorded so counts as delivered, not as pending (one read of the outbox).
            let (counters, pending) = try outbox.statusFigures(settling: unsettledEvents.batch)
            var status = AgentStatus(
                pid: getpid(), state: state, haltReason: fields.haltReason, lastError: fields.lastError,
                outboxPath: outbox.path, outboxPending: pending.count,
                delivered: counters.delivered, deadLetters: counters.deadLetters,
                batches: counters.batches, retries: counters.retries,
                corruptRecords: counters.corruptRecords, lastUploadMillis: fields.lastUploadMillis,
                updatedMillis: BootClock.wallMillis())
            status.outboxBytes = pending.bytes
            status.deadLetterBytes = pending.deadLetterBytes
            status.outboxQuota = configuration.outboxQuotaBytes
            status.serverURL = fields.serverURL
            status.settingsProblem = fields.settingsProblem
            status.haltedAfterDeadLetters = fields.haltedAfterDeadLetters
            status.damagedStore = damagedStore.map { "\($0.directory): \($0.reason)" }
            guard lastStatus.isNews(status) else { return }
            do {
                try status.write(groupDirectory: store.groupDirectory)
            } catch {
                lastStatus.forget()
                throw error
            }
            var line = "\(state): \(status.outboxPending) events queued, \(status.delivered) delivered"
            if status.deadLetters > 0 { line += ", \(status.deadLetters) dead letters" }
            if let halt = status.haltReason { line += "; halted: \(halt)" }
            notifier.status(line)
        } catch {
            logger.warning("could not write the status file", metadata: ["tributary.reason": "\(error)"])
        }
    }
}
