import Foundation
import Testing
import TributaryCollector
import TributaryStore
import TributaryTestSupport

extension ReliabilityScenarios {
    /// Scenarios 1 and 2: the real `tributary-agent` killed with SIGKILL at random moments under load, and
    /// at every named crash point (twice in a row at the same point), against the real collector on
    /// loopback. Judged by the ``Oracle``.
    @Suite("Reliability: agent kills", .serialized, .timeLimit(.minutes(4 * Reliability.soak)))
    struct AgentKillScenarios {
        @Test("SIGKILL at each named crash point, twice in a row, then restart: nothing lost or duplicated after dedup",
              arguments: ["drain.before-outbox-commit", "drain.after-outbox-commit", "upload.after-send",
                          "upload.after-ack", "upload.before-deferred-ack", "deadletter.before-commit"])  // CrashPoint.names
        func crashPoint(point: String) async throws {
            let rounds = Reliability.soak  // each round crashes twice in a row at the point
            let seed = Reliability.seed()
            var rng = SplitMix64(seed: seed)
            try await withTemporaryGroup { group in
                // Poison events reach the dead-letter point; the collector rejects their batches.
                let faults = FaultConfiguration(poisonPattern: "^Poison$")
                try await Collector.withRunning(CollectorConfiguration(faults: faults)) { collector in
                    var oracle = Oracle(ledgers: [])
                    oracle.batchSize = Scenario.batchSize
                    oracle.unledgeredProducers = ["cli"]
                    var poisoned = 0
                    var problems: [String] = []
                    for round in 0..<rounds {
                        // Upload points crash after up to 3 batches, twice per round: at least 6 batches of 50.
                        let events = (point.hasPrefix("upload") ? 300 : 150) + Int(rng.next() % 100)
                        oracle.ledgers += try await Scenario.produce(group, [("load-\(round)", events)])
                        if point.hasPrefix("deadletter") {
                            let track = try await ChildProcess.run("tributary", ["track", "--create", "--group", group, "--producer-id", "cli", "Poison"])
                            #expect(track.status == 0, "\(track.stderr)")
                            poisoned += 1
                        }
                        // Twice in a row at the same point: the restart must survive a crash in its own recovery.
                        for _ in 0..<2 {
                            // Uploads reach their points once per batch; a drain or a dead letter once per run.
                            let hit = point.hasPrefix("upload") ? 1 + Int(rng.next() % 3) : 1
                            let crashed = try ChildProcess(
                                "tributary-agent", Scenario.agentArguments(group, collector.url),
                                environment: ["TRIBUTARY_CRASH_AT": "\(point):\(hit)"])
                            let result = await crashed.finish()
                            oracle.crashWindows += 1
                            if !(crashed.process.terminationReason == .uncaughtSignal && result.status == SIGKILL) {
                                problems.append("agent did not reach \(point):\(hit) (status \(result.status)): \(result.stderr)")
                            }
                        }
                        try await Scenario.drain(group, collector)
                    }
                    #expect(try Scenario.storePending(group) == 0)
                    let letters = try await ChildProcess.run("tributary", ["dead-letters", "--outbox", Scenario.outbox(group), "--json"])
                    #expect(letters.stdout.components(separatedBy: "\"event_id\"").count - 1 == poisoned, "\(letters.stdout)")
                    try await Scenario.conclude(
                        "2 crash point \(point)", test: "AgentKillScenarios/crashPoint", iterations: 2 * rounds,
                        oracle: oracle, collector: collector, group: group, seed: seed, problems: problems)
                }
            }
        }

        @Test("the agent killed with SIGKILL at random moments while 2 producers write, then restarted to empty")
        func killLoop() async throws {
            let kills = 40 * Reliability.soak
            let seed = Reliability.seed()
            var rng = SplitMix64(seed: seed)
            try await withTemporaryGroup { group in
                let perProducer = 25 * kills
                let producers = try [
                    Scenario.producer(group, id: "app", events: perProducer, extra: ["--interval-ms", "2"]),
                    Scenario.producer(group, id: "share", events: perProducer,
                                      extra: ["--kind", "extension", "--interval-ms", "2", "--concurrency", "2"]),
                ]
                var oracle = Oracle(ledgers: producers.map(\.ledger))
                oracle.batchSize = Scenario.batchSize
                try await Collector.withRunning(CollectorConfiguration(faults: FaultConfiguration(latencyMillis: 2))) { collector in
                    var killed = 0
                    var killedRunning = 0
                    for kill in 0..<kills {
                        let notify = try NotifySocket(path: group + "-notify-\(kill)")
                        let agent = try ChildProcess(
                            "tributary-agent", Scenario.agentArguments(group, collector.url, once: false),
                            environment: ["NOTIFY_SOCKET": notify.path])
                        // A quarter of the kills land while the agent starts (opening, migrating, recovering);
                        // the rest 0–300 ms after its READY=1, while it drains and uploads. A debug agent may
                        // take over a second to start on a loaded machine: kills timed from the spawn alone
                        // would all land before it did anything.
                        // The last kill, when no upload has started yet (a debug agent on a loaded machine may
                        // take longer than 300 ms from READY=1 to its first request, and every kill landed
                        // before it: a CI run on 2026-11-29), waits for the first request: the scenario is
                        // about kills while uploads are in flight too.
                        let lastAndNoRequestYet = kill == kills - 1 ? try await collector.stats().requests == 0 : false
                        if !lastAndNoRequestYet && rng.next() % 4 == 0 {
                            try await Task.sleep(for: .milliseconds(30 + Int(rng.next() % 120)))
                        } else {
                            #expect(await notify.wait(for: "READY=1", timeout: 30) != nil, "the agent never sent READY=1")
                            if lastAndNoRequestYet {
                                let deadline = ContinuousClock.now + .seconds(30)
                                while try await collector.stats().requests == 0, ContinuousClock.now < deadline {
                                    try await Task.sleep(for: .milliseconds(20))
                                }
                            } else {
                                try await Task.sleep(for: .milliseconds(Int(rng.next() % 300)))
                            }
                            killedRunning += 1
                        }
                        agent.send(SIGKILL)
                        await agent.finish()
                        if agent.process.terminationReason == .uncaughtSignal { killed += 1 }
                    }
                    #expect(killed == kills)
                    #expect(killedRunning > 0)
                    #expect(try await collector.stats().requests > 0, "no kill came after an upload started")
                    oracle.crashWindows = killed
                    for producer in producers {
                        let result = await producer.process.finish()
                        #expect(result.status == 0, "\(result.stderr)")
                    }
                    try await Scenario.drain(group, collector)
                    #expect(try Scenario.storePending(group) == 0)
                    let verdict = try await Scenario.conclude(
                        "1 agent kill -9 under load", test: "AgentKillScenarios/killLoop", iterations: kills,
                        oracle: oracle, collector: collector, group: group, seed: seed)
                    #expect(verdict.acknowledged == 2 * perProducer)
                }
            }
        }
    }
}
