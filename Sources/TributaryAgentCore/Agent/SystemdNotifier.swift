import CSystemd
import Foundation

/// The systemd notify protocol (`Type=notify`): readiness, status lines, watchdog pings, stopping.
///
/// Every call is a no-op when `$NOTIFY_SOCKET` is unset (outside systemd).
public struct SystemdNotifier: Sendable {
    /// The watchdog interval systemd asked for (`WatchdogSec=`), if any; ping at half of it.
    public let watchdogInterval: Duration?

    /// Reads `$WATCHDOG_USEC` (and `$WATCHDOG_PID`) through `sd_watchdog_enabled`.
    public init() {
        var usec: UInt64 = 0
        watchdogInterval = sd_watchdog_enabled(0, &usec) > 0 && usec > 0 ? .microseconds(Int64(usec)) : nil
    }

    /// Sends raw `KEY=VALUE` lines.
    @discardableResult
    public func send(_ lines: String) -> Bool { sd_notify(0, lines) > 0 }

    /// `READY=1` with a status line.
    public func ready(status: String) { send("READY=1\nSTATUS=\(status)") }
    /// `STATUS=…`.
    public func status(_ text: String) { send("STATUS=\(text)") }
    /// `WATCHDOG=1`.
    public func watchdog() { send("WATCHDOG=1") }
    /// Runs `work` (a long start-up step: an outbox migration) while keeping systemd's start timeout
    /// from expiring: `EXTEND_TIMEOUT_USEC=` for 60 s now and every 20 s (on the monotonic clock)
    /// until `work` returns, for at most 30 minutes: a step stuck that long (in I/O) is left to the
    /// start timeout.
    public func extendingStart<T>(status: String, _ work: () throws -> T) rethrows -> T {
        let extension_ = "EXTEND_TIMEOUT_USEC=\(Self.startExtension.components.seconds * 1_000_000)"
        guard send("STATUS=\(status)\n" + extension_) else { return try work() }
        let done = DispatchSemaphore(value: 0)
        Thread.detachNewThread { [self] in
            for _ in 0..<Self.maxStartExtensions {
                guard done.wait(timeout: .now() + 20) == .timedOut else { return }
                send(extension_)
            }
        }
        defer { done.signal() }
        return try work()
    }

    /// How far each extension of the start timeout reaches.
    static let startExtension: Duration = .seconds(60)
    /// Extensions after the first, 20 s apart: 30 minutes in all.
    static let maxStartExtensions = 90

    /// `STOPPING=1`, and `EXTEND_TIMEOUT_USEC=` so systemd waits for the stop budget.
    public func stopping(extendBy: Duration?) {
        var message = "STOPPING=1\nSTATUS=stopping"
        if let extendBy { message += "\nEXTEND_TIMEOUT_USEC=\(Int64(extendBy.seconds * 1_000_000))" }
        send(message)
    }
}
