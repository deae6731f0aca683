import CLMDB
import Foundation
import Synchronization

/// Restarts, once a second, every wait for one of LMDB's two process-shared mutexes (the writer's and
/// the reader table's) in the lock files this process has open, while this process may be waiting.
///
/// The mutexes are robust: when a process dies holding one, the kernel marks its word owner-died and
/// wakes a waiter, which takes the mutex over (`EOWNERDEAD`; LMDB drops the dead transaction) and
/// carries on. Once, on this project's test machine, that wake-up was lost: two producers waited in
/// `pthread_mutex_lock` for minutes on a mutex whose owner was dead, until a debugger attached to one
/// and its wait was restarted (docs/store-format.md). A `FUTEX_WAKE` on the mutex's word restarts
/// every wait on it: a waiter whose owner died takes the mutex over; one whose owner lives waits again.
/// Spurious wake-ups are part of a futex's contract, which glibc's mutexes keep; the cost is a system
/// call per word per second, and per waiter one more look at the word.
///
/// Where the words are is LMDB's lock file layout (0.9.x on Linux with POSIX robust mutexes), read in
/// LMDB's own mapping of the file: the header's magic and format are checked, and each mutex must be
/// robust and process-shared, before its word is watched. Any other layout leaves a store unwatched.
///
/// Only this process's own waits are its watch's business, and they are all in a transaction's begin
/// (``beginning(_:)``, around every `mdb_txn_begin` and `mdb_reader_check`): a second in which no begin
/// started and none is under way puts the thread to sleep on a semaphore, and the next begin wakes it.
/// An idle process (the agent with nothing to send) is not woken once a second for nothing; a busy
/// one pays two atomic additions per transaction, and a semaphore signal after an idle second.
final class LockWordWatch: Sendable {
    /// The process's one watch.
    static let shared = LockWordWatch()

    /// The first bytes of a lock file, as LMDB 0.9.x writes them: `mti_magic`.
    static let lockMagic: UInt32 = 0xBEEF_C0DE
    /// `mti_format`: lock file version 1, with `MDB_PIDLOCK`.
    static let lockFormat: UInt32 = 0x0001_0001
    /// Offsets of the reader table's mutex (`mti_rmutex`, after the magic and format) and the writer's
    /// (`mti_wmutex`, the next 64-byte cache line) in the lock file.
    static let mutexOffsets = [8, 64]
    /// glibc's `pthread_mutex_t.__kind` (at byte 16) bits for a robust and for a process-shared mutex.
    private static let robustKind: Int32 = 0x10
    private static let sharedKind: Int32 = 0x80

    /// The watched words (addresses in the lock file mappings) of each open environment. The wakes run
    /// under this lock, so a word is never woken after ``unwatch(_:)`` returned (its mapping may be gone).
    private let words = Mutex<[ObjectIdentifier: [UInt]]>([:])
    /// The process the thread that wakes the words was started in (with the first watched store), or
    /// 0: a process forked from it has no such thread, and starts its own.
    private let runningIn = Mutex<pid_t>(0)
    /// Begins started, ever (the watch compares it across a second), and begins under way now.
    private let begun = Atomic<UInt64>(0)
    private let inBegin = Atomic<Int>(0)
    /// Whether the thread sleeps until the next begin, which then signals ``resume``.
    private let parked = Atomic<Bool>(false)
    private let resume = DispatchSemaphore(value: 0)

    /// Runs `body`, a call that may wait for one of the lock file's mutexes: the watch wakes the words
    /// once a second while it runs.
    @inline(__always)
    func beginning<T>(_ body: () -> T) -> T {
        inBegin.add(1, ordering: .sequentiallyConsistent)
        begun.add(1, ordering: .sequentiallyConsistent)
        if parked.load(ordering: .sequentiallyConsistent) && parked.exchange(false, ordering: .sequentiallyConsistent) {
            resume.signal()
        }
        defer { inBegin.subtract(1, ordering: .sequentiallyConsistent) }
        return body()
    }

    /// Watches the mutex words of the lock file LMDB mapped at `lockMapping`, for `owner` (an open
    /// environment); returns the words' addresses, or nil when the layout is not the known one.
    func watch(_ owner: AnyObject, lockMapping start: UInt) -> [UInt]? {
        guard let found = Self.mutexWords(lockMapping: start) else { return nil }
        words.withLock { $0[ObjectIdentifier(owner)] = found }
        let start = runningIn.withLock { pid in
            defer { pid = getpid() }
            return pid != getpid()
        }
        if start { Thread.detachNewThread { [self] in wakeForever() } }
        return found
    }

    /// Stops watching `owner`'s words; call it before the environment unmaps its lock file.
    func unwatch(_ owner: AnyObject) {
        _ = words.withLock { $0.removeValue(forKey: ObjectIdentifier(owner)) }
    }

    /// The mutex words of the lock file mapped at `start`, if its header and mutexes are the layout known.
    static func mutexWords(lockMapping start: UInt) -> [UInt]? {
        guard let base = UnsafeRawPointer(bitPattern: start),
            base.load(as: UInt32.self) == lockMagic,
            base.load(fromByteOffset: 4, as: UInt32.self) == lockFormat
        else { return nil }
        for offset in mutexOffsets {
            let kind = base.load(fromByteOffset: offset + 16, as: Int32.self)
            guard kind & robustKind != 0, kind & sharedKind != 0 else { return nil }
        }
        return mutexOffsets.map { start + UInt($0) }
    }

    private func wakeForever() {
        var seen = begun.load(ordering: .sequentiallyConsistent)
        while true {
            sleep(1)
            words.withLock { watched in
                for word in watched.values.joined() { _ = tributary_futex_wake_all(UnsafeRawPointer(bitPattern: word)) }
            }
            if begun.load(ordering: .sequentiallyConsistent) == seen && inBegin.load(ordering: .sequentiallyConsistent) == 0 {
                parked.store(true, ordering: .sequentiallyConsistent)
                // A begin that started before the flag was up did not see it: look again. If a begin
                // took the flag down meanwhile, its signal is on the way and the wait returns at once.
                let quiet = begun.load(ordering: .sequentiallyConsistent) == seen
                    && inBegin.load(ordering: .sequentiallyConsistent) == 0
                if quiet || !parked.exchange(false, ordering: .sequentiallyConsistent) { resume.wait() }
            }
            seen = begun.load(ordering: .sequentiallyConsistent)
        }
    }
}
