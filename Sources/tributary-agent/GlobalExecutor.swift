import CTributaryExecutorHook
import NIOCore
import NIOPosix
import Synchronization

/// Swift's global executor moved onto SwiftNIO's event loops, for the agent's process.
///
/// Why: on Linux the global executor is libdispatch's global queues, and the first worker thread of
/// those starts libdispatch's pool monitor, a timer that wakes the process once a second for as long
/// as it lives (`_dispatch_workq_monitor_pools`). An idle agent should not wake at all
/// (docs/agent-core.md, "Tasks and threads"); the event loops sleep in `epoll_wait` until there is
/// work. The blocking work runs on the agent's own threads (`IOExecutor`) either way.
///
/// Why not SwiftNIO's own `unsafeTryInstallSingletonPosixEventLoopGroupAsConcurrencyGlobalExecutor()`,
/// which does the same: it finds the hook with `dlsym`, and in a binary built with
/// `--static-swift-stdlib` (every release build, the .deb) the hook is not in the dynamic symbol
/// table. Measured on the release agent: the call returned false, and the idle agent woke 60 times a
/// minute on libdispatch's monitor. Here the hook's address comes from the linker
/// (`CTributaryExecutorHook`), in both kinds of build; the rest is what SwiftNIO's function does.
enum GlobalExecutor {
    /// The hook's type in the runtime: the job, and the function the runtime would have called.
    private typealias EnqueueHook = @convention(thin) (UnownedJob, @convention(thin) (UnownedJob) -> Void) -> Void

    /// Whether ``moveToEventLoops()`` did.
    static let moved = Atomic<Bool>(false)

    /// Sends every job of Swift's global executor to an event loop of SwiftNIO's singleton group,
    /// unless a hook is set already (then nothing changes, and ``moved`` stays false). Call it once,
    /// first thing in `main`, before another thread exists that could enqueue a job.
    static func moveToEventLoops() {
        let slot = tributary_swift_task_enqueue_global_hook()
        guard slot.pointee == nil else { return }
        let hook: EnqueueHook = { job, _ in
            // `any()` stays on the current loop when called from one of the group's, as SwiftNIO's does.
            let loop = MultiThreadedEventLoopGroup.singleton.any()
            loop.execute { job.runSynchronously(on: loop.executor.asUnownedSerialExecutor()) }
        }
        slot.pointee = unsafeBitCast(hook, to: UnsafeMutableRawPointer.self)
        moved.store(true, ordering: .relaxed)
    }
}
