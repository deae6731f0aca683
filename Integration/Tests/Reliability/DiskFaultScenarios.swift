import Foundation
import Testing
import TributaryCollector
import TributaryStore
import TributaryTestSupport

extension ReliabilityScenarios {
    /// Scenario 5: disk full and I/O errors. A quota-limited store (producers get a clean "store full"
    /// error, exit 75, and succeed once the agent drained), and `strace -e inject=…` on the agent's
    /// fsyncs (EIO: the agent stops, exit non-zero, without calling fsync on that file again) and
    /// writes (ENOSPC: the agent stops or backs off, nothing is corrupted). After each fault, a clean
    /// agent run drains everything and the oracle judges the whole history.
    @Suite("Reliability: disk full and I/O errors", .serialized, .timeLimit(.minutes(4 * Reliability.soak)))
    struct DiskFaultScenarios {
        static let strace = "/usr/bin/strace"

        /// Why `strace` cannot inject faults here, or nil when it can.
        static func straceUnavailable() async -> String? {
            guard FileManager.default.isExecutableFile(atPath: strace) else { return "strace not installed (make deps)" }
            guard let probe = try? ChildProcess(path: strace, ["-o", "/dev/null", "-e", "inject=fsync:error=EIO", "true"]) else {
                return "strace cannot start"
            }
            let result = await probe.finish()
            return result.status == 0 ? nil : "ptrace not permitted (\(result.stderr.prefix(80)))"
        }

        /// The agent under `strace -f`, tracing `syscalls` into `log` and injecting `inject`.
        static func tracedAgent(_ group: String, _ url: String, syscalls: String, inject: String, log: String)
            async throws -> (status: Int32, stdout: String, stderr: String)
        {
            let agent = productsDirectory.appendingPathComponent("tributary-agent").path
            let args = ["-f", "-qq", "-y", "-o", log, "-e", "trace=" + syscalls, "-e", "inject=" + inject, agent]
                + Scenario.agentArguments(group, url, ["--deadline", "8"])
            return try await ChildProcess(path: strace, args).finish()
        }

        @Test("fsync EIO: the agent stops with a non-zero exit and never fsyncs that file again; the next run drains all")
        func fsyncEIO() async throws {
            let rounds = 4 * Reliability.soak
            let seed = Reliability.seed()
            var rng = SplitMix64(seed: seed)
            let name = "5 agent fsync EIO (strace)"
            if let reason = await Self.straceUnavailable() {
                Reliability.record(name, iterations: 0, verdict: nil, skipped: reason)
                return
            }
            try await withTemporaryGroup { group in
                try await Collector.withRunning(CollectorConfiguration()) { collector in
                    var oracle = Oracle(ledgers: [])
                    oracle.batchSize = Scenario.batchSize
                    // The outbox exists before the first fault: a failed fsync while SQLite creates it is
                    // retried by SQLite itself with a new journal (docs/reliability.md, "still open").
                    try await Scenario.drain(group, collector)
                    var dataFileFaults = 0
                    var problems: [String] = []
                    for round in 0..<rounds {
                        oracle.ledgers += try await Scenario.produce(group, [("eio-\(round)", 200)])
                        // strace counts `when=` per thread, and an agent that writes nothing when idle
                        // syncs each file only a few times a run (a drain of 200 events: 1 to 5 calls per
                        // thread). A later call would fail on no thread at all and test nothing.
                        let nth = 1 + Int(rng.next() % 4)
                        let log = group + "-strace-\(round)"
                        let run = try await Self.tracedAgent(
                            group, collector.url, syscalls: "fsync,fdatasync", inject: "fsync,fdatasync:error=EIO:when=\(nth)",
                            log: log)
                        oracle.crashWindows += 1
                        let trace = (try? String(contentsOfFile: log, encoding: .utf8)) ?? ""
                        let calls = Self.syncCalls(trace)
                        // strace counts `when=` per thread. A failed fsync of a file SQLite or the agent
                        // recreates (rollback journal, status temp file, directory) is not a data loss; one
                        // of the outbox, its WAL or the store must stop the agent with that file never
                        // synced again.
                        if let failed = calls.firstIndex(where: { $0.injected && Self.isDataFile($0.fd) }) {
                            dataFileFaults += 1
                            // FatalIO's promise: exit 74 at once, not 0, nor a crash, nor an internal error.
                            if run.status != 74 {
                                problems.append("round \(round): exit \(run.status), not 74, after EIO on \(calls[failed].fd)")
                            }
                            let again = calls[(failed + 1)...].filter { $0.fd == calls[failed].fd }
                            if !again.isEmpty { problems.append("round \(round): \(calls[failed].fd) fsynced again after EIO: \(again.map(\.line))") }
                        }
                        try await Scenario.drain(group, collector)
                    }
                    if dataFileFaults == 0 { problems.append("no round hit the outbox or the store with EIO") }
                    try await Scenario.conclude(
                        name + " (\(dataFileFaults) on data files)", test: "DiskFaultScenarios/fsyncEIO", iterations: rounds, oracle: oracle,
                        collector: collector, group: group, seed: seed, problems: problems)
                }
            }
        }

