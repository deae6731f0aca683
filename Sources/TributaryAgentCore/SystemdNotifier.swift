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
    /// `STOPPING=1`, and `EXTEND_TIMEOUT_USEC=` so systemd waits for the stop budget.
    public func stopping(extendBy: Duration?) {
        var message = "STOPPING=1\nSTATUS=stopping"
        if let extendBy { message += "\nEXTEND_TIMEOUT_USEC=\(Int64(extendBy.seconds * 1_000_000))" }
        send(message)
    }
}
