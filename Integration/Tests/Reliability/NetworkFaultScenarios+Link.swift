import Foundation
import GRDB
import Testing
import TributaryCollector
import TributaryTestSupport

extension ReliabilityScenarios.NetworkFaultScenarios {
    /// One row's setting: the namespaces, the collector in its own, and the group the agent drains.
    struct Link {
        let net: NetworkNamespaces
        let collector: NamespacedCollector
        let group: String

        /// Runs the agent in its namespace (`--once`, to empty) against `server` (the collector's address
        /// by default) while `during` acts on the link; returns once the agent exited.
        func agent(server: String? = nil, during: (ChildProcess) async throws -> Void = { _ in }) async throws -> AgentRun {
            let arguments = Scenario.agentArguments(
                group, server ?? collector.url,
                ["--request-timeout", "\(Int(ReliabilityScenarios.NetworkFaultScenarios.requestTimeout))", "--deadline", "60"],
                backoff: ReliabilityScenarios.NetworkFaultScenarios.backoff)
            let started = ContinuousClock.now
            let agent = try net.start("tributary-agent", in: net.agent, arguments)
            let limit = agent.killAfter(.seconds(90))
            defer { limit.cancel() }
            try await during(agent)
            let result = await agent.finish()
            return AgentRun(
                status: result.status, stderr: result.stderr, seconds: agent.secondsToExit(from: started),
                retries: try ReliabilityScenarios.NetworkFaultScenarios.retries(group))
        }

        /// Heals the fault (`heal`) and times the first batch the collector accepts after it (its
        /// batches counted past `count`): the row's figure, and a problem when none came within 30 s
        /// or it came later than `bound` seconds.
        func firstBatch(after count: Int, _ when: String, bound: Double, heal: () async throws -> Void)
            async throws -> (figure: String, problem: String?)
        {
            typealias Row = ReliabilityScenarios.NetworkFaultScenarios
            try await heal()
            let healed = ContinuousClock.now
            guard let first = try await collector.waitForBatches(moreThan: count, within: .seconds(30)) else {
                return ("no batch within 30 s \(when)", "no batch arrived within 30 s \(when)")
            }
            let after = Row.format(Row.seconds(first - healed))
            let figure = "first batch \(after) s \(when) (bound \(Row.format(bound)) s)"
            return (figure, first - healed > .seconds(bound) ? "the first batch came \(after) s \(when), over \(bound) s" : nil)
        }
    }

    /// What one agent run came to.
    struct AgentRun {
        var status: Int32
        var stderr: String
        var seconds: Double
        /// The outbox's count of failed attempts so far (each may have lost one acknowledgement).
        var retries: Int
    }

    /// The fault run's agent run, the row's own figures and its failed checks.
    struct Outcome {
        var run: AgentRun
        var figures: [String] = []
        var problems: [String] = []
    }

    /// Runs one row: namespaces and a collector in one of them, `events` delivered on the clean link,
    /// then `events` more with the fault `fault` puts in; judged by the oracle, with both durations,
    /// the retries and the fault's figures in the row. A host where namespaces cannot be made records
    /// the row as skipped, with why (a failure under `TRIBUTARY_NO_SKIPS=1`).
    static func row(
        _ name: String, test: String, events: Int = events, collector arguments: [String] = [],
        _ fault: (Link) async throws -> Outcome
    ) async throws {
        let name = "17 network: " + name
        if let reason = await NetworkNamespaces.unavailable() {
            Reliability.record(name, iterations: 0, verdict: nil, skipped: reason)
            return
        }
        try await withTemporaryGroup { group in
            let directory = (group as NSString).deletingLastPathComponent
            try await NetworkNamespaces.with { net in
                let collector = try await NamespacedCollector(net, database: directory + "/collector.sqlite", arguments)
                let link = Link(net: net, collector: collector, group: group)
                var oracle = Oracle(ledgers: try await Scenario.produce(group, [("clean", events)]))
                oracle.batchSize = Scenario.batchSize
                let clean = try await link.agent()
                oracle.ledgers += try await Scenario.produce(group, [("fault", events)])
                let outcome = try await fault(link)
                var problems = outcome.problems
                for (label, run) in [("clean run", clean), ("run with the fault", outcome.run)] where run.status != 0 {
                    problems.append("\(label): exit \(run.status): \(run.stderr)")
                }
                // Each failed attempt may have been a batch the collector stored whose answer was lost.
                oracle.inFlightWindows = outcome.run.retries
                let stopped = await collector.stop()
                if stopped.status != 0 { problems.append("collector: exit \(stopped.status): \(stopped.stderr)") }
                let figures = ["\(events) events in \(format(outcome.run.seconds)) s (clean link \(format(clean.seconds)) s)",
                               count(outcome.run.retries, "retry", "retries")] + outcome.figures
                Scenario.conclude(
                    name + ": " + figures.joined(separator: ", "), test: test, iterations: 1, oracle: oracle,
                    observed: try await collector.observed(), group: group, problems: problems)
            }
        }
    }

    /// The outbox's count of retried attempts.
    static func retries(_ group: String) throws -> Int {
        var configuration = Configuration()
        configuration.readonly = true
        let outbox = try DatabaseQueue(path: Scenario.outbox(group), configuration: configuration)
        return try outbox.read { db in
            try Int.fetchOne(db, sql: "SELECT value FROM agent_state WHERE key = 'retries'") ?? 0
        }
    }

    /// The packets nftables counted in a ruleset listing (`counter packets N bytes M`), summed.
    static func counted(_ ruleset: String) -> Int {
        number(after: "counter packets ", in: ruleset).reduce(0, +)
    }

    /// The bytes a qdisc sent (`Sent N bytes` of `tc -s qdisc show`).
    static func sentBytes(_ stats: String) -> Int {
        number(after: "Sent ", in: stats).first ?? 0
    }

    private static func number(after prefix: String, in text: String) -> [Int] {
        text.ranges(of: prefix).compactMap { range in Int(text[range.upperBound...].prefix { $0.isNumber }) }
    }

    static func seconds(_ duration: Duration) -> Double {
        Double(duration.components.seconds) + Double(duration.components.attoseconds) / 1e18
    }

    /// `n` and the noun, singular or plural.
    static func count(_ n: Int, _ singular: String, _ plural: String) -> String { "\(n) \(n == 1 ? singular : plural)" }

    static func format(_ value: Double) -> String { String(format: "%.2f", value) }
}
