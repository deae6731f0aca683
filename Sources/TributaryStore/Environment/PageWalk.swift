import CLMDB

#if canImport(Glibc)
import Glibc
#endif

/// A walk of every page of a store, as `mdb_stat -f` and `mdb_dump -a` read them: the free list, the
/// main database, every named database, every key and every value (each page of it: overflow pages too).
///
/// LMDB trusts its file: it keeps no page checksums, and a page of garbage (a bad sector, a tool that
/// wrote over the file) sends its page walking into a pointer that is not one, a segfault or a bus
/// error rather than an error code. So the walk runs only in a child process of its own
/// (``StoreCheck``): what it finds, or its crash, is the verdict; the process that asked lives on.
enum PageWalk {
    /// How a walk ended: the process exit status of the walker.
    enum Outcome: Int32 {
        /// Every page read, every count as its database's header says.
        case intact = 0
        /// LMDB refused a page, a count or a page number did not add up, or the file was cut short.
        case damaged = 65
        /// The walk could not be made (the file could not be opened for another reason than damage, no
        /// reader slot): no verdict.
        case notWalked = 75
    }

    /// Walks the store whose data file is `path`; writes nothing, to the file or its lock file (beyond
    /// the reader slot every read takes). `reason` says what was found.
    static func walk(path: String) -> (outcome: Outcome, reason: String) {
        var handle: OpaquePointer?
        guard MDB.envCreate(&handle) == MDB_SUCCESS, let env = handle else { return (.notWalked, "mdb_env_create failed") }
        defer { MDB.envClose(env) }
        _ = MDB.envSetMaxDBs(env, 64)
        var rc = MDB.envOpen(env, path, UInt32(MDB_RDONLY | MDB_NOSUBDIR | MDB_NOTLS), 0o660)
        guard rc == MDB_SUCCESS else { return verdict(rc, "mdb_env_open") }
        let data = Environment.dataFile(of: env)
        do {
            try Environment.checkNotTruncated(env, data, path: path)
        } catch {
            return (.damaged, error.message)
        }
        var txn: OpaquePointer?
        rc = MDB.txnBegin(env, UInt32(MDB_RDONLY), &txn)
        guard rc == MDB_SUCCESS else { return verdict(rc, "mdb_txn_begin") }
        defer { MDB.txnAbort(txn) }
        // The last page in use, read after the snapshot began: producers commit while the agent walks, and
        // a store only grows, so the newest meta's last page bounds every page the snapshot can reach. Read
        // before it, a commit in between made the snapshot's own pages look past the end (a store judged
        // damaged and set aside in a kill loop with two producers writing).
        var info = MDB_envinfo()
        MDB.envInfo(env, &info)
        let lastPage = info.me_last_pgno
        // The free list (database 0): each value is a list of page numbers, its count first.
        let free = walkEntries(txn, 0) { _, value in
            let words = value.count / MemoryLayout<Int>.size
            guard words > 0 else { return "a free-list entry of \(value.count) bytes" }
            let count = value.loadUnaligned(as: Int.self)
            guard count >= 0, count < words else { return "a free-list entry counting \(count) pages in \(words - 1) words" }
            for index in 0..<count {
                let page = value.loadUnaligned(fromByteOffset: (index + 1) * MemoryLayout<Int>.size, as: Int.self)
                guard page >= 2, page <= lastPage else { return "free page \(page) outside the file's pages 2…\(lastPage)" }
            }
            return nil
        }
        if let free { return free }
        var main: MDB_dbi = 0
        rc = MDB.dbiOpenMain(txn, &main)
        guard rc == MDB_SUCCESS else { return verdict(rc, "mdb_dbi_open") }
        var names: [String] = []
        if let found = walkEntries(txn, main, { key, _ in
            // A Tributary store's table names are ASCII. Bytes read from a damaged page that are not text
            // (not UTF-8, or holding a NUL, which would end the C string early and open another table)
            // are no name LMDB can be asked for.
            guard !key.contains(0), let name = String(validating: key, as: UTF8.self) else {
                return "the main database lists a table whose name \(Array(key.prefix(16))) is not text: it cannot be opened by that name"
            }
            names.append(name)
            return nil
        }) {
            return found
        }
        for name in names {
            var dbi: MDB_dbi = 0
            rc = MDB.dbiOpen(txn, name, 0, &dbi)
            // MDB_INCOMPATIBLE: a plain key of the main database, not a named one (none in a Tributary store).
            if rc == MDB_INCOMPATIBLE { continue }
            // A name the main database lists that LMDB then does not find: the listing is damaged.
            if rc == MDB_NOTFOUND {
                return (.damaged, "the main database lists a table \(name.debugDescription) that cannot be opened by that name")
            }
            guard rc == MDB_SUCCESS else { return verdict(rc, "mdb_dbi_open \(name)") }
            if let found = walkEntries(txn, dbi, { _, _ in nil }) { return (found.outcome, "table \(name): " + found.reason) }
        }
        return (.intact, "every page of \(names.count) tables read")
    }

