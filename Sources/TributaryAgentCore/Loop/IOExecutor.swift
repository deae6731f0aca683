import Dispatch

/// Where the agent's run executes: threads of its own rather than Swift's cooperative pool.
///
/// The run blocks its threads on purpose: SQLite commits with an fsync, LMDB reads that fault pages
/// in, the store's write lock. The cooperative pool is as wide as the machine has CPUs (2 here), so a
/// blocked drain and a read-ahead used to hold every thread of it, and the HTTP client's request, the
/// metrics endpoint and the signal handler waited. The run (``Agent/runOnce()``, ``Agent/run()``)
/// prefers this executor (SE-0417 task executor preference): the run's task and every child task it
/// starts run their jobs on a concurrent dispatch queue, whose worker threads libdispatch adds beyond
/// the CPU count while some are blocked (an overcommitting queue), and the cooperative pool stays free
/// for what only awaits.
final class IOExecutor: TaskExecutor {
    /// The one the agent uses.
    static let shared = IOExecutor(label: "tributary.agent.io")

    private let queue: DispatchQueue

    init(label: String) {
        queue = DispatchQueue(label: label, attributes: .concurrent)
    }

    func enqueue(_ job: UnownedJob) {
        let executor = asUnownedTaskExecutor()
        queue.async { job.runSynchronously(on: executor) }
    }

    func asUnownedTaskExecutor() -> UnownedTaskExecutor { UnownedTaskExecutor(ordinary: self) }
}
