import GRDB
import GRDBSQLite

// The one place TributaryAgentCore calls SQLite's C API itself; everything else goes through GRDB.

/// SQLite's `SQLITE_STATIC` (nil): "the value stays valid and unchanged until rebound or cleared".
private let sqliteStatic: sqlite3_destructor_type? = nil

/// A GRDB statement driven through SQLite's C API: the seam for every `sqlite3_*` call of
/// TributaryAgentCore. Only the outbox's two loops over rows use it, where GRDB's Swift values per row
/// cost more than SQLite's own work (the inserts of ``Outbox/insertDrained(_:beforeCommit:)``, the reads
/// of ``Outbox/nextBatch(maxCount:maxBytes:each:)``). Each method is one direct call.
struct RawStatement {
    private let handle: SQLiteStatement

    @inline(__always) init(_ statement: Statement) { handle = statement.sqliteStatement }

    /// What ``step()`` returns for a row, and once the statement is done.
    @inline(__always) static var row: Int32 { SQLITE_ROW }
    @inline(__always) static var done: Int32 { SQLITE_DONE }

    @inline(__always) func reset() { sqlite3_reset(handle) }

    @inline(__always) func clearBindings() { sqlite3_clear_bindings(handle) }

    @inline(__always) func bind(_ index: Int32, _ value: Int64) { sqlite3_bind_int64(handle, index, value) }

    /// Binds the `count` bytes of UTF-8 at `start` as text, not copied (SQLITE_STATIC): they must stay
    /// as they are until the parameter is bound again or the bindings are cleared.
    @inline(__always) func bindText(_ index: Int32, _ start: UnsafeRawPointer, count: Int) {
        sqlite3_bind_text(handle, index, start.assumingMemoryBound(to: CChar.self), Int32(count), sqliteStatic)
    }

    /// Binds the `count` bytes at `start` as a blob, not copied (SQLITE_STATIC), as ``bindText(_:_:count:)``.
    @inline(__always) func bindBlob(_ index: Int32, _ start: UnsafeRawPointer, count: Int) {
        sqlite3_bind_blob(handle, index, start, Int32(count), sqliteStatic)
    }

    /// Binds an empty blob (not NULL).
    @inline(__always) func bindEmptyBlob(_ index: Int32) { sqlite3_bind_zeroblob(handle, index, 0) }

    /// Runs the statement to its next row: ``row``, ``done``, or an error code.
    @inline(__always) func step() -> Int32 { sqlite3_step(handle) }

    @inline(__always) func int64(_ column: Int32) -> Int64 { sqlite3_column_int64(handle, column) }

    /// A blob column's bytes, valid until the next ``step()`` or ``reset()``.
    @inline(__always) func blob(_ column: Int32) -> UnsafeRawBufferPointer {
        // sqlite.org/c3ref/column_blob.html: call _blob first, then _bytes, for the pointer to stay valid.
        UnsafeRawBufferPointer(
            start: sqlite3_column_blob(handle, column), count: Int(sqlite3_column_bytes(handle, column)))
    }

    /// The error a ``step()`` returned as `rc`, with `db`'s message for it and the statement's `sql`.
    func error(_ rc: Int32, in db: Database, sql: String) -> DatabaseError {
        DatabaseError(
            resultCode: ResultCode(rawValue: rc), message: String(cString: sqlite3_errmsg(db.sqliteConnection)),
            sql: sql)
    }
}
