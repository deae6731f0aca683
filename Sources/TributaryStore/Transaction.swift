import CLMDB

/// A key in the store: LMDB compares keys as bytes, so sequence numbers are stored big-endian.
@inline(__always)
func withKey<R>(_ seq: UInt64, _ body: (inout MDB_val) throws -> R) rethrows -> R {
    var be = seq.bigEndian
    return try withUnsafeMutableBytes(of: &be) { raw in
        var key = MDB_val(mv_size: 8, mv_data: raw.baseAddress)
        return try body(&key)
    }
}

@inline(__always)
func withKey<R>(_ text: String, _ body: (inout MDB_val) throws -> R) rethrows -> R {
    var bytes = Array(text.utf8)
    return try bytes.withUnsafeMutableBytes { raw in
        var key = MDB_val(mv_size: raw.count, mv_data: raw.baseAddress)
        return try body(&key)
    }
}

/// Decodes an 8-byte big-endian key.
@inline(__always)
func decodeSequence(_ val: MDB_val) -> UInt64? {
    guard val.mv_size == 8, let base = val.mv_data else { return nil }
    return UInt64(bigEndian: base.loadUnaligned(as: UInt64.self))
}

/// A failed LMDB call inside a transaction, turned into a ``StoreError`` (or handled) by the environment.
struct LMDBFailure: Error {
    let rc: Int32
    let call: StaticString
}

@inline(__always)
func check(_ rc: Int32, _ call: StaticString) throws(LMDBFailure) {
    if rc != MDB_SUCCESS { throw LMDBFailure(rc: rc, call: call) }
}

/// An open LMDB transaction, valid only inside the closure it was handed to.
///
/// Not `Sendable`, and only ever handed to synchronous closures, so it cannot outlive its closure or
/// cross an `await` (LMDB write transactions are bound to the thread that began them).
struct Transaction {
    let txn: OpaquePointer
    let mdb: MDB

    /// Returns a copy of the value stored under `key`, or nil.
    func get(_ dbi: MDB_dbi, _ key: inout MDB_val) throws -> [UInt8]? {
        try withValue(dbi, &key) { $0.map(Array.init) }
    }

    /// Hands the value stored under `key` (a view into the map, valid only inside `body`) to `body`.
    func withValue<R>(_ dbi: MDB_dbi, _ key: inout MDB_val, _ body: (UnsafeRawBufferPointer?) throws -> R) throws -> R {
        var value = MDB_val()
        let rc = MDB.get(txn, dbi, &key, &value)
        if rc == MDB_NOTFOUND { return try body(nil) }
        try check(rc, "mdb_get")
        return try body(UnsafeRawBufferPointer(start: value.mv_data, count: value.mv_size))
    }

    func put(_ dbi: MDB_dbi, _ key: inout MDB_val, _ bytes: UnsafeRawBufferPointer, flags: Int32 = 0) throws {
        var value = MDB_val(mv_size: bytes.count, mv_data: UnsafeMutableRawPointer(mutating: bytes.baseAddress))
        try check(mdb.put(txn, dbi, &key, &value, UInt32(flags)), "mdb_put")
    }

    /// Reserves `count` bytes for `key` and lets `body` fill them in place (`MDB_RESERVE`), saving a copy.
    func putReserved(
        _ dbi: MDB_dbi, _ key: inout MDB_val, count: Int, flags: Int32 = 0,
        _ body: (UnsafeMutableRawBufferPointer) -> Void
    ) throws {
        var value = MDB_val(mv_size: count, mv_data: nil)
        try check(mdb.put(txn, dbi, &key, &value, UInt32(flags | MDB_RESERVE)), "mdb_put")
        body(UnsafeMutableRawBufferPointer(start: value.mv_data, count: count))
    }

    /// Deletes `key`; returns false when it was not there.
    @discardableResult
    func delete(_ dbi: MDB_dbi, _ key: inout MDB_val) throws -> Bool {
        let rc = MDB.del(txn, dbi, &key)
        if rc == MDB_NOTFOUND { return false }
        try check(rc, "mdb_del")
        return true
    }

    /// Number of entries in a table.
    func count(_ dbi: MDB_dbi) throws -> Int {
        var stat = MDB_stat()
        try check(MDB.stat(txn, dbi, &stat), "mdb_stat")
        return stat.ms_entries
    }

    /// Walks a table in key order starting at `start` (or the first key), until `body` returns false.
    func scan(
        _ dbi: MDB_dbi, from start: UInt64? = nil,
        _ body: (MDB_val, UnsafeRawBufferPointer) throws -> Bool
    ) throws {
        var cursor: OpaquePointer?
        try check(MDB.cursorOpen(txn, dbi, &cursor), "mdb_cursor_open")
        defer { MDB.cursorClose(cursor) }
        var key = MDB_val()
        var value = MDB_val()
        var rc: Int32
        if let start {
            rc = withKey(start) { k in
                key = k
                return MDB.cursorGet(cursor, &key, &value, MDB_SET_RANGE)
            }
        } else {
            rc = MDB.cursorGet(cursor, &key, &value, MDB_FIRST)
        }
        while rc == MDB_SUCCESS {
            guard try body(key, UnsafeRawBufferPointer(start: value.mv_data, count: value.mv_size)) else { return }
            rc = MDB.cursorGet(cursor, &key, &value, MDB_NEXT)
        }
        if rc != MDB_NOTFOUND { try check(rc, "mdb_cursor_get") }
    }

    /// The last key of a table, or nil when it is empty.
    func lastKey(_ dbi: MDB_dbi) throws -> MDB_val? {
        var cursor: OpaquePointer?
        try check(MDB.cursorOpen(txn, dbi, &cursor), "mdb_cursor_open")
        defer { MDB.cursorClose(cursor) }
        var key = MDB_val()
        var value = MDB_val()
        let rc = MDB.cursorGet(cursor, &key, &value, MDB_LAST)
        if rc == MDB_NOTFOUND { return nil }
        try check(rc, "mdb_cursor_get")
        return key
    }
}

extension Transaction {
    /// Deletes every entry whose 8-byte key is ≤ `last`, oldest first; returns how many were deleted.
    func deleteThrough(_ dbi: MDB_dbi, _ last: UInt64) throws -> Int {
        var cursor: OpaquePointer?
        try check(MDB.cursorOpen(txn, dbi, &cursor), "mdb_cursor_open")
        defer { MDB.cursorClose(cursor) }
        var key = MDB_val()
        var value = MDB_val()
        var deleted = 0
        var rc = MDB.cursorGet(cursor, &key, &value, MDB_FIRST)
        while rc == MDB_SUCCESS {
            guard let seq = decodeSequence(key), seq <= last else { break }
            try check(MDB.cursorDel(cursor, 0), "mdb_cursor_del")
            deleted += 1
            // LMDB marks a cursor after mdb_cursor_del so that MDB_NEXT yields the entry that followed.
            rc = MDB.cursorGet(cursor, &key, &value, MDB_NEXT)
        }
        if rc != MDB_NOTFOUND && rc != MDB_SUCCESS { try check(rc, "mdb_cursor_get") }
        return deleted
    }
}
