import Foundation
import GRDB

/// What a file given as one of Tributary's own SQLite databases (the agent's outbox, the collector's
/// `--db`) holds, read through a read-only connection before it is opened for writing: a file of
/// another program is then refused with nothing changed (a read-write open would switch it to WAL and
/// migrate it).
package enum ForeignDatabaseCheck {
    /// How long the read waits for another process's write lock on the file.
    package static let patience: TimeInterval = 5

    /// What the look found.
    package enum Finding {
        /// Nothing to look at (no file, or an empty one): the open makes it anew.
        case nothing
        /// The file's tables (`sqlite_%` and `grdb_migrations` left out), in name order.
        case tables([String])
        /// Not readable as a database (not SQLite, damaged, not this user's): the open says why.
        case unreadable
        /// Another process held the file's write lock (a rollback-journal writer, an `EXCLUSIVE`
        /// transaction) for all of ``patience``: its tables could not be read. Letting it through would
        /// have the open change a file nobody checked, once the lock went.
        case locked
    }

    /// Reads the tables of the database at `path` through a read-only connection, waiting up to
    /// `patience` for another process's lock.
    package static func look(at path: String, patience: TimeInterval = patience) -> Finding {
        var info = stat()
        guard stat(path, &info) == 0, info.st_size > 0 else { return .nothing }
        var configuration = Configuration()
        configuration.busyMode = .timeout(patience)
        do {
            return .tables(try ReadOnlyDatabase.open(path, configuration: configuration, as: DatabaseQueue.init) { db in
                try String.fetchAll(
                    db,
                    sql: "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' "
                        + "AND name != 'grdb_migrations' ORDER BY name")
            }.probed)
        } catch let error as DatabaseError where [.SQLITE_BUSY, .SQLITE_LOCKED].contains(error.resultCode) {
            return .locked
        } catch {
            return .unreadable
        }
    }

    /// The message for a file ``look(at:patience:)`` found ``Finding/locked``, naming `what` the file was
    /// given as.
    package static func lockedMessage(_ path: String, what: String) -> String {
        "\(path) is locked by another process (held over \(Int(patience)) s), so it could not be checked to be \(what); "
            + "nothing was changed. Stop the program that holds it, or give a file of its own."
    }
}
