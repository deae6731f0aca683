import CLMDB
import Synchronization

/// The seam through which TributaryStore calls liblmdb: no other file calls an `mdb_*` function.
///
/// Tests need to reproduce failures that cannot be produced for real on demand (`EIO` from a commit,
/// `MDB_MAP_FULL` at an exact call). Each environment owns an ``LMDBFaults`` table; the instance
/// methods are the call sites a test can fail through it: each takes the next injected fault of its
/// site, if any, and otherwise calls LMDB (in production the table is empty). The static functions
/// are the plain calls, where nothing can be injected: each is the C call itself, always inlined, so
/// that the hot paths (`mdb_get`, `mdb_cursor_get`) cost what a direct call costs; they take handles
/// as optionals, as Swift imports lmdb.h's pointers (implicitly unwrapped).
struct MDB {
    let faults: LMDBFaults

    // MARK: Calls a test can fail

    func txnBegin(_ env: OpaquePointer, _ flags: UInt32, _ txn: inout OpaquePointer?) -> Int32 {
        if let rc = faults.take(flags & UInt32(MDB_RDONLY) != 0 ? .readBegin : .writeBegin) { return rc }
        return Self.txnBegin(env, flags, &txn)
    }

    func txnCommit(_ txn: OpaquePointer) -> Int32 {
        if let rc = faults.take(.commit) {
            Self.txnAbort(txn)  // a failed mdb_txn_commit frees the transaction too
            return rc
        }
        return Self.txnCommit(txn)
    }

    func put(
        _ txn: OpaquePointer, _ dbi: MDB_dbi, _ key: inout MDB_val, _ value: inout MDB_val, _ flags: UInt32
    ) -> Int32 {
        if let rc = faults.take(.put) { return rc }
        return mdb_put(txn, dbi, &key, &value, flags)
    }

    func setMapSize(_ env: OpaquePointer, _ size: Int) -> Int32 {
        if let rc = faults.take(.setMapSize) { return rc }
        return Self.setMapSize(env, size)
    }

    // MARK: Environment

    @inline(__always)
    static func envCreate(_ env: inout OpaquePointer?) -> Int32 { mdb_env_create(&env) }

    @inline(__always)
    static func envSetMaxDBs(_ env: OpaquePointer?, _ count: MDB_dbi) -> Int32 { mdb_env_set_maxdbs(env, count) }

    @inline(__always)
    static func setMapSize(_ env: OpaquePointer?, _ size: Int) -> Int32 { mdb_env_set_mapsize(env, size) }

    @inline(__always)
    static func envOpen(_ env: OpaquePointer?, _ path: String, _ flags: UInt32, _ mode: mdb_mode_t) -> Int32 {
        mdb_env_open(env, path, flags, mode)
    }

    @inline(__always)
    static func envClose(_ env: OpaquePointer?) { mdb_env_close(env) }

    @inline(__always)
    @discardableResult
    static func envInfo(_ env: OpaquePointer?, _ info: inout MDB_envinfo) -> Int32 { mdb_env_info(env, &info) }

    @inline(__always)
    @discardableResult
    static func envStat(_ env: OpaquePointer?, _ stat: inout MDB_stat) -> Int32 { mdb_env_stat(env, &stat) }

    @inline(__always)
    static func envGetFD(_ env: OpaquePointer?, _ fd: inout mdb_filehandle_t) -> Int32 { mdb_env_get_fd(env, &fd) }

    // MARK: Reader table

    @inline(__always)
    @discardableResult
    static func readerCheck(_ env: OpaquePointer?, _ dead: inout Int32) -> Int32 {
        LockWordWatch.shared.beginning { mdb_reader_check(env, &dead) }
    }

    /// `mdb_reader_list`: `function` is called with each line of the table's text, and `context`.
    @inline(__always)
    static func readerList(
        _ env: OpaquePointer?,
        _ function: @convention(c) (_ message: UnsafePointer<CChar>?, _ context: UnsafeMutableRawPointer?) -> Int32,
        _ context: UnsafeMutableRawPointer?
    ) -> Int32 {
        mdb_reader_list(env, function, context)
    }

    // MARK: Transactions

    @inline(__always)
    static func txnBegin(_ env: OpaquePointer?, _ flags: UInt32, _ txn: inout OpaquePointer?) -> Int32 {
        // A begin may wait for the writer's or the reader table's mutex: the lock-word watch is on meanwhile.
        LockWordWatch.shared.beginning { mdb_txn_begin(env, nil, flags, &txn) }
    }

