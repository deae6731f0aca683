#if canImport(Glibc)
import Glibc
#endif

/// Named points where the agent can kill itself with SIGKILL, for crash tests.
///
/// `TRIBUTARY_CRASH_AT=name` kills the process the first time it reaches point `name`;
/// `TRIBUTARY_CRASH_AT=name:N` the N-th time. Points:
/// `drain.before-outbox-commit`, `drain.after-outbox-commit`, `upload.after-send`,
/// `upload.after-ack`, `upload.before-deferred-ack` (the next batch's request out, the acknowledged
/// batch not yet recorded in the outbox), `deadletter.before-commit`. Unset in production: one cached lookup.
public enum CrashPoint {
    /// The names a test may use.
    public static let names = [
        "drain.before-outbox-commit", "drain.after-outbox-commit", "upload.after-send", "upload.after-ack",
        "upload.before-deferred-ack", "deadletter.before-commit",
    ]

    private static let target: (name: String, hit: Int)? = {
        guard let raw = getenv("TRIBUTARY_CRASH_AT").map({ String(cString: $0) }), !raw.isEmpty else { return nil }
        let parts = raw.split(separator: ":")
        return (String(parts[0]), parts.count > 1 ? Int(parts[1]) ?? 1 : 1)
    }()

    private static let counter = HitCounter()

    /// Kills the process with SIGKILL if `name` is the configured crash point and its hit has come.
    @inline(__always)
    public static func hit(_ name: StaticString) {
        guard let target else { return }
        let current = "\(name)"
        guard current == target.name, counter.increment() == target.hit else { return }
        kill(getpid(), SIGKILL)
    }
}

import Synchronization

private final class HitCounter: Sendable {
    private let value = Atomic<Int>(0)
    func increment() -> Int { value.add(1, ordering: .relaxed).newValue }
}
