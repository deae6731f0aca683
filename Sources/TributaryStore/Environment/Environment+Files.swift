import CLMDB
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

// MARK: The store's two files

extension Environment {
    /// Whether either of the store's two files is no longer the one this environment opened: the store
    /// was deleted, or deleted and created anew, since (what this process reads and writes, no other
    /// process sees), or its lock file was (processes that open the store now take another writer lock
    /// than this one: their writes and this process's are no longer serialised).
    var isReplaced: Bool { isDataFileReplaced || isLockFileReplaced }

    /// Whether `path` no longer names the data file this environment has open.
    var isDataFileReplaced: Bool {
        guard let file else { return false }
        guard let now = Self.identity(of: path) else { return true }
        return now != file
    }

    /// Whether `<path>-lock` no longer names the lock file this environment opened (false when its
    /// identity could not be had at open: it is then never taken for replaced).
    private var isLockFileReplaced: Bool { lockFile != nil && !isLockFileKept }

    /// Whether `<path>-lock` still names the lock file this environment opened.
    var isLockFileKept: Bool {
        guard let lockFile, let now = Self.identity(of: path + "-lock") else { return false }
        return now == lockFile
    }

    /// Throws ``StoreError/Code/storeReplaced`` when the data file this environment has open has no
    /// name left (deleted, or replaced by another file at the path): what a producer writes into it
    /// reaches no one. Called at the start of every producer write transaction (``SharedStore``'s
    /// `producerWrite`), so that the window in which a deletion can still go unnoticed is one
    /// transaction's.
    ///
    /// Asking the data file itself (`stat` or `fstat`) in every transaction made each commit's
    /// `fdatasync` about 30 µs slower on ext4 (Linux 6.18; one durable `track()` at a time: p50 275 →
    /// 310 µs, 10 % fewer events per second), most likely through multigrain time stamps (Linux 6.13
    /// and later): once its times have been read, the kernel gives the next write a fine-grained time
    /// stamp, which dirties the inode, which the sync then writes too. So the check reads the group
    /// directory's times instead (a removal or rename in it, or of it, changes them) and examines the
    /// files only when they changed: the data file's link count,
    /// and whether the path and the lock file's path still name the files this environment opened
    /// (a data file renamed or hard-linked away keeps a name; a kept lock file would be shared with
    /// the store now at the path). Directory times are trusted only once their change time (which no
    /// program can set) is 20 ms old, or 2 s when the file system keeps whole seconds: a second change
    /// within one tick of a coarse clock could leave them as they were.
    ///
    /// `drainingOldFile` (the agent's deletes): a data file deleted or replaced is no refusal, since the
    /// agent drains what is left in it to the end, but a lock file replaced beside a kept data file is:
    /// the processes that opened the store since write that same file under another writer lock.
    func checkNotReplaced(drainingOldFile: Bool = false) throws(StoreError) {
        guard let dataFD else { return }
        var clock = timespec()
        clock_gettime(CLOCK_REALTIME, &clock)
        var directory = Glibc.stat()
        var stamp: (modified: Int64, changed: Int64)?
        if directoryFD >= 0, fstat(directoryFD, &directory) == 0 {
            let now = (modified: Self.nanos(directory.st_mtim), changed: Self.nanos(directory.st_ctim))
            if directoryVerified.withLock({ $0.map { $0 == now } ?? false }) { return }
            stamp = now
        }
        var info = Glibc.stat()
        guard fstat(dataFD, &info) == 0 else { return }
        let lockKept = isLockFileKept
        let dataGone = info.st_nlink == 0 || isDataFileReplaced
        guard dataGone || (lockFile != nil && !lockKept) else {
            let settled = stamp.map { stamp in
                let coarse = stamp.changed % 1_000_000_000 == 0 && stamp.modified % 1_000_000_000 == 0
                return Self.nanos(clock) - stamp.changed > (coarse ? 2_000_000_000 : 20_000_000)
            } ?? false
            directoryVerified.withLock { $0 = settled ? stamp : nil }
            return
        }
        if drainingOldFile && dataGone { return }
        // Both files replaced: a new environment shares nothing with this one (Environment.open). One of
        // them kept: a new one would share it, so this one must be closed first.
        let reopen = dataGone && !lockKept
            ? "Open the store again: a new Tracker or SharedStore in this process, or restart it."
            : Self.releaseAdvice
        guard dataGone else {
            throw StoreError(
                .storeReplaced,
                "The lock file \(path)-lock was deleted or replaced while this process had the store open; nothing was "
                    + "written (the processes that opened the store since write it under another writer lock). " + reopen)
        }
        throw StoreError(
            .storeReplaced,
            "The shared store \(path) was deleted, moved or created anew while this process had it open; nothing was "
                + "written (no other process would ever read it). " + reopen)
    }

    private static func nanos(_ time: timespec) -> Int64 { Int64(time.tv_sec) * 1_000_000_000 + Int64(time.tv_nsec) }

    /// The device and inode of the file at `path`, or nil when it cannot be examined.
    static func identity(of path: String) -> (device: UInt64, inode: UInt64)? {
        var info = Glibc.stat()
        guard stat(path, &info) == 0 else { return nil }
        return (UInt64(info.st_dev), UInt64(info.st_ino))
    }

    /// The data file as an open finds it: LMDB's page size, and the file's descriptor and `fstat` (nil
    /// when LMDB gives no descriptor or the file cannot be stat'ed).
    struct DataFile {
        var pageSize: Int
        var fd: Int32?
        var stat: Glibc.stat?
    }

    static func dataFile(of handle: OpaquePointer) -> DataFile {
        var stat = MDB_stat()
        MDB.envStat(handle, &stat)
        var fd: Int32 = -1
        var info = Glibc.stat()
        guard MDB.envGetFD(handle, &fd) == MDB_SUCCESS, fstat(fd, &info) == 0 else {
            return DataFile(pageSize: Int(stat.ms_psize), fd: nil, stat: nil)
        }
        return DataFile(pageSize: Int(stat.ms_psize), fd: fd, stat: info)
    }

    /// Throws ``StoreError/Code/unreadableStore`` if the data file is shorter than the pages its newest
    /// meta page says are in use: a truncated copy (a backup cut short, a disk that filled while the file
    /// was copied). LMDB reads the store through its memory map, and a page past the end of the file is a
    /// SIGBUS that kills the process at its first read.
    ///
    /// The size is read after the meta page, not before: another process may commit meanwhile, and a store
    /// only grows, so a size read first could be short of the pages a newer meta reaches (a sound store
    /// judged cut short while producers wrote).
    static func checkNotTruncated(_ handle: OpaquePointer, _ data: DataFile, path: String) throws(StoreError) {
        guard let fd = data.fd else { return }
        var info = MDB_envinfo()
        MDB.envInfo(handle, &info)
        let needed = (info.me_last_pgno + 1) * data.pageSize
        var file = stat()
        guard fstat(fd, &file) == 0, Int(file.st_size) < needed else { return }
        throw StoreError(
            .unreadableStore,
            "The store \(path) is \(file.st_size) bytes long, shorter than the \(needed) bytes its pages reach: the "
                + "file was cut short (a copy or a backup that did not finish?). Nothing was read or written; move it "
                + "aside (a producer then creates a new store) or restore it whole.")
    }

    /// Size of the data file on disk, in bytes.
    var fileSize: Int {
        var st = stat()
        return stat(path, &st) == 0 ? Int(st.st_size) : 0
    }
}
