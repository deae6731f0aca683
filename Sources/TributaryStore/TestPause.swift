#if canImport(Glibc)
import Glibc
#endif

/// Named points where a process freezes, so a test can kill it there or act while it waits.
///
/// `TRIBUTARY_TEST_PAUSE_AT=name` (or `name:N`, the N-th time) makes the process write
/// `PAUSED name` to stdout at that point and then:
/// - at `store.read` (inside a read transaction: a reader slot is taken) and `store.append` (inside a
///   write transaction, records put, not committed: the writer lock is held), sleep forever; the
///   test sends SIGKILL;
/// - at `store.open` (the LMDB environment open, its map sized, no transaction begun yet), stop
///   itself with SIGSTOP; the test acts (grows the store from another process) and sends SIGCONT.
///
/// Unset in production: one cached lookup.
public enum TestPause {
    /// The names a test may use.
    public static let names = ["store.read", "store.append", "store.open"]

    private static let target: (name: String, hit: Int)? = {
        guard let raw = getenv("TRIBUTARY_TEST_PAUSE_AT").map({ String(cString: $0) }), !raw.isEmpty else { return nil }
        let parts = raw.split(separator: ":")
        return (String(parts[0]), parts.count > 1 ? Int(parts[1]) ?? 1 : 1)
    }()

    private static let counter = PauseCounter()

    /// What the process does once paused.
    enum Wait {
        /// Sleeps forever, for the test to kill it.
        case untilKilled
        /// Stops itself (SIGSTOP), for the test to act and send SIGCONT.
        case untilContinued
    }

    /// Freezes the process if `name` is the configured point and its hit has come.
    @inline(__always)
    static func hit(_ name: StaticString, wait: Wait = .untilKilled) {
        guard let target else { return }
        let current = "\(name)"
        guard current == target.name, counter.increment() == target.hit else { return }
        let line = Array("PAUSED \(current)\n".utf8)
        _ = line.withUnsafeBytes { write(1, $0.baseAddress, $0.count) }
        switch wait {
        case .untilKilled: while true { pause() }
        case .untilContinued: raise(SIGSTOP)
        }
    }
}

import Synchronization

private final class PauseCounter: Sendable {
    private let value = Atomic<Int>(0)
    func increment() -> Int { value.add(1, ordering: .relaxed).newValue }
}
