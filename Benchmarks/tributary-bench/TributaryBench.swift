import ArgumentParser

/// `make bench`: producer throughput and commit latency of Tributary next to a C baseline doing the
/// same LMDB work, both measured in the same run; then the sync agent's figures (``AgentBench``).
///
/// The root command is the producer driver (``Run``); ``Worker`` is one Swift producer process and
/// ``DrainWorker`` one Swift drain process, started by the drivers. The C producer and drain are the
/// separate `lmdb-baseline` executable. See `docs/performance.md`.
@main
struct TributaryBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "tributary-bench",
        abstract: "Producer throughput and commit latency, Swift (Tracker) next to C (lmdb-baseline).",
        discussion: """
            Runs every configuration {single track, group commit, awaited group commit} x {1, 2, 4 \
            processes}, first with Swift producer processes, then with C producer processes doing the \
            same LMDB work, each in a fresh store on disk, and prints the medians over the repetitions. \
            `tributary-bench agent` measures the sync agent: drain rate next to C, end to end to the \
            reference collector, peak RSS. `tributary-bench device` what the agent costs a device: idle \
            wake-ups, disk writes and CPU, producer latency under a drain, CPU and bytes per event. \
            `tributary-bench compare` counts events lost under SIGKILL \
            next to two Python SDKs; `tributary-bench all` runs everything and ends with the summary.
            """,
        subcommands: [
            Run.self, AgentBench.self, DeviceBench.self, Compare.self, All.self, Worker.self, DrainWorker.self,
        ],
        defaultSubcommand: Run.self
    )
}
