import NIOCore
import NIOPosix

/// Sleeps on a timer of SwiftNIO's singleton event loops, where the agent would otherwise call
/// `Task.sleep`.
///
/// Why not `Task.sleep`: on Linux, Swift 6.3 sends every sleep to libdispatch (`dispatch_after` onto a
/// global queue, whose job then runs on one of libdispatch's worker threads). The first worker thread
/// of a process starts libdispatch's pool monitor, a timer that wakes the process once a second for
/// as long as it lives (`_dispatch_workq_monitor_pools`), where an idle agent should not wake at all
/// (docs/performance.md, "On a device"). Neither documented way around it holds in Swift 6.3: its
/// `Task.sleep` does not consult `swift_task_enqueueGlobalWithDeadline_hook`, and a custom default
/// executor is SPI. An event loop's timer is its `epoll_wait` timeout: it wakes the loop once, when due.
///
/// The deadline is `ContinuousClock`'s (`CLOCK_BOOTTIME`), NIO's timers run on `CLOCK_MONOTONIC`:
/// the sleep looks at the time again when its timer fires and sleeps the rest, so it never returns
/// early. Over a system suspend it can return late by as long as the machine slept.
public enum EventLoopSleep {
    /// The loop every timer runs on: one loop, so a sleeper's next timer is usually set while that loop
    /// is awake anyway (setting one from another thread wakes the loop it goes to).
    static let loop = MultiThreadedEventLoopGroup.singleton.next()
    /// The longest single timer: a sleep past it is several timers, each checking the time again.
    static let longestTimer = Duration.seconds(86_400)

    /// Returns at `deadline`, or throws `CancellationError` once the task is cancelled.
    public static func sleep(until deadline: ContinuousClock.Instant) async throws {
        try await sleep(until: deadline, timersOf: longestTimer)
    }

    /// The same, with timers of at most `longest` each (a test's way to see a long sleep split).
    static func sleep(until deadline: ContinuousClock.Instant, timersOf longest: Duration) async throws {
        while true {
            try Task.checkCancellation()
            let left = ContinuousClock.now.duration(to: deadline)
            guard left > .zero else { return }
            try await timer(min(left, longest))
        }
    }

    /// One timer of `duration` on ``loop``.
    private static func timer(_ duration: Duration) async throws {
        let scheduled = loop.scheduleTask(in: TimeAmount(duration)) {}
        do {
            try await withTaskCancellationHandler {
                try await scheduled.futureResult.get()
            } onCancel: {
                scheduled.cancel()
            }
        } catch EventLoopError.cancelled {
            throw CancellationError()
        }
    }
}
