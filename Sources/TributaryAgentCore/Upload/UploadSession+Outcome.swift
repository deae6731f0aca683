import Logging
import TributaryStore

extension UploadSession {
    /// Applies the outcome of the request for `batchID` (`count` events): hands it to the machine and
    /// does what the machine answers.
    func apply(_ outcome: UploadOutcome, batchID: String, count: Int) throws -> Step {
        if case .delivered = outcome { CrashPoint.hit("upload.after-ack") }
        let haltedBefore = machine.haltReason
        let refusedRows = Machine.needsRows(for: outcome, count: count) ? try outbox.rows(inBatch: batchID) : []
        var generator = SystemRandomNumberGenerator()
        switch machine.answered(outcome, batchID: batchID, count: count, refusedRows: refusedRows, using: &generator) {
        case .acknowledge(let id, let next):
            // (The acknowledgement's transaction sets the outbox's count of dead letters in a row back to 0.)
            machine.acknowledged(madeInFlight: try outbox.acknowledge(id, then: next))
            logger.debug("batch delivered", metadata: ["tributary.batch.id": "\(batchID)", "tributary.batch.events": "\(count)"])
            return .progressed(delivered: count)

        case .acknowledgeLater(let events):
            unsettledEvents.set(events, batch: batchID)
            logger.debug("batch delivered", metadata: ["tributary.batch.id": "\(batchID)", "tributary.batch.events": "\(count)"])
            return .progressed(delivered: count)

        case .retry(let delay, let reason):
            try outbox.countRetry()
            logger.info("upload failed; will retry the same batch", metadata: [
                "tributary.batch.id": "\(batchID)", "tributary.reason": "\(reason)",
                "tributary.retry.attempt": "\(machine.attempt)", "tributary.retry.delay_s": "\(delay.seconds)",
            ])
            return .wait(delay)

        case .refuse(let refused):
            return try refuse(refused)

        case .shrink(let id):
            try outbox.unbatch(id)
            logger.info("collector said 413; halving the batch size", metadata: [
                "tributary.batch.id": "\(id)", "tributary.batch.limit": "\(machine.batchSize.limit)",
            ])
            return .progressed(delivered: 0)

        case .bisect:
            return .progressed(delivered: 0)

        case .halt(let status, let reason, let wait):
            // One error line when uploads halt (or halt for another reason); each retry after it, at the
            // cap interval, that meets the same refusal is logged at info.
            let level: Logger.Level = haltedBefore == reason ? .info : .error
            // Status 0: no HTTP answer, a TLS problem (``TLSCheck``), whose reason names the cause and the fix.
            let message: Logger.Message =
                status == 0
                ? "TLS problem with the collector; uploads halted, every event kept, retrying at the cap interval"
                : "collector refuses uploads; keeping every event and retrying at the cap interval"
            logger.log(level: level, message, metadata: ["tributary.status": "\(status)", "tributary.reason": "\(reason)"])
            return .wait(wait)
        }
    }

    /// An event the collector refused on its own: held back by a halt when the outbox's run of dead
    /// letters to this destination says the collector seems to refuse every event, else dead-lettered.
    func refuse(_ refused: Machine.RefusedAlone) throws -> Step {
        if machine.mayHalt {
            let run = try outbox.deadLetterRun(destination: destinationFingerprint)
            if case .hold(let seq, let wait) = machine.haltCheck(refused, inARow: run.inARow, heldSeq: run.heldSeq) {
                try outbox.holdAfterHalt(seq: seq)
                logger.error(
                    "collector refuses event after event; halting uploads instead of dead-lettering the backlog",
                    metadata: ["tributary.dead_letters_in_a_row": "\(run.inARow)", "tributary.reason": "\(refused.reason)"])
                return .wait(wait)
            }
        }
        try outbox.deadLetter(refused.row, status: refused.status, reason: refused.reason) {
            CrashPoint.hit("deadletter.before-commit")
        }
        machine.deadLettered(refused)
        logger.warning("event rejected by the collector; moved to dead letters", metadata: [
            "tributary.event_id": "\(refused.row.eventID)", "tributary.seq": "\(refused.row.seq)",
            "tributary.reason": "\(refused.reason)",
        ])
        return .progressed(delivered: 0, deadLettered: 1)
    }

    /// The collector URL and wire format, as ``Outbox/deadLetterRun(destination:)`` tells destinations apart.
    var destinationFingerprint: UInt64 {
        fnv1a64("\(configuration.format.rawValue) \(configuration.serverURL ?? "")".utf8)
    }
}
