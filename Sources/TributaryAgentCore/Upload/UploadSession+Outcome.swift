import AsyncHTTPClient
import Foundation
import Logging
import NIOCore
import NIOHTTP1
import Synchronization
import TributaryStore
import TributaryWire


extension UploadSession {
    /// Applies the outcome of the request for `batchID` (`count` events).
    func apply(_ outcome: UploadOutcome, batchID: String, count: Int) throws -> Step {
        let next = readAheadBatch.take()
        if case .retry = outcome {} else { suspectHalf = nil }
        if case .halt = outcome {} else { haltReason = nil }  // any other answer: not halted any more
        switch outcome {
        case .delivered:
            CrashPoint.hit("upload.after-ack")
            if defersAcknowledgements, suspect == nil, let next {
                (unsettled, ready) = ((batchID, next.batch), next)
                unsettledEvents.set(count, batch: batchID)
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
            batchSize.delivered()
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
                batchSize.forgetCeiling()
                return .progressed(delivered: 0, deadLettered: 1)
            }
            batchSize.tooLarge(count: count)
            // A half refused as too large ends the bisection: its rows go back to the pool, and batches
            // of the halved size find the refused event again (sending the same half again would get
            // the same 413).
            suspect = nil
            try outbox.unbatch(batchID)
            logger.info("collector said 413; halving the batch size", metadata: [
                "tributary.batch.id": "\(batchID)", "tributary.batch.limit": "\(batchSize.limit)",
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
    func haltBeforeDeadLetter(_ row: Outbox.Row, reason: String) throws -> Step? {
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
        haltedAfterDeadLetters = deadLettersInARow
        lastError = reason
        logger.error(
            "collector refuses event after event; halting uploads instead of dead-lettering the backlog",
            metadata: ["tributary.dead_letters_in_a_row": "\(deadLettersInARow)", "tributary.reason": "\(reason)"])
        return .wait(cap)
    }

    /// The collector URL and wire format, as ``Outbox/deadLetterRun(destination:)`` tells destinations apart.
    var destinationFingerprint: UInt64 {
        fnv1a64("\(configuration.format.rawValue) \(configuration.serverURL ?? "")".utf8)
    }
}
