import GRDB
import Synchronization
import TributaryStore

#if canImport(Glibc)
import Glibc
#endif

/// The fail-stop rule for I/O errors (PostgreSQL's answer to "fsyncgate").
///
/// After a failed `fsync`, Linux may already have dropped the dirty pages, so a later `fsync` of the
/// same file can succeed without the data ever reaching the disk. Retrying is therefore unsafe. When
/// the outbox (SQLite `SQLITE_IOERR*`, `SQLITE_CORRUPT`) or the store (LMDB `EIO`) reports an I/O
/// error, the agent's ``Latch`` trips: from then on no outbox write or checkpoint and no store delete
/// runs (each refuses with the latched error before touching its file), the run ends with an
/// ``AgentError/Code/failStop`` error without writing its status or recording anything more, and the
/// executable exits with status 74. The outbox is kept open until the process exits: closing it would
/// checkpoint its WAL, an fsync of the very file that failed. The next start recovers from what is
/// durable; nothing acknowledged is lost, since the store keeps every event until the outbox commit
/// that holds it succeeded.
///
/// Space exhaustion (`SQLITE_FULL`, `storeFull`) is not fatal in this sense: it fails the step, the
/// agent stops the ordinary way, and a later run continues.
enum FatalIO {
    /// Whether `error` is an I/O error the agent must not survive.
    static func matches(_ error: any Error) -> Bool {
        if let error = error as? DatabaseError {
            return error.resultCode == .SQLITE_IOERR || error.resultCode == .SQLITE_CORRUPT
        }
        if let error = error as? StoreError { return error.lmdbCode == EIO }
        if let error = error as? AgentError { return error.code == .failStop }
        return false
    }

    /// Tripped by the first fail-stop error of one agent's outbox or store; refuses every write after it.
    ///
    /// The outbox checks it inside its writer queue, before each transaction, and trips it there when
    /// a transaction or a checkpoint fails, so that no write queued behind the failed one reaches the
    /// file; the store deletes check it on their thread.
    final class Latch: Sendable {
        private let tripped = Mutex<AgentError?>(nil)
        /// Whatever must stay alive until the process exits once the latch trips (the outbox).
        private let kept = Mutex<[any Sendable]>([])

        init() {}

        /// The error the latch tripped on, as the run ends with it; nil while it has not tripped.
        var error: AgentError? { tripped.withLock { $0 } }

        /// Throws the latched error, if the latch tripped.
        func check() throws(AgentError) {
            if let error { throw error }
        }

        /// Trips the latch on `error` (the first error is kept), and keeps `owner` alive to the end of
        /// the process. Returns the latched error.
        @discardableResult
        func trip(_ error: any Error, keeping owner: (any Sendable)? = nil) -> AgentError {
            if let owner { kept.withLock { $0.append(owner) } }
            return tripped.withLock { latched in
                if let latched { return latched }
                let failStop = error as? AgentError ?? AgentError(
                    .failStop,
                    "I/O error on the outbox or the store (\(error)); stopped at once without retrying or writing "
                        + "anything more (fail-stop: a failed fsync is never retried). Check the disk (dmesg) and start "
                        + "the agent again: it recovers from what is durable, and nothing acknowledged is lost.",
                    cause: error)
                latched = failStop
                return failStop
            }
        }
    }
}
