import Logging
import TributaryStore

/// The drain stage: store → enrich → outbox → store delete, in bounded chunks.
///
/// Each chunk is read with one read transaction, inserted into the outbox in one SQLite transaction
/// (which also advances `last_drained_seq`), committed, and only then deleted from the store in one
/// write transaction. A crash between the outbox commit and the store delete leaves the events in
/// both; the next drain skips them (they are at or below `last_drained_seq`) and deletes them. A crash
/// before the outbox commit leaves them only in the store. Neither loses nor duplicates.
///
/// With ``StoreDeletes`` the store delete waits for LMDB's writer lock a bounded time (the agent's
/// drain: a producer stopped inside its transaction must not hold the agent); without, it waits as
/// long as the lock is held.
public struct Drainer: Sendable {
    let store: SharedStore
    let outbox: Outbox
    let chunkSize: Int
    let logger: Logger
    let deletes: StoreDeletes?

    /// A drain of `store` into `outbox`, `chunkSize` events at a time, its store deletes waited for by
    /// `deletes` (nil: on the calling thread, for as long as they take).
    public init(store: SharedStore, outbox: Outbox, chunkSize: Int = 1000, logger: Logger, deletes: StoreDeletes? = nil) {
        self.store = store
        self.outbox = outbox
        self.chunkSize = chunkSize
        self.logger = logger
        self.deletes = deletes
    }

    /// Whether the drain is paused: the last chunk's store delete still waits for the writer lock.
    public var isPaused: Bool { deletes?.isWaiting ?? false }

    /// Drains one chunk; returns how many store entries it moved (0 when the store is empty, or while
    /// ``isPaused``).
    ///
    /// The records are read in place (views into LMDB's map) and enriched straight into one buffer,
    /// which the outbox insert binds from: no arrays or strings per event.
    public func drainChunk() throws -> Int {
        if let deletes {
            // The chunk before is in the outbox and still in the store: reading on would read it again.
            // (Asked first: a delete that ends between the two calls leaves its failure for this one.)
            if deletes.isWaiting { return 0 }
            try deletes.rethrowLateFailure()
        }
        let enricher = try Enricher(store: store)
        var chunk = Outbox.DrainedChunk(reservingFor: chunkSize)
        try store.scanEvents(limit: chunkSize, restart: { chunk = Outbox.DrainedChunk(reservingFor: chunkSize) }) { seq, raw, record in
            switch record {
            case .success(let view):
                do {
                    try enricher.enrich(seq: seq, view: view, into: &chunk)
                } catch {
                    logger.error("event cannot be uploaded; kept as a dead letter", metadata: [
                        "tributary.seq": "\(seq)", "tributary.reason": "\(error)",
                    ])
                    chunk.entries.append(.corrupt(seq: seq, raw: Array(view.body), reason: "\(error)"))
                }
            case .failure(let corruption):
                logger.error("corrupt record in the shared store; kept as a dead letter", metadata: [
                    "tributary.seq": "\(seq)", "tributary.reason": "\(corruption.reason)",
                ])
                chunk.entries.append(.corrupt(seq: seq, raw: Array(raw), reason: corruption.reason))
            }
        }
        guard let lastSeq = chunk.entries.last?.seq else { return 0 }
        // Which record the outbox drained last (read again, once per chunk: hashing each record as the scan
        // passes it would cost every event).
        chunk.lastRecordIdentity = try store.rawEvent(seq: lastSeq).map(Outbox.recordIdentity) ?? 0
        let inserted = try outbox.insertDrained(chunk) { CrashPoint.hit("drain.before-outbox-commit") }
        if inserted.skipped > 0 {
            logger.notice(
                "events already in the outbox (a drain stopped between its outbox commit and its store delete); deleting them from the store",
                metadata: ["tributary.events": "\(inserted.skipped)"])
        }
        CrashPoint.hit("drain.after-outbox-commit")
        if let deletes {
            _ = try deletes.delete(through: lastSeq, in: store)
        } else {
            try store.deleteEvents(through: lastSeq)
        }
        // The records read stay mapped (and counted in RSS) until released: keep RSS flat with the backlog.
        store.releaseMappedPages()
        return chunk.entries.count
    }

    /// Drains chunk by chunk until it has caught up with the store, `maxEvents` were moved,
    /// `shouldContinue` (asked before every chunk) returns false, or the drain is paused (a store
    /// delete waits for the writer lock); returns how many were moved. A chunk the store cannot be read
    /// for (``StoreError/Code/busy``: this process must adopt a map another process grew, while its own
    /// delete waits for the writer lock) ends the drain there; when it is the first, the error is thrown.
    ///
    /// Caught up means a chunk came back partial: the store held fewer than a chunk when it was read.
    /// Events a producer appends meanwhile wait for the next call: draining "until the store is
    /// empty" never ends while a producer keeps appending, and a drain that does not return holds up
    /// the uploads and the stop behind it (a producer appending every millisecond kept the agent's
    /// drain going 1.3 s past its stop deadline, one 12-event chunk after another).
    public func drainAvailable(maxEvents: Int = .max, while shouldContinue: () -> Bool = { true }) throws -> Int {
        var moved = 0
        while moved < maxEvents, shouldContinue() {
            let n: Int
            do {
                n = try drainChunk()
            } catch let error as StoreError where error.code == .busy && moved > 0 {
                break
            }
            moved += n
            if n < chunkSize || isPaused { break }
        }
        return moved
    }
}
