import CLMDB

#if canImport(Glibc)
import Glibc
#endif

// MARK: Reader table

extension Environment {
    /// lmdb.h: "mdb_reader_check: Check for stale entries in the reader lock table." Returns how many
    /// slots of dead processes were cleared.
    func clearStaleReaders() throws(StoreError) -> Int {
        var dead: Int32 = 0
        try Environment.mapError(MDB.readerCheck(env, &dead), "mdb_reader_check", path: path)
        return Int(dead)
    }

    /// The lines of `mdb_reader_list` ("pid thread txnid"), without its header; one per occupied slot.
    func readerSlots() -> [String] {
        final class Lines { var text = "" }
        let lines = Lines()
        _ = MDB.readerList(env, { message, context in
            guard let message, let context else { return 0 }
            Unmanaged<Lines>.fromOpaque(context).takeUnretainedValue().text += String(cString: message)
            return 0
        }, Unmanaged.passUnretained(lines).toOpaque())
        return withExtendedLifetime(lines) {
            lines.text.split(separator: "\n").map { String($0.drop(while: { $0 == " " })) }
                .filter { !$0.isEmpty && !$0.hasPrefix("pid") && $0 != "(no active readers)" }
        }
    }

    /// How long a read that found every reader slot taken waits for the writer lock, which the write
    /// transaction it then runs in needs, before it fails as ``StoreError/Code/busy``.
    static let readerFallbackWait: Duration = .seconds(2)

    /// Whether the store's writer lock (LMDB's `mti_wmutex` in the lock file) is free, or becomes free
    /// within `limit`, looked at every 2 ms. True when its word is not known (``watchedLockWords``): the
    /// write then waits as LMDB waits, without a bound.
    func writerLockFree(within limit: Duration) -> Bool {
        Self.writerLockFree(watchedLockWords?[1], within: limit)
    }

    /// ``writerLockFree(within:)`` for the mutex word at `word` (nil: not known, true).
    ///
    /// glibc's robust mutex word holds its owner's thread id in its low 30 bits (0: free; with only
    /// `FUTEX_OWNER_DIED` set, its owner died and the next locker takes it over) and `FUTEX_WAITERS` in
    /// bit 31. A writer that takes the lock between this look and the write's `mdb_txn_begin`, and stops
    /// (SIGSTOP) within its transaction, still holds the read up: the bound is for a writer already
    /// stopped, or slow, when the read comes.
    static func writerLockFree(_ word: UInt?, within limit: Duration) -> Bool {
        guard let word, let pointer = UnsafeRawPointer(bitPattern: word) else { return true }
        let clock = ContinuousClock()
        let deadline = clock.now.advanced(by: limit)
        while true {
            if pointer.load(as: UInt32.self) & 0x3FFF_FFFF == 0 { return true }
            if clock.now >= deadline { return false }
            usleep(2_000)
        }
    }

    /// The error of a read that found every reader slot taken and the writer lock held past
    /// ``readerFallbackWait``.
    static func readersFullBusy(_ path: String) -> StoreError {
        StoreError(
            .busy,
            "Every reader slot of the store \(path) is taken by a live process, and the writer lock, under which a "
                + "read then runs, has been held by another process (stopped, or slow) for over \(readerFallbackWait). "
                + "Nothing was read; try again.")
    }
}
