import Foundation
import Testing
import TributaryCollector
import TributaryStore
import TributaryTestSupport

extension ReliabilityScenarios {
    /// Scenario 17: faults in the network itself. The collector runs as a process inside a network
    /// namespace the test makes, the agent (`ip netns exec NAME tributary-agent …`) inside another,
    /// joined by a veth pair; the faults are put in that link with nftables (random loss, partitions
    /// that drop or reset) and `tc tbf` (a rate limit), or in the agent's own `/etc/hosts` (a name
    /// that does not resolve, then does). Each row delivers its events once on the clean link, then
    /// again with the fault, and the oracle judges both; the row shows how long each took and, for a
    /// partition or a name, how soon after it healed the first batch arrived. (Delay, jitter and
    /// reordering need `netem`, which this kernel lacks: docs/reliability.md.)
    @Suite("Reliability: network faults (namespaces)", .serialized, .timeLimit(.minutes(3 * Reliability.soak)))
    struct NetworkFaultScenarios {
        /// Events per run (one on the clean link, one with the fault) unless a row says otherwise: 12 batches.
        static let events = 600
        /// The agent's backoff in these rows: a cap long enough to see, short enough to keep rows fast.
        static let backoff = (base: 0.1, cap: 1.0)
        /// The agent's request timeout in these rows (seconds).
        static let requestTimeout = 2.0
        /// What a loaded 2-core machine may add to a bound: processes scheduled late, 10 ms polling.
        static let slack = 1.5
        /// How long a partition lasts: 3 s, and the issue's 20 s under `make soak`.
        static var partitionSeconds: Int { Reliability.soak > 1 ? 20 : 3 }

        @Test("random loss: nftables drops one packet in ten each way (numgen random mod 10); nothing lost")
        func randomLoss() async throws {
            try await Self.row("10 % random packet loss (nftables numgen)", test: "NetworkFaultScenarios/randomLoss", events: 2400) { link in
                try await link.net.nft(
                    link.net.collector,
                    """
                    table inet loss {
                        chain input {
                            type filter hook input priority 0;
                            numgen random mod 10 < 1 counter drop
                        }
                        chain output {
                            type filter hook output priority 0;
                            numgen random mod 10 < 1 counter drop
                        }
                    }
                    """)
                let run = try await link.agent()
                let dropped = Self.counted(try await link.net.ruleset(link.net.collector))
                return Outcome(run: run, figures: ["\(dropped) packets dropped"],
                               problems: dropped == 0 ? ["no packet was dropped: the loss rule did not act"] : [])
            }
        }

        /// How a partition cuts the link.
        enum Partition: String, Sendable, CaseIterable { case drop, reset }

