import Foundation
import GRDB

/// Opening one of Tributary's SQLite files for reading only, by a user who may not write beside it.
///
/// sqlite.org (wal.html, "Read-Only Databases"): a read-only WAL-mode database can be opened "if the
/// -shm and -wal files already exist or those files can be created or the database is immutable". An
/// outbox nobody has open has neither file (the last connection removes them), and an operator who may
/// only read the agent's outbox cannot create them: SQLite refuses it (`SQLITE_READONLY`). With no
/// `-wal` beside it no writer has it open, and every committed transaction is in the file itself: it
/// is then opened `immutable`, which reads the file alone and locks nothing.
package enum ReadOnlyDatabase {
    /// Opens `path` read-only with `make` (`DatabasePool.init` or `DatabaseQueue.init`), and reads it
    /// once (`probe`) to know it opens; falls back to an immutable open as said above.
    package static func open<Reader: DatabaseReader, T>(
        _ path: String, configuration: Configuration, as make: (String, Configuration) throws -> Reader,
        probe: (Database) throws -> T
    ) throws -> (reader: Reader, probed: T) {
        var configuration = configuration
        configuration.readonly = true
        do {
            let reader = try make(path, configuration)
            return (reader, try reader.read(probe))
        } catch {
            guard needsImmutable(error, path: path) else { throw error }
            let reader = try make(immutableURI(path), configuration)
            return (reader, try reader.read(probe))
        }
    }

    /// Whether `error`, from a read-only open of `path`, is SQLite's refusal of a WAL database whose
    /// `-shm` it may not create, with no writer (no `-wal`).
    package static func needsImmutable(_ error: any Error, path: String) -> Bool {
        guard let error = error as? DatabaseError, [.SQLITE_READONLY, .SQLITE_CANTOPEN].contains(error.resultCode) else {
            return false
        }
        return access(path + "-wal", F_OK) != 0
    }

    /// The URI that opens `path` immutable (Debian's SQLite reads URIs as file names: `SQLITE_USE_URI`).
    package static func immutableURI(_ path: String) -> String {
        var escaped = ""
        for character in path {
            switch character {
            case "%": escaped += "%25"
            case "?": escaped += "%3f"
            case "#": escaped += "%23"
            default: escaped.append(character)
            }
        }
        return "file:" + escaped + "?immutable=1"
    }
}
