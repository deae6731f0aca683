import AsyncHTTPClient
import Foundation
import Logging
import Testing
import Tributary
import TributaryCollector
import TributaryStore
import TributaryTestSupport

@testable import TributaryAgentCore

/// Scenario 9: a model-based property test of the agent's state machine, in the style of Vector's
/// disk-buffer model test. Seeded random sequences of operations run against the real parts (LMDB
/// store, SQLite outbox, drainer, upload session, the reference collector on loopback) and against a
/// reference model that is just the ordered list of acknowledged events; after every operation the
/// two must agree. Failing seeds go into ``regressionSeeds`` and are replayed first.
@Suite("Reliability: agent state machine against a reference model", .serialized, .timeLimit(.minutes(4 * Reliability.soak)))
struct AgentModelScenarios {
    /// Seeds that once failed (or that cover an interesting path); replayed on every run.
    static let regressionSeeds: [UInt64] = [1, 2, 3, 42]

    enum Operation: CaseIterable {
        case produce, producePoison, drain, uploadOK, upload503, upload429, upload413, uploadHang, uploadLostAck
        case restart, diskFullOn, diskFullOff

        /// Weights in the style of Vector's model (writes and reads most often).
        var weight: UInt64 {
            switch self {
            case .produce: 6
            case .drain: 4
            case .uploadOK: 5
            case .producePoison, .upload413, .uploadHang, .restart, .diskFullOn, .diskFullOff: 1
            case .upload503, .upload429, .uploadLostAck: 2
            }
        }

        static func random(_ rng: inout SplitMix64) -> Operation {
            let total = allCases.reduce(0) { $0 + $1.weight }
            var pick = rng.next() % total
            for op in allCases {
                if pick < op.weight { return op }
                pick -= op.weight
            }
            return .produce
        }
    }

    /// The reference model: what was acknowledged, in order, and which of it is poison.
    struct Model {
        var acknowledged: [String] = []
        var poison: Set<String> = []
        var diskFull = false
        var deliverable: [String] { acknowledged.filter { !poison.contains($0) } }
    }

    static let logger: Logger = {
        var logger = Logger(label: "model-test")
        logger.logLevel = .critical
        return logger
    }()

    /// The real system under test; `restart` replaces the outbox and the session, as a new process would.
    final class System: @unchecked Sendable {
        let store: SharedStore
        let tracker: Tracker
        let outboxPath: String
        let client: HTTPClient
        let url: String
        var outbox: Outbox
        var session: UploadSession

        init(group: String, url: String, client: HTTPClient) throws {
            self.client = client
            tracker = try Tracker(configuration: .init(groupDirectory: group, producerKind: .app, producerID: "model"))
            store = tracker.store
            outboxPath = group + "-state/outbox.sqlite"
            self.url = url
            outbox = try Outbox(path: outboxPath)
            session = UploadSession(outbox: outbox, client: client, configuration: Self.upload(url), logger: AgentModelScenarios.logger)
        }

        static func upload(_ url: String) -> UploadConfiguration {
            var configuration = UploadConfiguration(serverURL: url + "/sa")
            configuration.batchSize = 8
            configuration.backoff = Backoff(base: .milliseconds(1), cap: .milliseconds(2), maxRetryAfter: .milliseconds(2))
            configuration.requestTimeout = .milliseconds(300)
            return configuration
        }

        /// A new process: the outbox reopened (recovering its in-flight batch), a fresh upload session.
        func restart() throws {
            outbox = try Outbox(path: outboxPath)
            session = UploadSession(outbox: outbox, client: client, configuration: Self.upload(url), logger: AgentModelScenarios.logger)
        }

        /// One synchronous, durable track (never the async group-commit overload).
        func track(_ name: String) throws -> String {
            try tracker.track(name, properties: [:]).eventID
        }
    }

