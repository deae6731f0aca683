import Foundation
import Testing
import TributaryCollector
import TributaryStore
import TributaryTestSupport

extension ReliabilityScenarios {
    /// Scenario 6: the real agent process against the real collector misbehaving in every way the issue
    /// lists. Each case: producers with ledgers, one or more agent runs under the fault, the fault cleared,
    /// a final drain, the oracle.
    @Suite("Reliability: collector faults", .serialized, .timeLimit(.minutes(4 * Reliability.soak)))
    struct CollectorFaultScenarios {
        /// One row of the fault table.
        struct Case: Sendable, CustomTestStringConvertible {
            var name: String
            var faults: FaultConfiguration
            /// `Retry-After` to send, resolved when the case runs: `"date+N"` is an HTTP date N s ahead.
            var retryAfter: String?
            var extra: [String] = []
            /// The agent's expected exit status under the fault.
            var status: Int32 = 0
            /// A transport fault the collector cannot make itself: the agent then talks to the collector
            /// through a ``FaultProxy`` in this mode (seeded with `proxySeed + round`); the drain goes direct.
            var proxy: FaultProxy.Mode? = nil
            var proxySeed: UInt64 = 0
            var testDescription: String { name }
        }

        static func failing(_ status: Int, retryAfter: String? = nil, _ name: String) -> Case {
            Case(name: name, faults: FaultConfiguration(seed: 11, failureRate: 0.4, failureStatus: status), retryAfter: retryAfter,
                 extra: ["--max-retry-after", "1"])
        }

        static let cases: [Case] = [
            failing(500, "500"), failing(502, "502"), failing(503, "503"), failing(504, "504"), failing(408, "408"),
            failing(429, retryAfter: "1", "429 Retry-After: 1 (seconds)"),
            failing(503, retryAfter: "date+1", "503 Retry-After: an HTTP date 1 s ahead"),
            failing(503, retryAfter: "Wed, 21 Oct 2015 07:28:00 GMT", "503 Retry-After: a date in the past"),
            failing(429, retryAfter: "soon-ish", "429 Retry-After: garbage"),
            failing(503, retryAfter: "1000000", "503 Retry-After: 1000000 s (clamped to 1 s)"),
            Case(name: "413 over 20 events per batch (split)", faults: FaultConfiguration(maxEventsPerBatch: 20)),
            Case(name: "400 poison (bisected)", faults: FaultConfiguration(poisonPattern: "^Poison$")),
            Case(name: "422 poison (bisected)", faults: FaultConfiguration(poisonPattern: "^Poison$", poisonStatus: 422)),
            Case(name: "401 (halt, keep)", faults: FaultConfiguration(forcedStatus: 401), status: 78),
            Case(name: "403 (halt, keep)", faults: FaultConfiguration(forcedStatus: 403), status: 78),
            Case(name: "404 (halt, keep)", faults: FaultConfiguration(forcedStatus: 404), status: 78),
            Case(name: "accept then hang", faults: FaultConfiguration(seed: 3, hangRate: 0.3), extra: ["--request-timeout", "0.5"]),
            Case(name: "reset before the answer", faults: FaultConfiguration(seed: 4, resetRate: 0.4)),
            Case(name: "slow answer past the request timeout", faults: FaultConfiguration(latencyMillis: 700),
                 extra: ["--request-timeout", "0.5", "--deadline", "4"]),
            Case(name: "2xx lost after commit", faults: FaultConfiguration(seed: 5, lostAckRate: 0.4)),
            Case(name: "reset in the middle of the request body", faults: .none, proxy: .resetMidBody(rate: 0.5), proxySeed: 21),
            // ~80 B/s: the response head alone takes over a second, past the 0.5 s request timeout.
            Case(name: "slow response body past the request timeout", faults: .none,
                 extra: ["--request-timeout", "0.5", "--deadline", "10"],
                 proxy: .slowBody(bytesPerTick: 4, tickMillis: 50, rate: 0.5), proxySeed: 22),
            // The head at once, then a byte every 200 ms: a body of ~60 B takes 12 s, far past the timeout.
            Case(name: "slow response body after a prompt head", faults: .none,
                 extra: ["--request-timeout", "0.5"],
                 proxy: .slowBodyAfterHead(bytesPerTick: 1, tickMillis: 200, rate: 0.5), proxySeed: 23),
        ]