    @inline(__always)
    static func txnCommit(_ txn: OpaquePointer?) -> Int32 { mdb_txn_commit(txn) }

    @inline(__always)
    static func txnAbort(_ txn: OpaquePointer?) { mdb_txn_abort(txn) }

    // MARK: Tables

    /// `mdb_dbi_open` of the main database (a NULL name), whose keys name the others.
    @inline(__always)
    static func dbiOpenMain(_ txn: OpaquePointer?, _ dbi: inout MDB_dbi) -> Int32 { mdb_dbi_open(txn, nil, 0, &dbi) }

    @inline(__always)
    static func dbiOpen(_ txn: OpaquePointer?, _ name: String, _ flags: UInt32, _ dbi: inout MDB_dbi) -> Int32 {
        mdb_dbi_open(txn, name, flags, &dbi)
    }

    @inline(__always)
    static func drop(_ txn: OpaquePointer?, _ dbi: MDB_dbi, _ delete: Int32) -> Int32 { mdb_drop(txn, dbi, delete) }

    @inline(__always)
    static func stat(_ txn: OpaquePointer?, _ dbi: MDB_dbi, _ stat: inout MDB_stat) -> Int32 {
        mdb_stat(txn, dbi, &stat)
    }

    @inline(__always)
    static func get(_ txn: OpaquePointer?, _ dbi: MDB_dbi, _ key: inout MDB_val, _ value: inout MDB_val) -> Int32 {
        mdb_get(txn, dbi, &key, &value)
    }

    /// `mdb_del` of `key` whatever its value (the tables hold one value per key).
    @inline(__always)
    static func del(_ txn: OpaquePointer?, _ dbi: MDB_dbi, _ key: inout MDB_val) -> Int32 {
        mdb_del(txn, dbi, &key, nil)
    }

    // MARK: Cursors

    @inline(__always)
    static func cursorOpen(_ txn: OpaquePointer?, _ dbi: MDB_dbi, _ cursor: inout OpaquePointer?) -> Int32 {
        mdb_cursor_open(txn, dbi, &cursor)
    }

    @inline(__always)
    static func cursorClose(_ cursor: OpaquePointer?) { mdb_cursor_close(cursor) }

    @inline(__always)
    static func cursorGet(
        _ cursor: OpaquePointer?, _ key: inout MDB_val, _ value: inout MDB_val, _ op: MDB_cursor_op
    ) -> Int32 {
        mdb_cursor_get(cursor, &key, &value, op)
    }

    @inline(__always)
    static func cursorDel(_ cursor: OpaquePointer?, _ flags: UInt32) -> Int32 { mdb_cursor_del(cursor, flags) }

    // MARK: Errors

    @inline(__always)
    static func strerror(_ rc: Int32) -> UnsafeMutablePointer<CChar> { mdb_strerror(rc) }
}

/// Fault injection for one environment's LMDB seam (tests only).
package final class LMDBFaults: Sendable {
    /// A call site in the seam.
    package enum Site: Hashable, Sendable {
        /// `mdb_txn_begin` of a read-only transaction, of a write transaction.
        case readBegin, writeBegin
        case commit, put, setMapSize
    }

    private let table = Mutex<[Site: [Int32]]>([:])
    /// Set by the first ``inject(_:at:times:)`` and never cleared: until then ``take(_:)`` is one atomic
    /// load, not a lock and a lookup, on every `mdb_put` of every event appended (production never
    /// injects).
    private let armed = Atomic<Bool>(false)

    init() {}

    /// Makes the next `times` calls at `site` return `code` instead of calling LMDB.
    package func inject(_ code: Int32, at site: Site, times: Int = 1) {
        table.withLock { $0[site, default: []].append(contentsOf: repeatElement(code, count: times)) }
        armed.store(true, ordering: .releasing)
    }

    /// Removes every injected fault.
    package func reset() { table.withLock { $0.removeAll() } }

    func take(_ site: Site) -> Int32? {
        guard armed.load(ordering: .acquiring) else { return nil }
        return table.withLock { faults in
            guard var queue = faults[site], !queue.isEmpty else { return nil }
            let rc = queue.removeFirst()
            faults[site] = queue.isEmpty ? nil : queue
            return rc
        }
    }
}
