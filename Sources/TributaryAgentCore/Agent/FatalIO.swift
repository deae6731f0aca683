import GRDB
import Logging
import TributaryStore

#if canImport(Glibc)
import Glibc
#endif

/// The fail-stop rule for I/O errors (PostgreSQL's answer to "fsyncgate").
///
/// After a failed `fsync`, Linux may already have dropped the dirty pages, so a later `fsync` of the
/// same file can succeed without the data ever reaching the disk. Retrying is therefore unsafe. When
/// the outbox (SQLite `SQLITE_IOERR*`, `SQLITE_CORRUPT`) or the store (LMDB `EIO`) reports an I/O
/// error, the agent exits at once with status 74: no status write, no orderly close (closing the
/// outbox would checkpoint its WAL, an fsync of the very file that failed). The next start recovers
/// from what is durable; nothing acknowledged is lost, since the store keeps every event until the
/// outbox commit that holds it succeeded.
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
        return false
    }

    /// Logs the error and ends the process with status 74 (EX_IOERR), touching nothing else.
    static func stop(_ error: any Error, logger: Logger) -> Never {
        logger.critical("I/O error on the outbox or the store; stopping at once without retrying (fail-stop)", metadata: [
            "tributary.error": "\(error)",
        ])
        _exit(74)
    }
}