    @Test("seeded operation sequences agree with the reference model", arguments: regressionSeeds + [Reliability.seed()])
    func modelAgreement(seed: UInt64) async throws {
        let steps = 60 * Reliability.soak
        try await withTemporaryGroup { group in
            try await Collector.withRunning(CollectorConfiguration()) { collector in
                var model = Model()
                var rng = SplitMix64(seed: seed)
                var disagreements: [String] = []
                var uncertainRequests = 0  // a lost answer or a hang: the collector may hold the batch already
                let system = try await withHTTPClient(readTimeout: .milliseconds(300)) { client in
                    let system = try System(group: group, url: collector.url, client: client)
                    for step in 0..<steps {
                        let op = Operation.random(&rng)
                        if op == .uploadLostAck || op == .uploadHang { uncertainRequests += 1 }
                        try await Self.apply(op, to: system, model: &model, collector: collector, rng: &rng)
                        if let problem = try await Self.disagreement(system, model, collector) {
                            disagreements.append("step \(step) after \(op): \(problem)")
                            break
                        }
                    }
                    // Faults off, disk space back: everything acknowledged and deliverable arrives.
                    system.store.faults.reset()
                    try await collector.setFaults(FaultConfiguration(poisonPattern: "^Poison$"))
                    _ = try Drainer(store: system.store, outbox: system.outbox, logger: Self.logger).drainAvailable()
                    for _ in 0..<500 {
                        if case .empty = try await system.session.step() { break }
                    }
                    return system
                }
                var oracle = Oracle(ledgers: [])
                oracle.batchSize = 8
                // Each request whose answer was lost (a lost ack, a hang, a timeout after the collector
                // committed) may repeat one batch: the allowance counts those operations, not the collector's
                // `repeated_batches`, which an agent sending acknowledged batches again would raise with it (and
                // which misses a repeat whose events a 413 on the retry returned to the pool, under new ids).
                oracle.inFlightWindows = uncertainRequests
                oracle.expectedUndelivered = model.poison
                let repeated = try await collector.stats().repeatedBatches
                var verdict = oracle.judge(try await Oracle.Observed.from(collector))
                verdict.acknowledged = model.acknowledged.count
                let delivered = try await collector.events().map(\.eventID)
                verdict.lost = Set(model.deliverable).subtracting(delivered).count
                verdict.unexpected = Set(delivered).subtracting(model.deliverable).count
                verdict.healthProblems = disagreements + Oracle.outboxProblems(system.outboxPath)
                if repeated > uncertainRequests {
                    verdict.healthProblems.append("\(repeated) batches sent again after their acknowledgement, \(uncertainRequests) answers lost")
                }
                if delivered != model.deliverable { verdict.healthProblems.append("final delivery differs from the model's order") }
                let letters = Set(try system.outbox.deadLetters().compactMap(\.eventID))
                if letters != model.poison { verdict.healthProblems.append("dead letters \(letters.count) ≠ poison \(model.poison.count)") }
                let test = "AgentModelScenarios/modelAgreement"
                Reliability.record("9 model-based agent state machine (seed \(seed))", iterations: steps, verdict: verdict,
                                   seed: seed, test: test)
                #expect(verdict.passed, "\(verdict) — replay: \(Reliability.replay(test, seed: seed))")
            }
        }
    }

    static func apply(
        _ op: Operation, to system: System, model: inout Model, collector: RunningCollector, rng: inout SplitMix64
    ) async throws {
        switch op {
        case .produce, .producePoison:
            for _ in 0..<(op == .produce ? 1 + Int(rng.next() % 6) : 1) {
                do {
                    let id = try system.track(op == .produce ? "Ordinary" : "Poison")
                    #expect(!model.diskFull, "a track succeeded while the disk was full")
                    model.acknowledged.append(id)
                    if op == .producePoison { model.poison.insert(id) }
                } catch {
                    #expect(model.diskFull, "track failed with the disk not full: \(error)")
                }
            }
        case .drain:
            _ = try Drainer(store: system.store, outbox: system.outbox, logger: logger).drainAvailable()
        case .uploadOK, .upload503, .upload429, .upload413, .uploadHang, .uploadLostAck:
            var faults = FaultConfiguration(poisonPattern: "^Poison$")
            switch op {
            case .upload503: faults.forcedStatus = 503
            case .upload429: (faults.forcedStatus, faults.retryAfter) = (429, "0")
            case .upload413: faults.maxEventsPerBatch = 3
            case .uploadHang: faults.hangRate = 1
            case .uploadLostAck: faults.lostAckRate = 1
            default: break
            }
            try await collector.setFaults(faults)
            _ = try await system.session.step(timeout: .milliseconds(300))
        case .restart:
            try system.restart()
        case .diskFullOn:
            system.store.faults.inject(ENOSPC, at: .put, times: 1_000_000)
            model.diskFull = true
        case .diskFullOff:
            system.store.faults.reset()
            model.diskFull = false
        }
    }

    /// Where the real system and the model disagree, or nil.
    static func disagreement(_ system: System, _ model: Model, _ collector: RunningCollector) async throws -> String? {
        let delivered = try await collector.events().map(\.eventID)
        // Strict order: what arrived is a prefix of the model's deliverable events.
        guard delivered.count <= model.deliverable.count, Array(model.deliverable.prefix(delivered.count)) == delivered else {
            return "collector order \(delivered.suffix(3)) is not a prefix of the model's"
        }
        // Conservation: every acknowledged event is exactly once in store, outbox, delivered or dead letters.
        let storePending = try system.store.status().pendingEvents
        let outboxPending = try system.outbox.pending().count
        let counters = try system.outbox.counters()
        let accounted = storePending + outboxPending + Int(counters.delivered) + Int(counters.deadLetters)
        guard accounted == model.acknowledged.count else {
            return "store \(storePending) + outbox \(outboxPending) + delivered \(counters.delivered) + dead "
                + "\(counters.deadLetters) = \(accounted), model acknowledged \(model.acknowledged.count)"
        }
        guard Int(counters.delivered) <= delivered.count else {
            return "the outbox marked \(counters.delivered) delivered, the collector has \(delivered.count)"
        }
        return nil
    }
}
