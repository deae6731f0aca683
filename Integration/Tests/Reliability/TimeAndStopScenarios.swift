import Foundation
import Testing
import TributaryCollector
import TributaryStore
import TributaryTestSupport

/// Scenarios 7 and 8: wall-clock jumps while producing and uploading, and deadlines and stops (SIGTERM
/// at random moments, one-shot runs shorter than the backlog, the watchdog restart path).
///
extension ReliabilityScenarios {
    /// Clock jumps go through the test seam `TRIBUTARY_TEST_WALL_CLOCK_OFFSET_FILE` in every process
    /// (producers and agent) rather than libfaketime: LD_PRELOADing libfaketime into a Swift binary empties
    /// its `CommandLine.arguments`, and every process here is a Swift binary (docs/reliability.md).
    @Suite("Reliability: clock jumps, deadlines and stops", .serialized, .timeLimit(.minutes(4 * Reliability.soak)))
    struct TimeAndStopScenarios {
        @Test("±1 h steps and Jepsen-style bumps of the wall clock while producing and uploading: order, no loss, times corrected")
        func clockJumps() async throws {
            let seed = Reliability.seed()
            var rng = SplitMix64(seed: seed)
            let steps = 30 * Reliability.soak
            try await withTemporaryGroup { group in
                let offsetFile = group + "-wall-offset"
                try "0".write(toFile: offsetFile, atomically: true, encoding: .utf8)
                let clock = ["TRIBUTARY_TEST_WALL_CLOCK_OFFSET_FILE": offsetFile]
                try await Collector.withRunning(CollectorConfiguration()) { collector in
                    let began = Date()
                    let ledger = Oracle.Ledger(producer: "clock", path: group + "-ledger-clock")
                    let producer = try ChildProcess(
                        "tributary-sim", ["load", "--group", group, "--producer-id", "clock", "--events", "\(steps * 20)",
                                          "--interval-ms", "5", "--ledger", ledger.path], environment: clock)
                    let agent = try ChildProcess(
                        "tributary-agent", Scenario.agentArguments(group, collector.url, once: false, ["--stop-timeout", "3"]),
                        environment: clock)
                    var offset: Int64 = 0
                    for step in 0..<steps {
                        if step % 10 == 5 {
                            offset += rng.next() % 2 == 0 ? 3_600_000 : -3_600_000  // a ±1 h step
                        } else {
                            let bump = Int64(1) << (2 + rng.next() % 17)  // ±2^(2..18) ms, as Jepsen's clock nemesis
                            offset += rng.next() % 2 == 0 ? bump : -bump
                        }
                        try "\(offset)".write(toFile: offsetFile, atomically: true, encoding: .utf8)
                        try await Task.sleep(for: .milliseconds(100))
                    }
                    let produced = await producer.finish()
                    #expect(produced.status == 0, "\(produced.stderr)")
                    agent.send(SIGTERM)
                    let stopped = await agent.finish()
                    #expect(stopped.status == 0, "\(stopped.stderr)")
                    let final = try await ChildProcess.run("tributary-agent", Scenario.agentArguments(group, collector.url), environment: clock)
                    #expect(final.status == 0, "\(final.stderr)")
                    let elapsedMillis = Int64(Date().timeIntervalSince(began) * 1000) + 2000
                    // docs/wire-formats.md, time correction: an event's `time` is consistent with `_flush_time`
                    // whatever the wall clock did in between: never after it, never longer before it than the run.
                    var inconsistent: [String] = []
                    for event in try await collector.events() {
                        let object = try event.jsonObject()
                        // Every event here is a track event: a missing time or _flush_time is a fault too.
                        guard let time = (object["time"] as? NSNumber)?.int64Value,
                            let flush = (object["_flush_time"] as? NSNumber)?.int64Value,
                            flush - time >= -1000, flush - time <= elapsedMillis
                        else {
                            inconsistent.append(event.eventID)
                            continue
                        }
                    }
                    var oracle = Oracle(ledgers: [ledger])
                    oracle.batchSize = Scenario.batchSize
                    oracle.inFlightWindows = 1
                    var verdict = try await oracle.judge(collector, group: group, outbox: Scenario.outbox(group))
                    if !inconsistent.isEmpty {
                        verdict.healthProblems.append("\(inconsistent.count) events without a time or _flush_time, or with a time not corrected to it")
                    }
                    Scenario.conclude(
                        "7 wall-clock steps ±1 h and bumps", test: "TimeAndStopScenarios/clockJumps", iterations: steps,
                        verdict: verdict, seed: seed)
                }
            }
        }