    /// Reads every entry of `dbi`, each key and value byte, checking its count against the database's
    /// header and each entry with `check` (a reason when it is wrong); nil when all is well.
    private static func walkEntries(
        _ txn: OpaquePointer?, _ dbi: MDB_dbi, _ check: (UnsafeRawBufferPointer, UnsafeRawBufferPointer) -> String?
    ) -> (outcome: Outcome, reason: String)? {
        var stat = MDB_stat()
        var rc = MDB.stat(txn, dbi, &stat)
        guard rc == MDB_SUCCESS else { return verdict(rc, "mdb_stat") }
        var cursor: OpaquePointer?
        rc = MDB.cursorOpen(txn, dbi, &cursor)
        guard rc == MDB_SUCCESS else { return verdict(rc, "mdb_cursor_open") }
        defer { MDB.cursorClose(cursor) }
        var key = MDB_val()
        var value = MDB_val()
        var entries = 0
        var sum: UInt8 = 0
        var op = MDB_FIRST
        while true {
            rc = MDB.cursorGet(cursor, &key, &value, op)
            op = MDB_NEXT
            if rc == MDB_NOTFOUND { break }
            guard rc == MDB_SUCCESS else { return verdict(rc, "mdb_cursor_get") }
            entries += 1
            let keyBytes = UnsafeRawBufferPointer(start: key.mv_data, count: key.mv_size)
            let valueBytes = UnsafeRawBufferPointer(start: value.mv_data, count: value.mv_size)
            // A byte of every 512 read, and the last: each page a key or value is on (a value's overflow
            // pages too) is mapped where its pointer says, inside the file.
            for bytes in [keyBytes, valueBytes] where !bytes.isEmpty {
                for offset in stride(from: 0, to: bytes.count, by: 512) { sum &+= bytes[offset] }
                sum &+= bytes[bytes.count - 1]
            }
            if let wrong = check(keyBytes, valueBytes) { return (.damaged, wrong) }
        }
        withExtendedLifetime(sum) {}
        guard entries == Int(stat.ms_entries) else {
            return (.damaged, "\(entries) entries walked where the database's header counts \(stat.ms_entries)")
        }
        return nil
    }

    /// The verdict on LMDB's `rc` from `call`: damage for the codes that say so, else no verdict.
    private static func verdict(_ rc: Int32, _ call: String) -> (outcome: Outcome, reason: String) {
        let text = "\(call): \(String(cString: MDB.strerror(rc)))"
        switch rc {
        case MDB_CORRUPTED, MDB_PAGE_NOTFOUND, MDB_INVALID, MDB_VERSION_MISMATCH, MDB_BAD_TXN, MDB_CURSOR_FULL,
            MDB_INCOMPATIBLE, MDB_BAD_VALSIZE, MDB_BAD_DBI, EINVAL:
            return (.damaged, text)
        case ENOMEM where call == "mdb_env_open":
            // The map size its meta page asks for cannot be mapped: garbage there (a store within its quota
            // maps in a 64-bit address space). No process could open it.
            return (.damaged, text + " (the map size its meta page says cannot be mapped)")
        default:
            return (.notWalked, text)
        }
    }
}
