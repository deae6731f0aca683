#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// A process-local reader–writer lock (pthread).
///
/// LMDB requires that `mdb_env_set_mapsize` is called only while the calling process has no active
/// transaction, so every transaction holds this lock shared and a map resize holds it exclusively.
final class ReadWriteLock: @unchecked Sendable {
    private let lock = UnsafeMutablePointer<pthread_rwlock_t>.allocate(capacity: 1)

    init() {
        lock.initialize(to: pthread_rwlock_t())
        let rc = pthread_rwlock_init(lock, nil)
        precondition(rc == 0, "pthread_rwlock_init failed: \(rc)")
    }

    deinit {
        pthread_rwlock_destroy(lock)
        lock.deallocate()
    }

    func withReadLock<T, E: Error>(_ body: () throws(E) -> T) throws(E) -> T {
        pthread_rwlock_rdlock(lock)
        defer { pthread_rwlock_unlock(lock) }
        return try body()
    }

    func withWriteLock<T, E: Error>(_ body: () throws(E) -> T) throws(E) -> T {
        pthread_rwlock_wrlock(lock)
        defer { pthread_rwlock_unlock(lock) }
        return try body()
    }

    /// ``withWriteLock(_:)``, waiting at most `limit` for the lock (tried every millisecond; glibc's
    /// `pthread_rwlock_clockwrlock` is not visible to Swift); nil, `body` not run, when it was not free.
    func withWriteLock<T, E: Error>(waitingAtMost limit: Duration, _ body: () throws(E) -> T) throws(E) -> T? {
        let giveUp = ContinuousClock.now.advanced(by: limit)
        while pthread_rwlock_trywrlock(lock) != 0 {
            guard ContinuousClock.now < giveUp else { return nil }
            usleep(1_000)
        }
        defer { pthread_rwlock_unlock(lock) }
        return try body()
    }
}
