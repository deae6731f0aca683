import Foundation
import Testing
import TributaryCollector
import TributaryStore
import TributaryTestSupport

extension ReliabilityScenarios {
    /// Scenario 16: the real agent process through a real HTTP proxy (Debian's tinyproxy, on loopback):
    /// `HTTPS_PROXY` with `CONNECT` to a TLS collector (its key pinned: the pin check's own handshake goes
    /// through the proxy too), `--proxy` to a plain one, `NO_PROXY`, and a proxy
    /// that refuses connections or is killed mid-run, which is a transient failure (backoff, nothing
    /// lost). Each judged by the oracle.
    @Suite("Reliability: proxies", .serialized, .timeLimit(.minutes(4)))
    struct ProxyScenarios {
        /// The proxy variables of the test runner's own environment, cleared for the agent.
        static let noProxyEnvironment = [
            "http_proxy": "", "HTTP_PROXY": "", "https_proxy": "", "HTTPS_PROXY": "", "no_proxy": "", "NO_PROXY": "",
        ]

        @Test("https through tinyproxy (HTTPS_PROXY, CONNECT) and http through it (--proxy), in both wire formats",
              arguments: ["sensors", "ndjson"])
        func throughTheProxy(format: String) async throws {
            try #require(FileManager.default.isExecutableFile(atPath: Tinyproxy.path), "make deps installs tinyproxy-bin")
            try await withTemporaryGroup { group in
                let directory = (group as NSString).deletingLastPathComponent
                let pki = try TestPKI(directory: directory)
                let server = try pki.issue("server")
                let proxy = try await Tinyproxy(directory: directory)
                var config = CollectorConfiguration(databasePath: directory + "/collector.sqlite")
                config.tls = CollectorTLS(certificateFile: server.certificateFile, keyFile: server.keyFile)
                var oracle = Oracle(ledgers: try await Scenario.produce(group, [("https", 120)]))
                oracle.batchSize = Scenario.batchSize
                var problems: [String] = []
                try await Collector.withRunning(config) { collector in
                    var environment = Self.noProxyEnvironment
                    environment["HTTPS_PROXY"] = proxy.url
                    let run = try await ChildProcess.run(
                        "tributary-agent",
                        Scenario.agentArguments(
                            group, "https://localhost:\(collector.port)", ["--format", format, "--ca-file", pki.caFile, "--pin-sha256", server.pin]),
                        environment: environment)
                    if run.status != 0 { problems.append("https run: exit \(run.status): \(run.stderr)") }
                    if !proxy.log().contains("CONNECT localhost:\(collector.port)") {
                        problems.append("the https run did not go through the proxy: \(proxy.log())")
                    }
                }
                oracle.ledgers += try await Scenario.produce(group, [("http", 120)])
                try await Collector.withRunning(CollectorConfiguration(databasePath: directory + "/collector.sqlite")) { collector in
                    let run = try await ChildProcess.run(
                        "tributary-agent",
                        Scenario.agentArguments(group, collector.url, ["--format", format, "--proxy", proxy.url]),
                        environment: Self.noProxyEnvironment)
                    if run.status != 0 { problems.append("http run: exit \(run.status): \(run.stderr)") }
                    // async-http-client tunnels plain http through the proxy with CONNECT too.
                    if !proxy.log().contains("CONNECT 127.0.0.1:\(collector.port)") {
                        problems.append("the http run did not go through the proxy: \(proxy.log())")
                    }
                    await proxy.stop()
                    try await Scenario.conclude(
                        "proxy (\(format)): https CONNECT and http through tinyproxy", test: "ProxyScenarios/throughTheProxy",
                        iterations: 1, oracle: oracle, collector: collector, group: group, problems: problems)
                }
            }
        }

        @Test("a proxy that refuses, or is killed mid-run, is a transient failure; NO_PROXY goes direct")
        func refusingProxy() async throws {
            try #require(FileManager.default.isExecutableFile(atPath: Tinyproxy.path), "make deps installs tinyproxy-bin")
            try await withTemporaryGroup { group in
                let directory = (group as NSString).deletingLastPathComponent
                var oracle = Oracle(ledgers: try await Scenario.produce(group, [("refused", 200)]))
                oracle.batchSize = Scenario.batchSize
                var problems: [String] = []
                try await Collector.withRunning(CollectorConfiguration()) { collector in
                    // Nothing listens on the proxy's port: each attempt is refused, and the run backs off to its deadline.
                    var environment = Self.noProxyEnvironment
                    environment["HTTP_PROXY"] = "http://127.0.0.1:\(try freeLoopbackPort())"
                    let refused = try await ChildProcess.run(
                        "tributary-agent", Scenario.agentArguments(group, collector.url, ["--deadline", "3"]), environment: environment)
                    if refused.status != 0 { problems.append("refused run: exit \(refused.status), not 0: \(refused.stderr)") }
                    if try await collector.stats().unique != 0 { problems.append("events went past a refusing proxy") }
                    let letters = try await ChildProcess.run("tributary", ["dead-letters", "--outbox", Scenario.outbox(group), "--json"])
                    if letters.stdout.contains("event_id") { problems.append("events were dead-lettered: \(letters.stdout)") }

                    // A proxy killed while the agent sends through it (a daemon, slowed by the collector).
                    let proxy = try await Tinyproxy(directory: directory)
                    environment["HTTP_PROXY"] = proxy.url
                    try await collector.setFaults(FaultConfiguration(latencyMillis: 100))
                    let agent = try ChildProcess(
                        "tributary-agent", Scenario.agentArguments(group, collector.url, once: false), environment: environment)
                    for _ in 0..<100 where try await collector.stats().unique == 0 { try await Task.sleep(for: .milliseconds(50)) }
                    await proxy.stop()
                    try await Task.sleep(for: .milliseconds(500))
                    agent.send(SIGTERM)
                    let stopped = await agent.finish()
                    if stopped.status != 0 { problems.append("daemon: exit \(stopped.status): \(stopped.stderr)") }
                    try await collector.setFaults(.none)

                    // NO_PROXY names the collector: straight there, though the proxy is dead.
                    environment["NO_PROXY"] = "localhost,127.0.0.1"
                    let direct = try await ChildProcess.run(
                        "tributary-agent", Scenario.agentArguments(group, collector.url), environment: environment)
                    if direct.status != 0 { problems.append("NO_PROXY run: exit \(direct.status): \(direct.stderr)") }
                    // The batch whose answer the killed proxy lost, and the one the SIGTERM's stop cut short.
                    oracle.inFlightWindows = 2
                    try await Scenario.conclude(
                        "proxy: refused, killed mid-run (transient), then NO_PROXY direct", test: "ProxyScenarios/refusingProxy",
                        iterations: 1, oracle: oracle, collector: collector, group: group, problems: problems)
                }
            }
        }
    }
}
