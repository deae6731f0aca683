import NIOPosix

/// Where the agent's run executes: threads of its own rather than Swift's cooperative pool.
///
/// The run blocks its threads on purpose: SQLite commits with an fsync, LMDB reads that fault pages
/// in, the store's write lock. The cooperative pool is as wide as the machine has CPUs (2 here), so a
/// blocked drain and a read-ahead used to hold every thread of it, and the HTTP client's request, the
/// metrics endpoint and the signal handler waited. The run (``Agent/runOnce()``, ``Agent/run()``)
/// prefers this executor (SE-0417 task executor preference): the run's task and every child task it
/// starts run their jobs on the threads of a `NIOThreadPool`, and the rest of the process stays free
/// for what only awaits.
///
/// Not a dispatch queue: its first job would start libdispatch's worker pool and the pool's monitor,
/// which wakes the process once a second for as long as it lives (``EventLoopSleep``). The pool's
/// threads wait on a condition variable and wake only for a job. Their number is fixed: an agent's run
/// blocks at most four at once (the loop's drain, the read-ahead, the acknowledgement, the status),
/// and none waits for another job of the pool, so a fuller pool only queues; the rest is headroom for
/// a test process that runs many agents at once.
final class IOExecutor: TaskExecutor {
    /// The one the agent uses.
    static let shared = IOExecutor(threads: 16)

    private let pool: NIOThreadPool

    init(threads: Int) {
        pool = NIOThreadPool(numberOfThreads: threads)
        pool.start()
    }

    func enqueue(_ job: UnownedJob) {
        let executor = asUnownedTaskExecutor()
        // The pool is never shut down (the executor lives as long as the process), so every job runs.
        pool.submit { _ in job.runSynchronously(on: executor) }
    }

    func asUnownedTaskExecutor() -> UnownedTaskExecutor { UnownedTaskExecutor(ordinary: self) }
}