        @Test("a partition in the middle of a batch, as silent drops and as TCP resets, healed mid-run",
              arguments: Partition.allCases)
        func partition(_ kind: Partition) async throws {
            // The collector holds each answer this long after storing its batch: the partition begins
            // while one is held, so that with drops that answer is lost and the batch sent again.
            let latency = 0.3
            let name = "\(Self.partitionSeconds) s partition (nftables \(kind == .drop ? "drop" : "reject with tcp reset"))"
            try await Self.row(
                name, test: "NetworkFaultScenarios/partition", events: 300, collector: ["--latency-ms", "\(Int(latency * 1000))"]
            ) { link in
                var figures: [String] = []
                var problems: [String] = []
                let agentAddress = link.net.agentAddress
                let rules =
                    switch kind {
                    case .drop:
                        """
                        table inet partition {
                            chain input { type filter hook input priority 0; ip saddr \(agentAddress) drop; }
                            chain output { type filter hook output priority 0; ip daddr \(agentAddress) drop; }
                        }
                        """
                    case .reset:
                        """
                        table inet partition {
                            chain input {
                                type filter hook input priority 0;
                                ip saddr \(agentAddress) tcp dport \(link.collector.port) reject with tcp reset
                            }
                        }
                        """
                    }
                // With drops the agent learns the link is back only when its attempt in flight times out
                // (the request timeout, plus the agent's own second); resets fail each attempt at once.
                let bound = (kind == .drop ? Self.requestTimeout + 1 : 0) + Self.backoff.cap + latency + Self.slack
                let cleanBatches = try link.collector.batches()
                let run = try await link.agent { agent in
                    guard try await link.collector.waitForBatches(moreThan: cleanBatches + 1, within: .seconds(30)) != nil else {
                        problems.append("no batch arrived before the partition")
                        return
                    }
                    // The fault run's second batch is stored and the collector holds its answer: cut now.
                    try await Task.sleep(for: .milliseconds(30))
                    let before = try link.collector.batches()
                    try await link.net.nft(link.net.collector, rules)
                    try await Task.sleep(for: .seconds(Self.partitionSeconds))
                    let during = try link.collector.batches() - before
                    if during > 1 { problems.append("\(during) batches arrived through the partition") }
                    if !agent.process.isRunning { problems.append("the agent exited during the partition") }
                    let healed = try await link.firstBatch(after: try link.collector.batches(), "after the heal", bound: bound) {
                        try await link.net.nft(link.net.collector, "delete table inet partition\n")
                    }
                    figures.append(healed.figure)
                    problems += healed.problem.map { [$0] } ?? []
                }
                figures.append(Self.count(try link.collector.counter("repeated_batches"), "batch", "batches") + " sent again (answer lost)")
                return Outcome(run: run, figures: figures, problems: problems)
            }
        }

        @Test("a 1 Mbit/s link (tc tbf): uploads finish slower, no request times out, nothing lost")
        func rateLimit() async throws {
            let rate = 1_000_000.0
            let burst = 16 * 1024
            try await Self.row("1 Mbit/s rate limit (tc tbf)", test: "NetworkFaultScenarios/rateLimit", events: 4000) { link in
                let device = ["dev", link.net.agentInterface]
                try await link.net.tc(
                    link.net.agent, ["qdisc", "add"] + device + ["root", "tbf", "rate", "1mbit", "burst", "\(burst)", "latency", "1s"])
                let run = try await link.agent()
                let stats = try await link.net.tc(link.net.agent, ["-s", "qdisc", "show"] + device)
                let sent = Self.sentBytes(stats)
                let bitsPerSecond = Double(sent * 8) / run.seconds
                var problems: [String] = []
                // The uploads' bytes cannot leave faster than the rate, past the first burst.
                if Double(sent - burst) * 8 / rate > run.seconds {
                    problems.append("\(sent) bytes left in \(run.seconds) s: faster than 1 Mbit/s, the limit did not act")
                }
                if sent < 4 * burst { problems.append("only \(sent) bytes went through the limit: too few to test it") }
                if run.retries > 0 { problems.append("\(run.retries) requests were retried on a slow but working link") }
                return Outcome(run: run, figures: ["\(sent / 1024) KiB at \(Self.format(bitsPerSecond / 1e6)) Mbit/s"],
                               problems: problems)
            }
        }

        @Test("a collector host name that does not resolve, then does (the agent's namespace's /etc/hosts)")
        func nameResolution() async throws {
            let wait = 2
            try await Self.row("host name unresolved for \(wait) s, then resolved (/etc/netns hosts)", test: "NetworkFaultScenarios/nameResolution") { link in
                var figures: [String] = []
                var problems: [String] = []
                let bound = Self.backoff.cap + Self.slack
                let server = "http://\(NetworkNamespaces.collectorName):\(link.collector.port)"
                let run = try await link.agent(server: server) { agent in
                    let before = try link.collector.batches()
                    try await Task.sleep(for: .seconds(wait))
                    if try link.collector.batches() != before { problems.append("batches arrived before the name resolved") }
                    if !agent.process.isRunning { problems.append("the agent exited while the name did not resolve") }
                    let resolved = try await link.firstBatch(after: before, "after it resolved", bound: bound) { try link.net.resolve() }
                    figures.append(resolved.figure)
                    problems += resolved.problem.map { [$0] } ?? []
                }
                return Outcome(run: run, figures: figures, problems: problems)
            }
        }
    }
}
