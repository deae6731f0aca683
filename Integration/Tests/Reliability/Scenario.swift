import Foundation
import Testing
import TributaryCollector
import TributaryStore
import TributaryTestSupport

/// Every multi-process reliability scenario, one suite at a time: run side by side they would load a
/// 2-core machine enough to make the timing checks of other suites (and their own) miss.
@Suite("Reliability scenarios", .serialized)
struct ReliabilityScenarios {}

/// What every reliability scenario shares: the agent's arguments, producers with ledgers, and the
/// closing step (judge with the ``Oracle``, append the table row, fail with the seed and its replay).
enum Scenario {
    /// The agent's batch size in every scenario: the in-flight window the oracle allows per crash.
    static let batchSize = 50

    /// Arguments of a `tributary-agent` on `group` uploading to `url`, with fast backoff (by default a
    /// base of 0.01 s and a cap of 0.05 s).
    static func agentArguments(
        _ group: String, _ url: String, once: Bool = true, _ extra: [String] = [],
        backoff: (base: Double, cap: Double) = (0.01, 0.05)
    ) -> [String] {
        ["--group", group, "--server", url + "/sa", "--outbox", outbox(group), "--batch-size", "\(batchSize)",
         "--backoff-base", "\(backoff.base)", "--backoff-cap", "\(backoff.cap)", "--max-retry-after", "0.2", "--flush-interval", "0.05",
         "--bulk-size", "1", "--log-level", "warning"] + (once ? ["--once"] : []) + extra
    }

    /// The agent's outbox for `group`.
    static func outbox(_ group: String) -> String { group + "-state/outbox.sqlite" }

    /// A `tributary-sim load` producer with a ledger; returns the ledger for the oracle.
    static func producer(
        _ group: String, id: String, events: Int, extra: [String] = []
    ) throws -> (process: ChildProcess, ledger: Oracle.Ledger) {
        let ledger = Oracle.Ledger(producer: id, path: group + "-ledger-" + id)
        let process = try ChildProcess(
            "tributary-sim",
            ["load", "--group", group, "--producer-id", id, "--events", "\(events)", "--ledger", ledger.path] + extra)
        return (process, ledger)
    }

    /// Runs producers to completion, expecting each to succeed.
    static func produce(
        _ group: String, _ producers: [(id: String, events: Int)], extra: [String] = ["--concurrency", "4"]
    ) async throws -> [Oracle.Ledger] {
        var ledgers: [Oracle.Ledger] = []
        for (id, events) in producers {
            let (process, ledger) = try producer(group, id: id, events: events, extra: extra)
            let result = await process.finish()
            #expect(result.status == 0, "producer \(id): \(result.stderr)")
            ledgers.append(ledger)
        }
        return ledgers
    }

    /// Runs the agent once to empty and expects a clean exit.
    static func drain(_ group: String, _ collector: RunningCollector, sourceLocation: SourceLocation = #_sourceLocation)
        async throws
    {
        let run = try await ChildProcess.run("tributary-agent", agentArguments(group, collector.url))
        #expect(run.status == 0, "final drain failed: \(run.stderr)", sourceLocation: sourceLocation)
    }

    /// Judges the run, appends the scenario's row to the table and records a failure with its replay.
    /// `problems` are the scenario's own failed checks (exit statuses, dead letters): they fail the row too.
    @discardableResult
    static func conclude(
        _ name: String, test: String, iterations: Int, oracle: Oracle, collector: RunningCollector, group: String,
        seed: UInt64? = nil, problems: [String] = [], sourceLocation: SourceLocation = #_sourceLocation
    ) async throws -> Oracle.Verdict {
        try await conclude(
            name, test: test, iterations: iterations, oracle: oracle, observed: Oracle.Observed.from(collector), group: group,
            seed: seed, problems: problems, sourceLocation: sourceLocation)
    }

    /// Judges what a collector observed (one that ran as a process of its own, read from its database),
    /// appends the scenario's row and records a failure with its replay.
    @discardableResult
    static func conclude(
        _ name: String, test: String, iterations: Int, oracle: Oracle, observed: Oracle.Observed, group: String,
        seed: UInt64? = nil, problems: [String] = [], sourceLocation: SourceLocation = #_sourceLocation
    ) -> Oracle.Verdict {
        var verdict = oracle.judge(observed)
        verdict.healthProblems += Oracle.healthProblems(group: group, outbox: outbox(group)) + problems
        conclude(name, test: test, iterations: iterations, verdict: verdict, seed: seed, sourceLocation: sourceLocation)
        return verdict
    }

    /// Appends the row of an already judged verdict and records a failure with its replay.
    static func conclude(
        _ name: String, test: String, iterations: Int, verdict: Oracle.Verdict, seed: UInt64? = nil,
        sourceLocation: SourceLocation = #_sourceLocation
    ) {
        Reliability.record(name, iterations: iterations, verdict: verdict, seed: seed, test: test)
        let replay = seed.map { " — replay: " + Reliability.replay(test, seed: $0) } ?? ""
        #expect(verdict.passed, "\(name): \(verdict)\(replay)", sourceLocation: sourceLocation)
    }

    /// Events in the store not yet drained.
    static func storePending(_ group: String) throws -> Int {
        try SharedStore(groupDirectory: group).status().pendingEvents
    }
}
