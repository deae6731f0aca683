import CLMDB

#if canImport(Glibc)
import Glibc
#endif

// MARK: Room for appends

extension Environment {
    /// The part of the quota appends leave free: 1/64 of it, at least 32 pages. LMDB copies every page
    /// it changes and records the pages it frees, so deleting events needs fresh pages too; if appends
    /// could fill the whole quota, the agent's drain could never delete what it moved to the outbox, and
    /// the store would stay full for good.
    var reserve: Int { Self.reserve(quota: quota, pageSize: pageSize) }

    /// ``reserve`` for a store of `quota` bytes in pages of `pageSize` bytes.
    static func reserve(quota: Int, pageSize: Int) -> Int { max(quota / 64, 32 * pageSize) }

    /// The page size LMDB gives a store it creates here: the system's, at most LMDB's largest (32 KiB).
    static let newStorePageSize = min(Int(sysconf(Int32(_SC_PAGESIZE))), 32 << 10)

    /// The bytes a record of `encodedSize` bytes takes in the events table: a record over about half
    /// a page goes to overflow pages of its own, whole pages; a smaller one shares a leaf page.
    static func footprint(ofRecord encodedSize: Int, pageSize: Int) -> Int {
        let node = encodedSize + 8 + 8  // the 8-byte key and LMDB's node header
        guard node > pageSize / 2 - 16 else { return node + 2 }  // and its 2-byte slot in the page
        let overflow = encodedSize + 16  // LMDB's page header
        return (overflow + pageSize - 1) / pageSize * pageSize
    }

    /// An append's room check: throws ``StoreError/Code/storeFull`` unless records taking `bytes` (see
    /// ``footprint(ofRecord:pageSize:)``) leave ``reserve`` of the quota free.
    ///
    /// Made inside the append's write transaction, before each record is put, with the running total:
    /// an append that does not fit stops at its first record that does not (a group commit that does not
    /// fit is split and tried again, so a refused attempt must cost little under the writer lock). It
    /// reads what the last commit left once: the file's high-water mark and, only when that alone is too
    /// close to the quota, the free list.
    struct RoomCheck {
        private let environment: Environment
        private let highWater: Int
        /// The quota less the reserve left for the agent's deletes.
        private let limit: Int
        private var freeBytes: Int?

        init(_ environment: Environment) {
            self.environment = environment
            var info = MDB_envinfo()
            MDB.envInfo(environment.env, &info)
            highWater = (info.me_last_pgno + 1) * environment.pageSize
            limit = environment.quota - environment.reserve
        }

        mutating func check(adding bytes: Int) throws(StoreError) {
            let need = bytes + 8 * environment.pageSize  // and the pages its tree paths, meta and registration copy
            if highWater + need <= limit { return }
            let free = freeBytes ?? environment.freePages() * environment.pageSize
            freeBytes = free
            guard highWater - free + need <= limit else {
                throw StoreError(
                    .storeFull,
                    "The shared store \(environment.path) reached its quota of \(environment.quota) bytes (appends leave "
                        + "\(environment.reserve) of them for the agent's deletes). Nothing was written; start the agent to "
                        + "drain it, or raise the quota.")
            }
        }
    }

    /// The pages on LMDB's free list as the last commit left them (`mdb_stat -f` counts them the same
    /// way), read in a read-only transaction of its own: LMDB opens no cursor on the free list in a write
    /// transaction, and `MDB_NOTLS` lets this thread hold both. 0 when it cannot be read (the append is
    /// then judged by the high-water mark alone).
    fileprivate func freePages() -> Int {
        var txn: OpaquePointer?
        guard MDB.txnBegin(env, UInt32(MDB_RDONLY), &txn) == MDB_SUCCESS, let txn else { return 0 }
        defer { MDB.txnAbort(txn) }
        var cursor: OpaquePointer?
        guard MDB.cursorOpen(txn, 0, &cursor) == MDB_SUCCESS, let cursor else { return 0 }  // dbi 0: FREE_DBI
        defer { MDB.cursorClose(cursor) }
        var key = MDB_val()
        var value = MDB_val()
        var total = 0
        var op = MDB_FIRST
        while MDB.cursorGet(cursor, &key, &value, op) == MDB_SUCCESS {
            // A record is an array of page numbers (size_t) whose first element is their count.
            if value.mv_size >= MemoryLayout<Int>.size, let data = value.mv_data {
                total += data.loadUnaligned(as: Int.self)
            }
            op = MDB_NEXT
        }
        return total
    }
}