        @Test("the agent against a faulty collector: nothing lost, nothing duplicated after dedup, order kept", arguments: cases)
        func collectorFault(_ fault: Case) async throws {
            let rounds = Reliability.soak
            try await withTemporaryGroup { group in
                var faults = fault.faults
                faults.retryAfter = fault.retryAfter.map(Self.resolve)
                try await Collector.withRunning(CollectorConfiguration(faults: faults)) { collector in
                    var oracle = Oracle(ledgers: [])
                    oracle.batchSize = Scenario.batchSize
                    oracle.unledgeredProducers = ["poison"]
                    var poisonIDs: Set<String> = []
                    var elapsed = 0.0
                    var proxied = (exchanges: 0, faulted: 0)
                    for round in 0..<rounds {
                        oracle.ledgers += try await Scenario.produce(group, [("load-\(round)", 120)])
                        if faults.poisonPattern != nil {
                            let poison = try await ChildProcess.run("tributary", ["track", "--create", "--group", group, "--producer-id", "poison", "Poison"])
                            poisonIDs.insert(poison.stdout.trimmingCharacters(in: .whitespacesAndNewlines))
                            oracle.ledgers += try await Scenario.produce(group, [("after-poison-\(round)", 30)])
                        }
                        try await collector.setFaults(faults)
                        let uniqueBefore = try await collector.stats().unique
                        let began = Date()
                        let run: (status: Int32, stdout: String, stderr: String)
                        if let mode = fault.proxy {
                            let seed = fault.proxySeed &+ UInt64(round)
                            let (result, exchanges, faulted) = try await FaultProxy.withRunning(
                                upstreamPort: collector.port, mode: mode, seed: seed
                            ) { proxy in
                                let result = try await ChildProcess.run(
                                    "tributary-agent", Scenario.agentArguments(group, proxy.url, fault.extra))
                                return (result, proxy.exchanges, proxy.faulted)
                            }
                            run = result
                            proxied.exchanges += exchanges
                            proxied.faulted += faulted
                        } else {
                            run = try await ChildProcess.run("tributary-agent", Scenario.agentArguments(group, collector.url, fault.extra))
                        }
                        elapsed += Date().timeIntervalSince(began)
                        #expect(run.status == fault.status, "\(fault.name): exit \(run.status): \(run.stderr)")
                        if fault.status != 0 {
                            #expect(try await collector.stats().unique == uniqueBefore, "a halted agent delivered events")
                        }
                        try await collector.setFaults(.none)
                        try await Scenario.drain(group, collector)
                    }
                    let stats = try await collector.stats()
                    // Each batch the collector committed but the agent never heard of comes back once, same id:
                    // a lost acknowledgement, a response the proxy cut or slowed past the timeout, or (an answer
                    // slower than the timeout) any request. Counted from the faults, not from the collector's
                    // `repeated_batches`: an agent that sent acknowledged batches again would raise it.
                    let answersLost = stats.faults.lostAck + proxied.faulted + (fault.faults.latencyMillis > 0 ? stats.requests : 0)
                    #expect(stats.repeatedBatches <= answersLost, "\(fault.name): \(stats.repeatedBatches) batches sent again, \(answersLost) answers lost")
                    oracle.inFlightWindows = answersLost
                    oracle.expectedUndelivered = poisonIDs
                    if fault.name.hasPrefix("503 Retry-After: 1000000") {
                        #expect(elapsed < Double(stats.faults.failure) * 1.0 + 15, "Retry-After was not clamped: \(elapsed) s")
                    }
                    if fault.name.hasPrefix("429 Retry-After: 1 ") {
                        #expect(elapsed >= Double(stats.faults.failure) * 0.9, "Retry-After ignored: \(elapsed) s for \(stats.faults.failure) 429s")
                    }
                    let letters = try await ChildProcess.run("tributary", ["dead-letters", "--outbox", Scenario.outbox(group), "--json"])
                    for id in poisonIDs { #expect(letters.stdout.contains(id), "poison \(id) not dead-lettered: \(letters.stdout)") }
                    var problems: [String] = []
                    switch fault.proxy {
                    case nil:
                        break
                    case .resetMidBody?:
                        // Reset requests were truncated: nothing of them may be committed, so no batch repeats.
                        if proxied.faulted == 0 { problems.append("the proxy reset no request (\(proxied.exchanges) exchanges)") }
                        if stats.repeatedBatches != 0 {
                            problems.append("\(stats.repeatedBatches) batches repeated: a truncated request was committed")
                        }
                    case .slowBody?:
                        // Each slowed answer came after the commit: its batch comes back once, deduplicated.
                        if proxied.faulted == 0 { problems.append("the proxy slowed no response (\(proxied.exchanges) exchanges)") }
                        if stats.repeatedBatches < proxied.faulted {
                            problems.append("\(proxied.faulted) answers slowed but only \(stats.repeatedBatches) batches repeated")
                        }
                    case .slowBodyAfterHead?:
                        // Each slowed answer's head said 200 at once: that acknowledges the batch, however long
                        // its body takes, so no batch is sent again.
                        if proxied.faulted == 0 { problems.append("the proxy slowed no response (\(proxied.exchanges) exchanges)") }
                        if stats.repeatedBatches != 0 {
                            problems.append("\(stats.repeatedBatches) batches sent again after a 200 whose body was slow")
                        }
                    }
                    if fault.proxy != nil {
                        #expect(proxied.faulted > 0, "\(fault.name): the proxy never acted in \(proxied.exchanges) exchanges")
                        print("6 collector: \(fault.name): proxy faulted \(proxied.faulted) of \(proxied.exchanges) exchanges, "
                              + "\(stats.repeatedBatches) batches repeated, \(stats.duplicates) wire duplicates")
                    }
                    try await Scenario.conclude(
                        "6 collector: \(fault.name)", test: "CollectorFaultScenarios/collectorFault", iterations: rounds,
                        oracle: oracle, collector: collector, group: group, problems: problems)
                }
            }
        }

        @Test("a single event too large for the collector even alone is dead-lettered with its reason; the rest arrive")
        func singleEventTooLarge() async throws {
            try await withTemporaryGroup { group in
                try await Collector.withRunning(CollectorConfiguration(maxBodyBytes: 16 << 10)) { collector in
                    var oracle = Oracle(ledgers: try await Scenario.produce(group, [("before", 60)]))
                    oracle.batchSize = Scenario.batchSize
                    // 40 KiB in properties under the per-value limit: a valid event, too large for this collector.
                    let value = String(repeating: "x", count: 5000)
                    let properties = "{" + (0..<8).map { #""p\#($0)":"\#(value)""# }.joined(separator: ",") + "}"
                    let big = try await ChildProcess.run(
                        "tributary", ["track", "--create", "--group", group, "--producer-id", "big", "Big", "--properties", properties])
                    #expect(big.status == 0, "\(big.stderr)")
                    let bigID = big.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
                    oracle.ledgers += try await Scenario.produce(group, [("after", 60)])
                    oracle.expectedUndelivered = [bigID]
                    try await Scenario.drain(group, collector)
                    let letters = try await ChildProcess.run("tributary", ["dead-letters", "--outbox", Scenario.outbox(group), "--json"])
                    let kept = big.status == 0 && letters.stdout.contains(bigID) && letters.stdout.contains("413")
                        && letters.stdout.contains("too large")
                    try await Scenario.conclude(
                        "6 collector: 413 for one event alone (dead-lettered)", test: "CollectorFaultScenarios/singleEventTooLarge",
                        iterations: 1, oracle: oracle, collector: collector, group: group,
                        problems: kept ? [] : ["the event was not dead-lettered with a 413 reason: \(big.stderr) \(letters.stdout)"])
                }
            }
        }

        @Test("connection refused: a --once run with a deadline exits 0 keeping everything; the next run delivers")
        func connectionRefused() async throws {
            try await withTemporaryGroup { group in
                var oracle = Oracle(ledgers: try await Scenario.produce(group, [("refused", 150)]))
                oracle.batchSize = Scenario.batchSize
                // The discard port, where nothing listens (as the other tests' "nowhere"): a port found free a
                // moment ago could be taken meanwhile by another test's collector, which would get these events.
                let closed = "http://127.0.0.1:9"
                let run = try await ChildProcess.run("tributary-agent", Scenario.agentArguments(group, closed, ["--deadline", "2"]))
                #expect(run.status == 0, "\(run.stderr)")
                try await Collector.withRunning(CollectorConfiguration()) { collector in
                    #expect(try await collector.stats().unique == 0)
                    try await Scenario.drain(group, collector)
                    try await Scenario.conclude(
                        "6 collector: connection refused", test: "CollectorFaultScenarios/connectionRefused", iterations: 1,
                        oracle: oracle, collector: collector, group: group)
                }
            }
        }

        /// `"date+N"` → an HTTP date N seconds from now; anything else as is.
        static func resolve(_ retryAfter: String) -> String {
            guard retryAfter.hasPrefix("date+"), let seconds = Double(retryAfter.dropFirst(5)) else { return retryAfter }
            let formatter = DateFormatter()
            formatter.locale = Locale(identifier: "en_US_POSIX")
            formatter.timeZone = TimeZone(identifier: "GMT")
            formatter.dateFormat = "EEE, dd MMM yyyy HH:mm:ss 'GMT'"
            return formatter.string(from: Date().addingTimeInterval(seconds))
        }
    }
}