        @Test("SIGTERM at random moments with --stop-timeout 2: exit 0 within it (and the exit slack) every round; nothing lost")
        func sigtermAtRandomMoments() async throws {
            let seed = Reliability.seed()
            var rng = SplitMix64(seed: seed)
            let rounds = 6 * Reliability.soak
            try await withTemporaryGroup { group in
                let faults = FaultConfiguration(seed: seed, latencyMillis: 100, hangRate: 0.2)
                try await Collector.withRunning(CollectorConfiguration(faults: faults)) { collector in
                    let (producer, ledger) = try Scenario.producer(group, id: "steady", events: 250 * rounds, extra: ["--interval-ms", "2"])
                    var oracle = Oracle(ledgers: [ledger])
                    oracle.batchSize = Scenario.batchSize
                    var worst = 0.0
                    for round in 0..<rounds {
                        let notify = try NotifySocket(path: group + "-notify-\(round)")
                        let agent = try ChildProcess(
                            "tributary-agent", Scenario.agentArguments(group, collector.url, once: false, ["--stop-timeout", "2"]),
                            environment: ["NOTIFY_SOCKET": notify.path])
                        #expect(await notify.wait(for: "READY=1") != nil)
                        try await Task.sleep(for: .milliseconds(Int(rng.next() % 700)))
                        let sent = ContinuousClock.now
                        agent.send(SIGTERM)
                        let result = await agent.finish()
                        let took = agent.secondsToExit(from: sent)
                        worst = max(worst, took)
                        oracle.inFlightWindows += 1
                        #expect(result.status == 0 && agent.process.terminationReason == .exit, "\(result.stderr)")
                        // The agent's budget is --stop-timeout; the unit leaves systemd 5 s more (TimeoutStopSec)
                        // for the process to end. Here DeadlineTests.exitSlack: a debug binary exiting on a loaded 2-core machine.
                        #expect(took < 2 + DeadlineTests.exitSlack, "round \(round): stop took \(took) s")
                        #expect(DeadlineTests.groupLockIsFree(group), "round \(round): the group lock outlived the agent")
                    }
                    await producer.finish()
                    try await collector.setFaults(.none)
                    try await Scenario.drain(group, collector)
                    try await Scenario.conclude(
                        "8 SIGTERM at random moments (worst stop \(String(format: "%.2f", worst)) s)",
                        test: "TimeAndStopScenarios/sigtermAtRandomMoments", iterations: rounds, oracle: oracle,
                        collector: collector, group: group, seed: seed)
                }
            }
        }

        @Test("one-shot runs with a deadline shorter than the backlog needs: each exits 0 in time; together they deliver all")
        func onceDeadlineShorterThanBacklog() async throws {
            try await withTemporaryGroup { group in
                var oracle = Oracle(ledgers: try await Scenario.produce(group, [("backlog", 600 * Reliability.soak)]))
                oracle.batchSize = Scenario.batchSize
                try await Collector.withRunning(CollectorConfiguration(faults: FaultConfiguration(latencyMillis: 150))) { collector in
                    let total = oracle.ledgers.reduce(0) { $0 + $1.entries().count }
                    var runs = 0
                    while runs < 40 * Reliability.soak {
                        runs += 1
                        let (run, readyToExit) = try await DeadlineTests.runFromReady(
                            group, Scenario.agentArguments(group, collector.url, ["--deadline", "1.5", "--grace", "0.3"]))
                        #expect(run.status == 0, "\(run.stderr)")
                        // As DeadlineTests.onceDeadline: READY → exit within the deadline, plus the slack for the exit
                        // of a debug binary (the launch, before READY, is left out: up to 1.7 s on a loaded machine).
                        #expect(readyToExit < 1.5 + DeadlineTests.exitSlack, "run \(runs): READY=1 to exit took \(readyToExit) s with a 1.5 s deadline")
                        oracle.inFlightWindows += 1
                        if try await collector.stats().unique >= total { break }
                    }
                    #expect(runs > 1, "the backlog was meant to need more than one run")
                    try await Scenario.conclude(
                        "8 --once --deadline 1.5 s runs over a backlog", test: "TimeAndStopScenarios/onceDeadlineShorterThanBacklog",
                        iterations: runs, oracle: oracle, collector: collector, group: group)
                }
            }
        }

        @Test("watchdog restart path: the main loop freezes, pings stop, the service manager aborts and restarts it; nothing lost")
        func watchdogRestart() async throws {
            let rounds = 2 * Reliability.soak
            try await withTemporaryGroup { group in
                try await Collector.withRunning(CollectorConfiguration()) { collector in
                    var oracle = Oracle(ledgers: [])
                    oracle.batchSize = Scenario.batchSize
                    for round in 0..<rounds {
                        oracle.ledgers += try await Scenario.produce(group, [("watchdog-\(round)", 300)])
                        let notify = try NotifySocket(path: group + "-notify-\(round)")
                        let frozen = try ChildProcess(
                            "tributary-agent", Scenario.agentArguments(group, collector.url, once: false),
                            // Without the runtime's backtracer, which catches SIGABRT and can outlive the process
                            // holding its stdout (the unit's TimeoutAbortSec and KillMode=mixed end both).
                            environment: ["NOTIFY_SOCKET": notify.path, "WATCHDOG_USEC": "200000", "SWIFT_BACKTRACE": "enable=no",
                                          "TRIBUTARY_TEST_STALL_AFTER_MS": "\(300 + 200 * round)"])
                        #expect(await notify.wait(for: "READY=1") != nil)
                        #expect(await notify.wait(for: "WATCHDOG=1") != nil, "the watchdog never pinged before the freeze")
                        // As systemd does: no WATCHDOG=1 within WatchdogSec → WatchdogSignal (SIGABRT).
                        var last = 0
                        var stopped = false
                        for _ in 0..<50 {
                            try await Task.sleep(for: .milliseconds(200))
                            let pings = notify.received.filter { $0.text == "WATCHDOG=1" }.count
                            if pings == last {
                                stopped = true
                                break
                            }
                            last = pings
                        }
                        #expect(stopped, "round \(round): the pings went on for 10 s after the loop froze")
                        // Then, like systemd after TimeoutAbortSec, SIGKILL if the abort did not end it.
                        frozen.send(SIGABRT)
                        for _ in 0..<20 where frozen.process.isRunning { try await Task.sleep(for: .milliseconds(100)) }
                        if frozen.process.isRunning { frozen.send(SIGKILL) }
                        await frozen.finish()
                        oracle.crashWindows += 1
                        try await Scenario.drain(group, collector)  // Restart=on-failure
                    }
                    try await Scenario.conclude(
                        "8 watchdog abort and restart", test: "TimeAndStopScenarios/watchdogRestart", iterations: rounds,
                        oracle: oracle, collector: collector, group: group)
                }
            }
        }
    }
}