        @Test("write ENOSPC from the n-th write on: the agent fails safe, nothing corrupted; the next run drains all")
        func writeENOSPC() async throws {
            let rounds = 3 * Reliability.soak
            let seed = Reliability.seed()
            var rng = SplitMix64(seed: seed)
            let name = "5 agent write ENOSPC (strace)"
            if let reason = await Self.straceUnavailable() {
                Reliability.record(name, iterations: 0, verdict: nil, skipped: reason)
                return
            }
            try await withTemporaryGroup { group in
                try await Collector.withRunning(CollectorConfiguration()) { collector in
                    var oracle = Oracle(ledgers: [])
                    oracle.batchSize = Scenario.batchSize
                    var injectedRounds = 0
                    for round in 0..<rounds {
                        oracle.ledgers += try await Scenario.produce(group, [("enospc-\(round)", 200)])
                        let nth = 1 + Int(rng.next() % 12)
                        let log = group + "-strace-\(round)"
                        let run = try await Self.tracedAgent(
                            group, collector.url, syscalls: "pwrite64,pwritev,write,writev",
                            inject: "pwrite64,pwritev:error=ENOSPC:when=\(nth)+", log: log)
                        if ((try? String(contentsOfFile: log, encoding: .utf8)) ?? "").contains("(INJECTED)") { injectedRounds += 1 }
                        oracle.crashWindows += 1
                        #expect(run.status == 0 || run.status == 74, "round \(round): unexpected exit \(run.status): \(run.stderr)")
                        #expect(Oracle.outboxProblems(Scenario.outbox(group)).isEmpty)
                        try await Scenario.drain(group, collector)
                    }
                    // An injection that never matched (the agent writing through another call) tests nothing.
                    try await Scenario.conclude(
                        name + " (\(injectedRounds) rounds injected)", test: "DiskFaultScenarios/writeENOSPC", iterations: rounds,
                        oracle: oracle, collector: collector, group: group, seed: seed,
                        problems: injectedRounds == 0 ? ["no round had a write fail with ENOSPC"] : [])
                }
            }
        }

        @Test("a store at its quota: producers get a clean store-full error (exit 75), and write again once the agent drained")
        func storeQuota() async throws {
            let rounds = 2 * Reliability.soak
            try await withTemporaryGroup { group in
                try await Collector.withRunning(CollectorConfiguration()) { collector in
                    var oracle = Oracle(ledgers: [])
                    oracle.batchSize = Scenario.batchSize
                    var fullErrors = 0
                    for round in 0..<rounds {
                        let (process, ledger) = try Scenario.producer(
                            group, id: "quota-\(round)", events: 100_000, extra: ["--store-quota", "\(1 << 20)", "--concurrency", "4"])
                        let result = await process.finish()
                        oracle.ledgers.append(ledger)
                        #expect(result.status == 75, "expected a store-full exit, got \(result.status): \(result.stderr)")
                        #expect(result.stderr.contains("quota") || result.stderr.lowercased().contains("full"), "\(result.stderr)")
                        if result.status == 75 { fullErrors += 1 }
                        #expect(ledger.entries().count > 100, "the quota should hold more than 100 events")
                        try await Scenario.drain(group, collector)
                        // Drained: the same quota takes new events again.
                        let after = try await ChildProcess.run(
                            "tributary-sim", ["load", "--group", group, "--producer-id", "quota-\(round)-after", "--events", "50",
                                              "--store-quota", "\(1 << 20)", "--ledger", group + "-ledger-after-\(round)"])
                        #expect(after.status == 0, "\(after.stderr)")
                        oracle.ledgers.append(Oracle.Ledger(producer: "quota-\(round)-after", path: group + "-ledger-after-\(round)"))
                        try await Scenario.drain(group, collector)
                    }
                    #expect(fullErrors == rounds)
                    try await Scenario.conclude(
                        "5 store quota full (producers)", test: "DiskFaultScenarios/storeQuota", iterations: rounds,
                        oracle: oracle, collector: collector, group: group)
                }
            }
        }

        /// The outbox, its WAL and the store: files whose failed fsync may have lost committed pages.
        static func isDataFile(_ path: String) -> Bool {
            path.hasSuffix("outbox.sqlite") || path.hasSuffix("outbox.sqlite-wal") || path.hasSuffix(SharedStore.fileName)
        }

        /// One traced fsync or fdatasync: its file (or descriptor), whether strace injected its failure, the line.
        struct SyncCall {
            var fd: String
            var injected: Bool
            var line: String
        }

        /// The fsync/fdatasync calls of an `strace -f -qq -y` log, in order. A call that another thread
        /// interrupted is split over an `<unfinished ...>` line and a `<... resumed>` line; both are joined.
        static func syncCalls(_ trace: String) -> [SyncCall] {
            var calls: [SyncCall] = []
            var unfinished: [Substring: Int] = [:]  // pid → index in calls
            for raw in trace.split(separator: "\n") {
                let line = String(raw)
                let pid = raw.prefix { $0.isNumber }
                if line.contains("sync resumed>"), let index = unfinished.removeValue(forKey: pid) {
                    calls[index].injected = line.contains("(INJECTED)")
                    calls[index].line += " … " + line
                    continue
                }
                guard let open = line.range(of: "sync(") else { continue }
                // With `-y` the argument reads `5</path/to/file>`: compare files, not descriptors (each
                // SQLite connection opens the WAL with a descriptor of its own).
                let rest = line[open.upperBound...]
                let argument = rest.prefix { $0 != ")" && $0 != " " }
                let file = argument.split(separator: "<", maxSplits: 1).last.map { String($0.prefix { $0 != ">" }) }
                calls.append(SyncCall(fd: file ?? String(argument), injected: line.contains("(INJECTED)"), line: line))
                if line.hasSuffix("<unfinished ...>") { unfinished[pid] = calls.count - 1 }
            }
            return calls
        }
    }
}
