import CLMDB
import Foundation
import Synchronization

/// Restarts, once a second, every wait for one of LMDB's two process-shared mutexes (the writer's and
/// the reader table's) in the lock files this process has open.
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
        while true {
            sleep(1)
            words.withLock { watched in
                for word in watched.values.joined() { _ = tributary_futex_wake_all(UnsafeRawPointer(bitPattern: word)) }
            }
        }
    }
}
