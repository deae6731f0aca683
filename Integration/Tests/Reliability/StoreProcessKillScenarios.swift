import Foundation
import Testing
import TributaryCollector
import TributaryStore
import TributaryTestSupport

extension ReliabilityScenarios {
    /// Scenarios 3 and 4: processes killed inside LMDB transactions. A producer frozen inside its write
    /// transaction (writer lock held, records put, not committed) and killed; processes frozen inside a
    /// read transaction (a reader slot taken) and killed, 1,000 times. Frozen through the store's test
    /// seam `TRIBUTARY_TEST_PAUSE_AT` (``TestPause``), so the kill lands exactly there.
    @Suite("Reliability: store processes killed in transactions", .serialized, .timeLimit(.minutes(4 * Reliability.soak)))
    struct StoreProcessKillScenarios {
        @Test("producers killed holding the writer lock mid-transaction: the others and the agent continue, no partial event")
        func producerKilledInWriteTransaction() async throws {
            let victims = 3 * Reliability.soak
            let seed = Reliability.seed()
            var rng = SplitMix64(seed: seed)
            try await withTemporaryGroup { group in
                try await Collector.withRunning(CollectorConfiguration()) { collector in
                    let survivors = try (0..<2).map {
                        try Scenario.producer(group, id: "survivor-\($0)", events: 150 * victims,
                                              extra: ["--interval-ms", "2", "--concurrency", "\($0 * 4)"])
                    }
                    var oracle = Oracle(ledgers: survivors.map(\.ledger))
                    oracle.batchSize = Scenario.batchSize
                    let agent = try ChildProcess("tributary-agent", Scenario.agentArguments(group, collector.url, once: false))
                    for v in 0..<victims {
                        // One synchronous track per transaction: the ledger holds exactly the commits before the freeze.
                        let freezeAt = 2 + Int(rng.next() % 40)
                        let ledger = Oracle.Ledger(producer: "victim-\(v)", path: group + "-ledger-victim-\(v)")
                        let victim = try ChildProcess(
                            "tributary-sim",
                            ["load", "--group", group, "--producer-id", ledger.producer, "--events", "1000", "--ledger", ledger.path],
                            environment: ["TRIBUTARY_TEST_PAUSE_AT": "store.append:\(freezeAt)"])
                        let paused = await victim.waitForLine(startingWith: "PAUSED")
                        #expect(paused == "PAUSED store.append", "victim \(v) never froze in its write transaction")
                        try await Task.sleep(for: .milliseconds(Int(rng.next() % 100)))  // the others queue on the lock
                        victim.send(SIGKILL)
                        await victim.finish()
                        #expect(ledger.entries().count == freezeAt - 1, "victim \(v) acknowledged \(ledger.entries().count)")
                        oracle.ledgers.append(ledger)
                    }
                    for survivor in survivors {
                        let result = await survivor.process.finish()
                        #expect(result.status == 0, "a survivor failed after a writer died holding the lock: \(result.stderr)")
                    }
                    agent.send(SIGTERM)
                    #expect(await agent.finish().status == 0)
                    try await Scenario.drain(group, collector)
                    // The frozen transactions never committed: a victim's events are exactly its ledger.
                    let store = try SharedStore(groupDirectory: group)
                    let victimRegistrations = try store.producers().filter { $0.id.hasPrefix("victim") }
                    #expect(victimRegistrations.count == victims, "every victim registered before it froze")
                    for registration in victimRegistrations {
                        let acknowledged = oracle.ledgers.first { $0.producer == registration.id }?.entries().count
                        #expect(acknowledged.map { UInt64($0) } == registration.lastSeq, "\(registration.id) partial commit")
                    }
                    try await Scenario.conclude(
                        "3 producer kill -9 holding the writer lock", test: "StoreProcessKillScenarios/producerKilledInWriteTransaction",
                        iterations: victims, oracle: oracle, collector: collector, group: group, seed: seed)
                }
            }
        }

        @Test("processes killed inside a read transaction, 1,000 cycles: stale slots cleared, file size flat")
        func readerKilledInReadTransaction() async throws {
            let cycles = 1000 * Reliability.soak
            let parallel = 10
            try await withTemporaryGroup { group in
                let store = try SharedStore(groupDirectory: group)
                let producer = SharedStore.Producer(kind: .app, id: "writer")
                var written = 0
                var readBack = 0
                var sizeAfterWarmup = 0
                var worstStale = 0
                for round in 0..<(cycles / parallel) {
                    let readers = try (0..<parallel).map { _ in
                        try ChildProcess("tributary", ["status", "--group", group, "--json"],
                                         environment: ["TRIBUTARY_TEST_PAUSE_AT": "store.read"])
                    }
                    for reader in readers {
                        #expect(await reader.waitForLine(startingWith: "PAUSED") == "PAUSED store.read")
                    }
                    // While they read, the store keeps turning over: free pages must be reusable after they die.
                    let body = Array(#"{"type":"track","event":"Churn"}"#.utf8)
                    written += try store.append(producer: producer, count: 20) { _, _ in
                        SharedStore.Draft(wallTimeMillis: BootClock.wallMillis(), bootTimeNanos: BootClock.nowNanos(), body: body)
                    }.count
                    for reader in readers { reader.send(SIGKILL) }
                    for reader in readers { await reader.finish() }
                    let stale = Oracle.staleReaderSlots(store)
                    worstStale = max(worstStale, stale.count)
                    let events = try store.events(limit: .max)
                    readBack += events.count
                    if let last = events.last?.seq { try store.deleteEvents(through: last) }
                    if round == 4 { sizeAfterWarmup = try store.status().fileSize }
                }
                // The next process to open the store clears the last round's slots.
                let opener = try await ChildProcess.run("tributary", ["status", "--group", group, "--json"])
                #expect(opener.status == 0, "\(opener.stderr)")
                var verdict = Oracle.Verdict()
                verdict.acknowledged = written
                verdict.delivered = readBack
                verdict.lost = written - readBack
                verdict.healthProblems = Oracle.healthProblems(group: group, outbox: nil)
                let size = try store.status().fileSize
                if size > sizeAfterWarmup + (1 << 20) {
                    verdict.healthProblems.append("store grew from \(sizeAfterWarmup) to \(size) bytes over \(cycles) reader kills")
                }
                if worstStale > parallel {
                    verdict.healthProblems.append("stale reader slots piled up: \(worstStale) at once")
                }
                Scenario.conclude(
                    "4 reader kill -9 in a read transaction", test: "StoreProcessKillScenarios/readerKilledInReadTransaction",
                    iterations: cycles, verdict: verdict)
            }
        }
    }
}
