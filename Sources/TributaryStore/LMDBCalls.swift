import CLMDB
import Synchronization

/// The seam through which TributaryStore calls liblmdb where a call can fail.
///
/// Tests need to reproduce failures that cannot be produced for real on demand (`EIO` from a commit,
/// `MDB_MAP_FULL` at an exact call). Each environment owns an ``LMDBFaults`` table; in production it
/// is empty and every function here is a direct call.
struct MDB {
    let faults: LMDBFaults

    func txnBegin(_ env: OpaquePointer, _ flags: UInt32, _ txn: inout OpaquePointer?) -> Int32 {
        if let rc = faults.take(flags & UInt32(MDB_RDONLY) != 0 ? .readBegin : .writeBegin) { return rc }
        return mdb_txn_begin(env, nil, flags, &txn)
    }

    func txnCommit(_ txn: OpaquePointer) -> Int32 {
        if let rc = faults.take(.commit) {
            mdb_txn_abort(txn)  // a failed mdb_txn_commit frees the transaction too
            return rc
        }
        return mdb_txn_commit(txn)
    }

    func put(
        _ txn: OpaquePointer, _ dbi: MDB_dbi, _ key: inout MDB_val, _ value: inout MDB_val, _ flags: UInt32
    ) -> Int32 {
        if let rc = faults.take(.put) { return rc }
        return mdb_put(txn, dbi, &key, &value, flags)
    }

    func setMapSize(_ env: OpaquePointer, _ size: Int) -> Int32 {
        if let rc = faults.take(.setMapSize) { return rc }
        return mdb_env_set_mapsize(env, size)
    }
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

    init() {}

    /// Makes the next `times` calls at `site` return `code` instead of calling LMDB.
    package func inject(_ code: Int32, at site: Site, times: Int = 1) {
        table.withLock { $0[site, default: []].append(contentsOf: repeatElement(code, count: times)) }
    }

    /// Removes every injected fault.
    package func reset() { table.withLock { $0.removeAll() } }

    func take(_ site: Site) -> Int32? {
        table.withLock { faults in
            guard var queue = faults[site], !queue.isEmpty else { return nil }
            let rc = queue.removeFirst()
            faults[site] = queue.isEmpty ? nil : queue
            return rc
        }
    }
}
