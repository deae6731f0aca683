import GRDB
import GRDBSQLite

// The one place Tributary calls SQLite's C API itself; everything else goes through GRDB.

/// SQLite's `SQLITE_STATIC` (nil): "the value stays valid and unchanged until rebound or cleared".
@usableFromInline let sqliteStatic: sqlite3_destructor_type? = nil

/// A GRDB statement driven through SQLite's C API: the seam for every `sqlite3_*` call of the
/// package. Only loops over rows use it, where GRDB's Swift values per row cost more than SQLite's own
/// work: the agent outbox's inserts (`Outbox.insertDrained`) and batch reads (`Outbox.nextBatch`), and
/// the reference collector's inserts of a batch's events (`EventStore`). Each method is one direct
/// call, inlined into its caller.
package struct RawStatement {
    @usableFromInline let handle: SQLiteStatement

    @inlinable package init(_ statement: Statement) { handle = statement.sqliteStatement }

    /// What ``step()`` returns for a row, and once the statement is done.
    @inlinable package static var row: Int32 { SQLITE_ROW }
    @inlinable package static var done: Int32 { SQLITE_DONE }

    @inlinable package func reset() { sqlite3_reset(handle) }

    @inlinable package func clearBindings() { sqlite3_clear_bindings(handle) }

    @inlinable package func bind(_ index: Int32, _ value: Int64) { sqlite3_bind_int64(handle, index, value) }

    /// Binds the `count` bytes of UTF-8 at `start` as text, not copied (SQLITE_STATIC): they must stay
    /// as they are until the parameter is bound again or the bindings are cleared.
    @inlinable package func bindText(_ index: Int32, _ start: UnsafeRawPointer, count: Int) {
        sqlite3_bind_text(handle, index, start.assumingMemoryBound(to: CChar.self), Int32(count), sqliteStatic)
    }

    /// Binds the `count` bytes at `start` as a blob, not copied (SQLITE_STATIC), as ``bindText(_:_:count:)``.
    @inlinable package func bindBlob(_ index: Int32, _ start: UnsafeRawPointer, count: Int) {
        sqlite3_bind_blob(handle, index, start, Int32(count), sqliteStatic)
    }

    /// Binds an empty blob (not NULL).
    @inlinable package func bindEmptyBlob(_ index: Int32) { sqlite3_bind_zeroblob(handle, index, 0) }

    /// Runs the statement to its next row: ``row``, ``done``, or an error code.
    @inlinable package func step() -> Int32 { sqlite3_step(handle) }

    @inlinable package func int64(_ column: Int32) -> Int64 { sqlite3_column_int64(handle, column) }

    /// How many times SQLite compiled the statement again since it was prepared
    /// (`SQLITE_STMTSTATUS_REPREPARE`): after a schema change, or once something expired it.
    package var recompiles: Int32 { sqlite3_stmt_status(handle, Int32(SQLITE_STMTSTATUS_REPREPARE), 0) }

    /// A blob column's bytes, valid until the next ``step()`` or ``reset()``.
    @inlinable package func blob(_ column: Int32) -> UnsafeRawBufferPointer {
        // sqlite.org/c3ref/column_blob.html: call _blob first, then _bytes, for the pointer to stay valid.
        UnsafeRawBufferPointer(
            start: sqlite3_column_blob(handle, column), count: Int(sqlite3_column_bytes(handle, column)))
    }

    /// Binds a NUL-terminated C string as text, not copied (SQLITE_STATIC, as ``bindText(_:_:count:)``);
    /// a nil pointer binds NULL, as SQLite does.
    @inlinable package func bindCString(_ index: Int32, _ text: UnsafePointer<CChar>?) {
        sqlite3_bind_text(handle, index, text, -1, sqliteStatic)
    }

    @inlinable package func bindNull(_ index: Int32) { sqlite3_bind_null(handle, index) }

    /// Binds `value`, or NULL when it is nil.
    @inlinable package func bind(_ index: Int32, _ value: Int64?) {
        if let value { sqlite3_bind_int64(handle, index, value) } else { sqlite3_bind_null(handle, index) }
    }

    /// The rows the last statement of `db`'s connection changed.
    @inlinable package static func changes(in db: Database) -> Int32 { sqlite3_changes(db.sqliteConnection) }

    /// The error a ``step()`` returned as `rc`, with `db`'s message for it and the statement's `sql`.
    package func error(_ rc: Int32, in db: Database, sql: String) -> DatabaseError {
        DatabaseError(
            resultCode: ResultCode(rawValue: rc), message: String(cString: sqlite3_errmsg(db.sqliteConnection)),
            sql: sql)
    }
}
