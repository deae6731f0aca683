import Foundation
import Logging
import Testing
import Tributary
import TributaryCollector
import TributaryStore
import TributaryTestSupport
import TributaryWire

@testable import TributaryAgentCore

/// The agent against the real reference collector on loopback.
@Suite("Upload to the reference collector")
struct UploadTests {
    static let logger: Logger = {
        var logger = Logger(label: "agent-test")
        logger.logLevel = .warning
        return logger
    }()

    /// Fills a group with `count` events from two producers (an app and an extension), interleaved.
    static func produce(_ group: String, count: Int) async throws {
        let app = try Tracker(configuration: .init(groupDirectory: group, producerKind: .app))
        let ext = try Tracker(configuration: .init(groupDirectory: group, producerKind: .extension, producerID: "share"))
        try await withThrowingTaskGroup(of: Void.self) { tasks in
            for (tracker, half) in [(app, 0), (ext, 1)] {
                tasks.addTask {
                    for i in stride(from: half, to: count, by: 2) {
                        try await tracker.track(i % 97 == 13 ? "Poison" : "Ordinary", properties: ["i": .int(Int64(i))])
                    }
                }
            }
            try await tasks.waitForAll()
        }
    }

    static func agent(_ group: String, _ collector: RunningCollector, format: WireFormat = .sensors,
                      _ adjust: (inout AgentConfiguration) -> Void = { _ in }) throws -> Agent {
        try agent(group, serverURL: collector.url + "/sa", format: format, adjust)
    }

    /// An agent for `group` with fast backoff and polls, sending to `serverURL` (nil: none given).
    static func agent(_ group: String, serverURL: String?, format: WireFormat = .sensors,
                      _ adjust: (inout AgentConfiguration) -> Void = { _ in }) throws -> Agent {
        var config = AgentConfiguration(
            groupDirectory: group, serverURL: serverURL, outboxPath: group + "-state/outbox.sqlite")
        config.upload.format = format
        config.upload.backoff = Backoff(base: .milliseconds(5), cap: .milliseconds(40), maxRetryAfter: .milliseconds(50))
        config.upload.requestTimeout = .seconds(5)  // generous: a loaded 2-core machine must not cause resends
        config.pollInterval = .milliseconds(20)
        adjust(&config)
        return try Agent(configuration: config, logger: logger)
    }

    /// Polls `condition` every 20 ms until it holds or `seconds` pass (on a loaded 2-core machine an
    /// agent's turn can take seconds); returns whether it held.
    static func eventually(within seconds: Double = 30, _ condition: () async throws -> Bool) async throws -> Bool {
        let began = Date()
        while Date().timeIntervalSince(began) < seconds {
            if try await condition() { return true }
            try await Task.sleep(for: .milliseconds(20))
        }
        return try await condition()
    }

    /// `count` events produced into `group` (``produce(_:count:)``) and drained into its outbox.
    static func drainedOutbox(_ group: String, count: Int) async throws -> Outbox {
        try await produce(group, count: count)
        let tracker = try Tracker(configuration: .init(groupDirectory: group))
        let outbox = try Outbox(path: group + "-state/outbox.sqlite")
        #expect(try Drainer(store: tracker.store, outbox: outbox, logger: logger).drainAvailable() == count)
        return outbox
    }

    /// Checks the collector holds exactly `count` unique events, each producer's in order, seq in order.
    static func expectDelivered(_ collector: RunningCollector, count: Int, sourceLocation: SourceLocation = #_sourceLocation) async throws {
        let stats = try await collector.stats()
        #expect(stats.unique == count, sourceLocation: sourceLocation)
        #expect(stats.orderViolations.values.reduce(0, +) == 0, sourceLocation: sourceLocation)
        #expect(stats.seqViolations == 0, sourceLocation: sourceLocation)
        let events = try await collector.events(limit: count + 10)
        #expect(events.compactMap(\.seq) == Array(1...UInt64(count)), "global order", sourceLocation: sourceLocation)
    }

    @Test("the Date header is an IMF-fixdate, the same as DateFormatter writes", arguments: [
        Int64(784_111_777_000), 0, -1, 951_782_400_999, 1_767_225_599_500, 1_795_480_394_571, 253_402_300_799_000,
    ])
    func httpDateMatchesFormatter(millis: Int64) {
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = TimeZone(identifier: "GMT")
        formatter.dateFormat = "EEE, dd MMM yyyy HH:mm:ss 'GMT'"
        let seconds = (Double(millis) / 1000).rounded(.down)
        #expect(httpDate(millis) == formatter.string(from: Date(timeIntervalSince1970: seconds)))
        if millis == 784_111_777_000 { #expect(httpDate(millis) == "Sun, 06 Nov 1994 08:49:37 GMT") }
    }

    @Test("clean delivery in order", arguments: WireFormat.allCases)
    func cleanDelivery(format: WireFormat) async throws {
        try await withTemporaryGroup { group in
            try await Self.produce(group, count: 1200)
            try await Collector.withRunning(CollectorConfiguration()) { collector in
                let agent = try Self.agent(group, collector, format: format)
                let report = try await agent.runOnce()
                #expect(report.drained == 1200 && report.delivered == 1200)
                try await Self.expectDelivered(collector, count: 1200)
                let stats = try await collector.stats()
                #expect(stats.duplicates == 0)
                #expect(stats.batches == 3)  // 500 + 500 + 200
                #expect(stats.producers == ["app": 600, "share": 600])
                #expect(try agent.outbox.pending().count == 0)
            }
        }
    }

    @Test("30% 503 with Retry-After: everything arrives, retries counted")
    func serviceUnavailable() async throws {
        try await withTemporaryGroup { group in
            try await Self.produce(group, count: 1000)
            let faults = FaultConfiguration(seed: 7, failureRate: 0.3, failureStatus: 503, retryAfter: "0")
            try await Collector.withRunning(CollectorConfiguration(faults: faults)) { collector in
                let agent = try Self.agent(group, collector) { $0.upload.batchSize = 50 }
                _ = try await agent.runOnce()
                try await Self.expectDelivered(collector, count: 1000)
                let stats = try await collector.stats()
                #expect(stats.faults.failure > 0)
                #expect(try agent.outbox.counters().retries == Int64(stats.faults.failure))
            }
        }
    }

    @Test("resets and hangs: everything arrives once after dedup")
    func resetsAndHangs() async throws {
        try await withTemporaryGroup { group in
            try await Self.produce(group, count: 600)
            let faults = FaultConfiguration(seed: 3, hangRate: 0.15, resetRate: 0.25)
            try await Collector.withRunning(CollectorConfiguration(faults: faults)) { collector in
                let agent = try Self.agent(group, collector) {
                    $0.upload.batchSize = 40
                    $0.upload.requestTimeout = .milliseconds(300)
                }
                _ = try await agent.runOnce()
                try await Self.expectDelivered(collector, count: 600)
                let stats = try await collector.stats()
                #expect(stats.faults.hang > 0 && stats.faults.reset > 0)
            }
        }
    }

    @Test("lost acknowledgements: duplicates on the wire, none after dedup")
    func lostAcks() async throws {
        try await withTemporaryGroup { group in
            try await Self.produce(group, count: 600)
            let faults = FaultConfiguration(seed: 11, lostAckRate: 0.3)
            try await Collector.withRunning(CollectorConfiguration(faults: faults)) { collector in
                let agent = try Self.agent(group, collector) { $0.upload.batchSize = 30 }
                _ = try await agent.runOnce()
                try await Self.expectDelivered(collector, count: 600)
                let stats = try await collector.stats()
                #expect(stats.faults.lostAck > 0)
                #expect(stats.duplicates > 0, "a lost ack must cause a resend")
                #expect(stats.received == 600 + stats.duplicates)
            }
        }
    }

    @Test("a group store created anew under the same outbox is drained from its first event, not skipped as drained")
    func storeCreatedAnew() async throws {
        try await withTemporaryGroup { group in
            try await Collector.withRunning(CollectorConfiguration()) { collector in
                try await Self.produce(group, count: 30)
                let first = try SharedStore(groupDirectory: group).storeID
                _ = try await Self.agent(group, collector).runOnce()
                #expect(try await collector.stats().unique == 30)
                // The app reinstalled, or the store removed by hand: the outbox (under $STATE_DIRECTORY) stays.
                try FileManager.default.removeItem(atPath: group)
                try await Self.produce(group, count: 20)
                let second = try SharedStore(groupDirectory: group).storeID
                #expect(second != first && second != 0)
                let agent = try Self.agent(group, collector)
                _ = try await agent.runOnce()
                #expect(try await collector.stats().unique == 50, "the new store's seqs 1…20 are not the old store's")
                #expect(try SharedStore(groupDirectory: group).status().pendingEvents == 0)
                #expect(try agent.outbox.counters().duplicatesSkipped == 0)
                let seqs = try await collector.events(limit: 100).compactMap(\.seq)
                #expect(seqs == Array(1...30) + Array(1...20))
            }
        }
    }

    @Test("a group store restored from an earlier copy of itself is drained again: no new event is skipped as drained, however many chunks were drained since")
    func storeRestoredFromBackup() async throws {
        try await withTemporaryGroup { group in
            try await Collector.withRunning(CollectorConfiguration()) { collector in
                let path = group + "/" + SharedStore.fileName
                try await Self.produce(group, count: 30)
                _ = try await Self.agent(group, collector).runOnce()
                try await Self.produce(group, count: 10)
                // A backup of the group directory: drained through seq 30, seqs 31…40 waiting.
                try FileManager.default.copyItem(atPath: path, toPath: group + "-backup.mdb")
                try await Self.produce(group, count: 10)
                _ = try await Self.agent(group, collector).runOnce()  // 31…50, one chunk
                #expect(try await collector.stats().unique == 50)
                // The backup restored (the outbox, under $STATE_DIRECTORY, is not): the same store id, and new
                // events numbered 41… again, seqs the outbox drained through 50 from the lost copy.
                try FileManager.default.removeItem(atPath: path)
                try FileManager.default.removeItem(atPath: path + "-lock")
                try FileManager.default.copyItem(atPath: group + "-backup.mdb", toPath: path)
                try await Self.produce(group, count: 15)
                _ = try await Self.agent(group, collector).runOnce()
                // Seqs 41…50 of the new events were skipped as drained, and deleted unsent: 55.
                #expect(try await collector.stats().unique == 65)
                #expect(try await collector.stats().duplicates >= 10, "31…40 went again, with their ids")
                #expect(try SharedStore(groupDirectory: group).status().pendingEvents == 0)
            }
        }
    }

    @Test("413 splits the batch until it fits")
    func payloadTooLarge() async throws {
        try await withTemporaryGroup { group in
            try await Self.produce(group, count: 700)
            let faults = FaultConfiguration(maxEventsPerBatch: 60)
            try await Collector.withRunning(CollectorConfiguration(faults: faults)) { collector in
                let agent = try Self.agent(group, collector)
                _ = try await agent.runOnce()
                try await Self.expectDelivered(collector, count: 700)
                #expect(try await collector.stats().faults.tooLarge >= 3)
                #expect(try agent.outbox.deadLetters().isEmpty)
            }
        }
    }

    @Test("an event too large even alone is dead-lettered, and the batch size grows back after it")
    func tooLargeAlone() async throws {
        try await withTemporaryGroup { group in
            let tracker = try Tracker(configuration: .init(groupDirectory: group))
            let padding = Dictionary(uniqueKeysWithValues: (0..<20).map { ("p\($0)", PropertyValue.string(String(repeating: "x", count: 8000))) })
            try await tracker.track("Huge", properties: padding)
            for i in 0..<600 { try await tracker.track("Ordinary", properties: ["i": .int(Int64(i))]) }
            // 64 KiB of body after decompression: the huge event (160 KB) never fits, 500 ordinary ones do.
            try await Collector.withRunning(CollectorConfiguration(maxBodyBytes: 64 << 10)) { collector in
                let agent = try Self.agent(group, collector)
                _ = try await agent.runOnce()
                let letters = try agent.outbox.deadLetters()
                #expect(letters.map(\.seq) == [1] && letters.first?.status == 413)
                let stats = try await collector.stats()
                #expect(stats.unique == 600)
                // 500, 250, … 1 refused (10 requests), then batches of 1, 2, 4, … (about 10), not 100 of one.
                #expect(stats.requests < 40, "\(stats.requests) requests")
            }
        }
    }

    @Test("one poison event in a batch of 500 is isolated in about log2(500) requests")
    func poisonBisect() async throws {
        try await withTemporaryGroup { group in
            let tracker = try Tracker(configuration: .init(groupDirectory: group))
            for i in 0..<500 { try await tracker.track(i == 321 ? "Poison" : "Ordinary", properties: ["i": .int(Int64(i))]) }
            let faults = FaultConfiguration(poisonPattern: "^Poison$", poisonStatus: 422)
            try await Collector.withRunning(CollectorConfiguration(faults: faults)) { collector in
                let agent = try Self.agent(group, collector)
                _ = try await agent.runOnce()
                let stats = try await collector.stats()
                #expect(stats.unique == 499)
                #expect(stats.requests <= 1 + 10, "bisection took \(stats.requests) requests (log2(500) ≈ 9)")
                let letters = try agent.outbox.deadLetters()
                #expect(letters.count == 1)
                #expect(letters.first?.seq == 322 && letters.first?.status == 422)
                #expect(letters.first?.reason.contains("422") == true)
                let seqs = try await collector.events(limit: 1000).compactMap(\.seq)
                #expect(seqs == Array(1...321) + Array(323...500))
            }
        }
    }

    @Test(
        "a collector that refuses every event halts the agent after 10 dead letters, not the whole backlog; each later run dead-letters the one held; fixed, the rest goes",
        arguments: [(400, false), (413, false), (400, true)])
    func refusesEverythingHalts(status: Int, urlFromGroupSettings: Bool) async throws {
        try await withTemporaryGroup { group in
            let tracker = try Tracker(configuration: .init(groupDirectory: group))
            for i in 0..<300 { try await tracker.track("Ordinary", properties: ["i": .int(Int64(i))]) }
            // A wrong format, or a proxy answering 400 to everything: every request refused as bad data. Or
            // a body limit below any event: every event too large even alone.
            try await Collector.withRunning(CollectorConfiguration(faults: FaultConfiguration(forcedStatus: status))) { collector in
                // The URL from --server, or from the group's settings (each run then starts with none and
                // takes it from the store: no new destination for all that).
                if urlFromGroupSettings {
                    try SharedStore(groupDirectory: group).setAgentSettings(AgentSettings(serverURL: collector.url + "/sa"))
                }
                func newAgent() throws -> Agent {
                    try Self.agent(group, serverURL: urlFromGroupSettings ? nil : collector.url + "/sa") { $0.upload.batchSize = 50 }
                }
                let agent = try newAgent()
                let halted = await #expect(throws: AgentError.self) { try await agent.runOnce() }
                #expect(halted?.code == .halted, "\(String(describing: halted))")
                #expect(halted?.message.contains("refused the last 10 events one by one") == true, "\(String(describing: halted))")
                let letters = try agent.outbox.deadLetters()
                #expect(letters.map(\.seq) == Array(1...10), "the first 10, each isolated alone, then the halt")
                #expect(letters.allSatisfy { $0.status == status })
                #expect(try agent.outbox.pending().count == 290, "the 11th refused event was kept, and every one after it")
                #expect(try await collector.stats().unique == 0)
                // The next runs (a timer's --once, restarts) go on counting: each sends the event held back
                // alone, dead-letters it when it is refused again, and halts at the next one.
                for run in 1...2 {
                    let again = await #expect(throws: AgentError.self) { try await newAgent().runOnce() }
                    #expect(again?.code == .halted, "\(String(describing: again))")
                    #expect(try agent.outbox.deadLetters().map(\.seq) == Array(1...UInt64(10 + run)))
                    #expect(try agent.outbox.deadLettersInARow() == 10 + run)
                }

                try await collector.setFaults(.none)
                _ = try await newAgent().runOnce()
                #expect(try await collector.stats().unique == 288)
                let seqs = try await collector.events(limit: 1000).compactMap(\.seq)
                #expect(seqs == Array(13...300))
                #expect(try agent.outbox.deadLettersInARow() == 0, "a delivery starts the count again")
            }
        }
    }

    @Test("an idle agent empties and cuts back an outbox WAL over its limit (idleWALBytes)")
    func idleWALTruncated() async throws {
        try await withTemporaryGroup { group in
            try await Self.produce(group, count: 400)
            try await Collector.withRunning(CollectorConfiguration()) { collector in
                let agent = try Self.agent(group, collector) {
                    $0.idleWALBytes = 1
                    $0.bulkSize = 50
                }
                try await GroupSettingsTests.whileRunning(agent) {
                    let delivered = try await Self.eventually { try await collector.stats().unique == 400 }
                    #expect(delivered)
                    // The periodic checkpoint, once a second, finds nothing pending.
                    let cut = try await Self.eventually { agent.outbox.walFileBytes == 0 }
                    #expect(cut, "\(agent.outbox.walFileBytes) bytes")
                }
            }
        }
    }

    @Test("a run of bad events longer than the halt limit still passes, one held back per halt, in order")
    func poisonRunPassesSlowly() async throws {
        try await withTemporaryGroup { group in
            let tracker = try Tracker(configuration: .init(groupDirectory: group))
            let names = Array(repeating: "Ordinary", count: 5) + Array(repeating: "Poison", count: 4)
                + Array(repeating: "Ordinary", count: 5)
            for (i, name) in names.enumerated() { try await tracker.track(name, properties: ["i": .int(Int64(i))]) }
            let outbox = try Outbox(path: group + "-state/outbox.sqlite")
            #expect(try Drainer(store: tracker.store, outbox: outbox, logger: Self.logger).drainAvailable() == 14)
            try await Collector.withRunning(CollectorConfiguration(faults: FaultConfiguration(poisonPattern: "^Poison$"))) { collector in
                let (steps, halts) = try await withHTTPClient { client in
                    var configuration = UploadConfiguration(serverURL: collector.url + "/sa")
                    configuration.haltAfterDeadLetters = 2
                    configuration.backoff = Backoff(base: .milliseconds(5), cap: .milliseconds(40))
                    let session = UploadSession(outbox: outbox, client: client, configuration: configuration, logger: Self.logger)
                    var steps: [UploadSession.Step] = []
                    var halts: [String] = []
                    while steps.count < 200 {
                        let step = try await session.step()
                        if step == .empty { break }
                        steps.append(step)
                        if case .wait = step, let reason = session.haltReason { halts.append(reason) }
                    }
                    return (steps, halts)
                }
                // Poison 1 and 2 are dead-lettered at once; 3 and 4 each wait for one halt, are sent alone
                // again, refused again, and only then dead-lettered.
                #expect(halts.count == 2, "\(steps)")
                #expect(halts.count == 2 && halts[0].contains("refused the last 2 events one by one")
                    && halts[1].contains("refused the last 3 events one by one"), "\(halts)")
                #expect(steps.filter { $0 == .wait(.milliseconds(40)) }.count == 2, "the halt waits for the backoff cap")
                #expect(try outbox.deadLetters().map(\.seq) == [6, 7, 8, 9])
                let seqs = try await collector.events(limit: 100).compactMap(\.seq)
                #expect(seqs == Array(1...5) + Array(10...14))
            }
        }
    }

    @Test("401 keeps everything until fixed, then delivers")
    func unauthorizedUntilFixed() async throws {
        try await withTemporaryGroup { group in
            try await Self.produce(group, count: 300)
            try await Collector.withRunning(CollectorConfiguration(faults: FaultConfiguration(forcedStatus: 401))) { collector in
                let agent = try Self.agent(group, collector) {
                    $0.upload.backoff = Backoff(base: .milliseconds(5), cap: .milliseconds(100))
                    $0.bulkSize = 1
                }
                let running = Task { try await agent.run() }
                defer { running.cancel() }
                var status: AgentStatus?
                _ = try await Self.eventually {
                    status = AgentChannel.readStatus(groupDirectory: group)
                    return status?.state == "halted"
                }
                #expect(status?.state == "halted")
                #expect(status?.haltReason?.contains("401") == true)
                #expect(try agent.outbox.pending().count == 300)
                #expect(try await collector.stats().unique == 0)

                // A retryable answer after the refusal: failing, no longer halted.
                try await collector.setFaults(FaultConfiguration(forcedStatus: 503))
                agent.requestFlush()
                _ = try await Self.eventually {
                    status = AgentChannel.readStatus(groupDirectory: group)
                    return status?.haltReason == nil
                }
                #expect(status?.haltReason == nil && status?.state != "halted", "\(String(describing: status))")

                try await collector.setFaults(.none)
                agent.requestFlush()
                _ = try await Self.eventually { try await collector.stats().unique >= 300 }
                try await Self.expectDelivered(collector, count: 300)
                agent.requestStop()
                try await running.value
            }
        }
    }

    @Test("--once ends with a halted error when the collector refuses uploads; nothing is lost")
    func onceHalted() async throws {
        try await withTemporaryGroup { group in
            try await Self.produce(group, count: 10)
            try await Collector.withRunning(CollectorConfiguration(faults: FaultConfiguration(forcedStatus: 403))) { collector in
                let agent = try Self.agent(group, collector)
                let error = await #expect(throws: AgentError.self) { try await agent.runOnce() }
                #expect(error?.code == .halted)
                #expect(try agent.outbox.pending().count == 10)
                // `tributary status` shows the run as failed, with why: it showed "stopped", a clean end.
                let status = try #require(AgentChannel.readStatus(groupDirectory: group))
                #expect(status.state == "failed")
                #expect(status.lastError == error?.message)
            }
        }
    }

    @Test("the bearer token of the auth token file (its newline trimmed) opens a collector that requires one")
    func bearerTokenFromFile() async throws {
        try await withTemporaryGroup { group in
            try await Self.produce(group, count: 300)
            let tokenFile = group + "-token"
            // As `echo s3cret > token` writes it: the newline is not part of the token.
            try "s3cret\n".write(toFile: tokenFile, atomically: true, encoding: .utf8)
            try await Collector.withRunning(CollectorConfiguration(token: "s3cret")) { collector in
                let agent = try Self.agent(group, collector) {
                    $0.authTokenFile = tokenFile
                    // A bound on a hang only: a header the client refuses to send is retried until then.
                    $0.deadline = .seconds(30)
                }
                // Without the token the collector answers 401, and the run ends halted.
                let report = try await agent.runOnce()
                #expect(report.delivered == 300)
                try await Self.expectDelivered(collector, count: 300)
                let refused = try await collector.stats().rejectedBatches
                #expect(refused == 0, "\(refused) requests refused: every request must carry the token")
            }
        }
    }

    // docs/wire-formats.md: on 401 everything is kept, uploads halt, and the agent retries at the backoff
    // cap, reading --auth-token-file before each retry, so a token fixed on disk takes effect without a restart.
    @Test("a wrong token halts uploads on 401, keeping every event; the corrected file is read again and all arrive in order, once")
    func bearerTokenCorrected() async throws {
        try await withTemporaryGroup { group in
            try await Self.produce(group, count: 300)
            let tokenFile = group + "-token"
            try "expired\n".write(toFile: tokenFile, atomically: true, encoding: .utf8)
            try await Collector.withRunning(CollectorConfiguration(token: "s3cret")) { collector in
                let agent = try Self.agent(group, collector) {
                    $0.authTokenFile = tokenFile
                    // Halted, the agent retries at the cap: 2 s leaves the test, on a loaded machine, time to fix
                    // the file between two refusals.
                    $0.upload.backoff = Backoff(base: .milliseconds(5), cap: .seconds(2))
                    // A failed test stops at once rather than retrying through the default 80 s stop timeout.
                    $0.stopTimeout = .seconds(2)
                }
                let running = Task { try await agent.run() }
                defer { running.cancel() }
                let clock = ContinuousClock()
                // Several refusals, each followed by a re-read of the still wrong file: the halt holds. The
                // status file is written about once a second, so it is polled with the collector's counts.
                var waitedFrom = clock.now
                var status: AgentStatus?
                var refused = 0
                while clock.now - waitedFrom < .seconds(30) {
                    status = AgentChannel.readStatus(groupDirectory: group)
                    refused = try await collector.stats().rejectedBatches
                    if status?.state == "halted" && refused >= 2 { break }
                    try await Task.sleep(for: .milliseconds(20))
                }
                #expect(status?.state == "halted", "the agent never reported itself halted: \(String(describing: status))")
                #expect(status?.haltReason?.contains("401") == true, "halt reason: \(String(describing: status?.haltReason))")
                #expect(refused >= 2, "only \(refused) requests refused in 30 s: a halted agent retries at the cap")
                #expect(try await collector.stats().unique == 0, "the collector accepted events with a wrong token")
                #expect(try agent.outbox.pending().count == 300, "a refused upload must keep every event in the outbox")
                #expect(try agent.outbox.deadLetters().isEmpty, "a 401 dead-letters nothing")

                // Fixed as an operator would, right after a refusal (the agent then waits the cap): the file
                // replaced; no restart, no flush request. The retry must send the new token: an agent that
                // re-read the file only after a refusal sent the old one once more, and waited the cap again.
                let seen = try await collector.stats().rejectedBatches
                while try await collector.stats().rejectedBatches == seen, clock.now - waitedFrom < .seconds(30) {
                    try await Task.sleep(for: .milliseconds(5))
                }
                let refusedAtFix = try await collector.stats().rejectedBatches
                try "s3cret\n".write(toFile: tokenFile, atomically: true, encoding: .utf8)
                waitedFrom = clock.now
                var delivered = 0
                while clock.now - waitedFrom < .seconds(30) {
                    delivered = try await collector.stats().unique
                    if delivered >= 300 { break }
                    try await Task.sleep(for: .milliseconds(20))
                }
                #expect(delivered == 300, "\(delivered) of 300 delivered 30 s after the token file was corrected")
                #expect(try await collector.stats().rejectedBatches == refusedAtFix, "a retry after the fix sent the old token")
                try await Self.expectDelivered(collector, count: 300)
                let stats = try await collector.stats()
                #expect(stats.duplicates == 0 && stats.received == 300, "\(stats.received) received, \(stats.duplicates) duplicates")
                // The collector counts an event once it stored it; the agent's acknowledgement commits after.
                #expect(try await Self.eventually { try agent.outbox.pending().count == 0 }, "the outbox kept acknowledged events")
                agent.requestStop()
                try await running.value
            }
        }
    }

    // SIGTERM can come before a `--once` run's loop starts (systemd stopping the unit as it starts). The
    // stop's budget must survive the run's own, longer deadline being set after it.
    @Test("a stop requested before a --once run starts keeps its sooner budget", .timeLimit(.minutes(2)))
    func stopBeforeOnce() async throws {
        try await withTemporaryGroup { group in
            try await Self.produce(group, count: 10)
            let faults = FaultConfiguration(failureRate: 1, failureStatus: 503)
            try await Collector.withRunning(CollectorConfiguration(faults: faults)) { collector in
                let agent = try Self.agent(group, collector) {
                    $0.deadline = .seconds(90)
                    $0.stopTimeout = .seconds(2)
                    $0.grace = .milliseconds(500)
                }
                // In the outbox already: a stopping agent claims nothing from the store, but uploads what it holds.
                _ = try Drainer(store: agent.store, outbox: agent.outbox, logger: Self.logger).drainAvailable()
                agent.requestStop()
                let clock = ContinuousClock()
                let began = clock.now
                _ = try? await agent.runOnce()
                // The stop budget is 2 s; the run's deadline, 90 s, is what the run lasted before the fix. 45 s
                // leaves a loaded machine room and still tells the two apart.
                let lasted = clock.now - began
                #expect(lasted < .seconds(45), "the run lasted \(lasted): the stop's budget was replaced by --deadline")
                #expect(try await collector.stats().requests > 0, "the stopping run must still try to upload")
                #expect(try agent.outbox.pending().count == 10, "nothing is lost: the refused events stay queued")
            }
        }
    }

    @Test("backoff delays stay within their bounds against a failing collector")
    func backoffBounds() async throws {
        try await withTemporaryGroup { group in
            try await Self.produce(group, count: 5)
            let faults = FaultConfiguration(failureRate: 1, failureStatus: 500)
            try await Collector.withRunning(CollectorConfiguration(faults: faults)) { collector in
                let agent = try Self.agent(group, collector)
                _ = try Drainer(store: agent.store, outbox: agent.outbox, logger: Self.logger).drainAvailable()
                let backoff = Backoff(base: .milliseconds(100), cap: .seconds(2))
                var upload = agent.configuration.upload
                upload.backoff = backoff
                try await withHTTPClient { client in
                    let session = UploadSession(outbox: agent.outbox, client: client, configuration: upload, logger: Self.logger)
                    var batchIDs: Set<String> = []
                    var laterDelays: [Duration] = []
                    for attempt in 0..<8 {
                        guard case .wait(let delay) = try await session.step() else {
                            Issue.record("a failing collector must lead to a wait")
                            break
                        }
                        #expect(delay >= .zero && delay <= backoff.ceiling(attempt: attempt))
                        // Each failure counts: the next wait's ceiling doubles, and the outbox's retry counter grows.
                        #expect(session.attempt == attempt + 1)
                        #expect(try agent.outbox.counters().retries == Int64(attempt + 1))
                        if attempt >= 4 { laterDelays.append(delay) }
                        batchIDs.formUnion(try agent.outbox.nextBatch(maxCount: 500, maxBytes: .max).compactMap(\.batchID))
                    }
                    #expect(batchIDs.count == 1, "a retried batch keeps its id")
                    // Attempts 4 to 7 draw from [0, 1.6 s] and [0, 2 s]: all four at or below the base (100 ms)
                    // has a chance below 1 in 10,000, and is what a backoff that never grew would give.
                    #expect(laterDelays.count == 4 && laterDelays.max()! > backoff.base, "the backoff must grow: \(laterDelays)")
                }
            }
        }
    }

    @Test("a second agent on the same group refuses to start")
    func secondAgentRefused() async throws {
        try await withTemporaryGroup { group in
            try await Collector.withRunning(CollectorConfiguration()) { collector in
                let first = try Self.agent(group, collector)
                let error = #expect(throws: AgentError.self) {
                    _ = try Self.agent(group, collector) { $0.outboxPath = group + "-other/outbox.sqlite" }
                }
                #expect(error?.code == .alreadyRunning)
                #expect(error?.message.contains("pid \(getpid())") == true)
                _ = try await first.runOnce()
                // The lock is released when a run ends.
                _ = try Self.agent(group, collector) { $0.outboxPath = group + "-other/outbox.sqlite" }
            }
        }
    }

    @Test("dead letters count against the outbox quota: at it the drain stops, the rest waits in the store, and --once ends saying so")
    func deadLettersFillQuota() async throws {
        try await withTemporaryGroup { group in
            try await Self.produce(group, count: 400)
            // Every event rejected: each ends a dead letter, once the bisection has sent it alone.
            try await Collector.withRunning(CollectorConfiguration(faults: FaultConfiguration(poisonPattern: "."))) { collector in
                let agent = try Self.agent(group, collector) {
                    $0.upload.haltAfterDeadLetters = 0  // every event dead-lettered, as this test needs
                    $0.outboxQuotaBytes = 20_000
                    $0.drainChunk = 20
                    $0.upload.batchSize = 20
                    $0.deadline = .seconds(60)  // a bound on a hang only: the run ends as soon as nothing can move
                }
                let started = ContinuousClock.now
                let full = await #expect(throws: AgentError.self) { try await agent.runOnce() }
                #expect(full?.code == .outboxFull && full?.message.contains("--discard") == true, "\(String(describing: full))")
                #expect(ContinuousClock.now - started < .seconds(30))
                let again = await #expect(throws: AgentError.self) { try await agent.runOnce() }
                #expect(again?.message.contains("has run already") == true, "an agent runs once: its locks are released")
                let deadBytes = try agent.outbox.deadLetterBytes()
                let dead = try agent.outbox.deadLetters(limit: 10_000).count
                let waiting = try agent.store.status().pendingEvents
                let pending = try agent.outbox.pending()
                let unique = try await collector.stats().unique
                #expect(unique == 0)
                #expect(deadBytes >= 20_000 - pending.bytes, "the dead letters filled the quota")
                #expect(deadBytes + pending.bytes < 20_000 + 20 * 800, "by at most one drain chunk over it")
                #expect(waiting > 0, "the rest stayed in the store")
                #expect(dead + pending.count + waiting == 400, "nothing lost")
            }
        }
    }

    @Test(
        "--max-batch-bytes: each request carries as many whole events as fit (read ahead too), and one event that alone is larger",
        arguments: [5, 0])
    func maxBatchBytes(eventsThatFit: Int) async throws {
        try await withTemporaryGroup { group in
            let tracker = try Tracker(configuration: .init(groupDirectory: group))
            let padding = String(repeating: "p", count: 300)
            for i in 0..<40 { try await tracker.track("Padded", properties: ["i": .int(Int64(i % 10)), "pad": .string(padding)]) }
            let outbox = try Outbox(path: group + "-state/outbox.sqlite")
            #expect(try Drainer(store: tracker.store, outbox: outbox, logger: Self.logger).drainAvailable() == 40)
            // The stored bodies differ by a few bytes at most (their seqs' digits): half an event of room.
            let each = try outbox.pending().bytes / 40
            try await Collector.withRunning(CollectorConfiguration()) { collector in
                let delivered = try await withHTTPClient { client in
                    var configuration = UploadConfiguration(serverURL: collector.url + "/sa")
                    configuration.maxBatchBytes = eventsThatFit == 0 ? each / 2 : eventsThatFit * each + each / 2
                    let session = UploadSession(outbox: outbox, client: client, configuration: configuration, logger: Self.logger)
                    var delivered: [Int] = []
                    while delivered.count < 100, case .progressed(let count, _) = try await session.step() { delivered.append(count) }
                    return delivered
                }
                #expect(delivered == Array(repeating: max(1, eventsThatFit), count: 40 / max(1, eventsThatFit)))
                try await Self.expectDelivered(collector, count: 40)
            }
        }
    }

    @Test("a batch read ahead that waited past its age is built again: _flush_time says when it was sent", arguments: [false, true])
    func staleReadAhead(stale: Bool) async throws {
        try await withTemporaryGroup { group in
            let outbox = try await Self.drainedOutbox(group, count: 20)
            try await Collector.withRunning(CollectorConfiguration()) { collector in
                let resumed = try await withHTTPClient { client in
                    var configuration = UploadConfiguration(serverURL: collector.url + "/sa")
                    configuration.batchSize = 10
                    configuration.readAheadMaxAge = .milliseconds(stale ? 100 : 60_000)
                    let session = UploadSession(outbox: outbox, client: client, configuration: configuration, logger: Self.logger)
                    #expect(try await session.step() == .progressed(delivered: 10))
                    #expect(session.readyBatchCount == 10, "the second batch was read ahead during the first request")
                    try await Task.sleep(for: .milliseconds(300))
                    let resumed = BootClock.wallMillis()
                    #expect(try await session.step() == .progressed(delivered: 10))
                    return resumed
                }
                let flushTimes = try await collector.events().map { event in
                    try #require(try event.jsonObject()["_flush_time"] as? Int64, "every event carries _flush_time")
                }
                #expect(flushTimes.count == 20 && flushTimes.prefix(10).allSatisfy { $0 < resumed })
                if stale {
                    #expect(flushTimes.suffix(10).allSatisfy { $0 >= resumed }, "built again when sent")
                } else {
                    #expect(flushTimes.suffix(10).allSatisfy { $0 < resumed }, "sent as read ahead")
                }
            }
        }
    }

    @Test(
        "deferred acknowledgements: a delivered batch's rows stay until the next batch's step or settle(); off, they go at once; order kept, nothing twice",
        arguments: [true, false])
    func deferredAcknowledgements(deferred: Bool) async throws {
        try await withTemporaryGroup { group in
            let outbox = try await Self.drainedOutbox(group, count: 25)
            try await Collector.withRunning(CollectorConfiguration()) { collector in
                try await withHTTPClient { client in
                    var configuration = UploadConfiguration(serverURL: collector.url + "/sa")
                    configuration.batchSize = 10
                    configuration.readAheadMaxAge = .seconds(600)  // a loaded machine's pause keeps it
                    let session = UploadSession(outbox: outbox, client: client, configuration: configuration, logger: Self.logger)
                    session.defersAcknowledgements = deferred
                    // Deferred, a delivered batch's rows stay until the next request goes (or settle()).
                    let kept = deferred ? 10 : 0
                    #expect(try await session.step() == .progressed(delivered: 10))
                    #expect(session.unsettledCount == kept && session.readyBatchCount == 10)
                    #expect(try outbox.pending().count == 15 + kept)
                    #expect(try await collector.stats().unique == 10)
                    // The second goes as read ahead; the first's rows were deleted while it was out.
                    #expect(try await session.step() == .progressed(delivered: 10))
                    #expect(session.unsettledCount == kept && session.readyBatchCount == 5)
                    #expect(try outbox.pending().count == 5 + kept)
                    try session.settle()
                    #expect(session.unsettledCount == 0 && session.readyBatchCount == 5, "settled, the third batch is the one in flight")
                    #expect(try outbox.pending().count == 5)
                    try session.settle()  // nothing left to settle: no change
                    #expect(try outbox.pending().count == 5)
                    // The last batch has nothing read ahead after it: acknowledged at once.
                    #expect(try await session.step() == .progressed(delivered: 5))
                    #expect(session.unsettledCount == 0)
                    #expect(try outbox.pending().count == 0)
                    #expect(try await session.step() == .empty)
                }
                try await Self.expectDelivered(collector, count: 25)
                let stats = try await collector.stats()
                #expect(stats.duplicates == 0 && stats.requests == 3, "\(stats)")
            }
        }
    }

    @Test("deferred acknowledgements: a batch sent while the outbox changed under it (its predecessor deleted by hand) changes nothing; its events go again, once after dedup")
    func deferredAcknowledgementOutboxChanged() async throws {
        try await withTemporaryGroup { group in
            let outbox = try await Self.drainedOutbox(group, count: 25)
            try await Collector.withRunning(CollectorConfiguration()) { collector in
                let steps = try await withHTTPClient { client in
                    var configuration = UploadConfiguration(serverURL: collector.url + "/sa")
                    configuration.batchSize = 10
                    configuration.readAheadMaxAge = .seconds(600)  // the second step must send the batch read ahead
                    let session = UploadSession(outbox: outbox, client: client, configuration: configuration, logger: Self.logger)
                    session.defersAcknowledgements = true
                    var steps = [try await session.step()]
                    // The delivered batch's rows deleted meanwhile, by another hand: the deferred
                    // acknowledgement then finds it no longer in flight.
                    let inFlight = try outbox.nextBatch(maxCount: 10, maxBytes: 1 << 20)  // the batch delivered
                    try outbox.acknowledge(try #require(inFlight.first?.batchID))
                    while steps.count < 10 {
                        let step = try await session.step()
                        if step == .empty { break }
                        steps.append(step)
                    }
                    return steps
                }
                // The second batch's answer was not applied: its rows went again in a batch built anew.
                #expect(steps == [.progressed(delivered: 10), .progressed(delivered: 0), .progressed(delivered: 10), .progressed(delivered: 5)])
                #expect(try outbox.pending().count == 0)
                try await Self.expectDelivered(collector, count: 25)
                let stats = try await collector.stats()
                #expect(stats.duplicates == 10 && stats.requests == 4, "\(stats)")
            }
        }
    }

    @Test("a hybrid page's time from before this boot or from the future arrives as given; a native event's is still corrected")
    func pageTimeOffThisBoot() async throws {
        try await withTemporaryGroup { group in
            let now = BootClock.wallMillis()
            let uptime = Int64(BootClock.nowNanos() / 1_000_000)
            // A page's backfilled $time from an hour before this boot began, and one an hour ahead: no
            // CLOCK_BOOTTIME reading of this boot matches either.
            let times = ["Backfilled": now - uptime - 3_600_000, "Ahead": now + 3_600_000]
            let page = try Tracker(configuration: .init(groupDirectory: group, producerKind: .hybrid))
            for (name, time) in times {
                try await page.trackFromPage(
                    PageEvent(type: .track, event: name, timeMillis: time, lib: ["$lib": "js"], properties: [:]))
            }
            // A native event tracked while the wall clock was an hour behind: its time is corrected.
            var behind = Tracker.Configuration(groupDirectory: group, producerKind: .app)
            behind.wallMillis = { BootClock.wallMillis() - 3_600_000 }
            try await Tracker(configuration: behind).track("Native")
            let outbox = try Outbox(path: group + "-state/outbox.sqlite")
            #expect(try Drainer(store: page.store, outbox: outbox, logger: Self.logger).drainAvailable() == 3)
            try await Collector.withRunning(CollectorConfiguration()) { collector in
                let step = try await withHTTPClient { client in
                    try await UploadSession(
                        outbox: outbox, client: client, configuration: UploadConfiguration(serverURL: collector.url + "/sa"),
                        logger: Self.logger
                    ).step()
                }
                #expect(step == .progressed(delivered: 3))
                var arrived: [String: [String: Any]] = [:]
                for event in try await collector.events() { arrived[event.event ?? "?"] = try event.jsonObject() }
                for (name, time) in times {
                    let event = try #require(arrived[name], "\(name) arrived")
                    #expect(event["time"] as? Int64 == time, "\(name): the page's time as given")
                    #expect((event["properties"] as? [String: Any])?["$time_adjustment_ms"] == nil, "\(name) not adjusted")
                }
                let native = try #require(arrived["Native"]?["properties"] as? [String: Any])
                let adjustment = try #require(native["$time_adjustment_ms"] as? Int64, "the native event is corrected")
                #expect(abs(adjustment - 3_600_000) < 1000)
            }
        }
    }

    @Test("an event's time is corrected when the wall clock moved between trigger and upload")
    func timeCorrection() throws {
        let now = BootClock.wallMillis()
        let boot = BootClock.nowNanos()
        // Recorded 10 s ago by the monotonic clock, but with a wall clock then 1 h behind.
        let recordedWall = now - 10_000 - 3_600_000
        let row = Outbox.Row(
            id: 1, seq: 1, eventID: "e", producer: "app", producerKind: .app, producerSeq: 1, wallMillis: recordedWall,
            bootNanos: boot - 10_000_000_000, bootID: .current,
            body: Array(#"{"type":"track","event":"E","time":\#(recordedWall),"properties":{"a":1}}"#.utf8), batchID: "b")
        let client = HTTPClientFactory.make()
        defer { try? client.syncShutdown() }
        try withTemporaryGroup { dir in
            let session = UploadSession(
                outbox: try Outbox(path: dir + "/o.sqlite"), client: client, configuration: UploadConfiguration(serverURL: "http://127.0.0.1:9"),
                logger: Self.logger)
            let sent = session.wireEvent(row, nowWall: now, nowBoot: boot)
            let body = try #require(try JSONSerialization.jsonObject(with: Data(sent)) as? [String: Any])
            #expect(body["time"] as? Int64 == now - 10_000)
            #expect((body["properties"] as? [String: Any])?["$time_adjustment_ms"] as? Int64 == 3_600_000)
            #expect(body["_flush_time"] as? Int64 == now)

            var other = row
            other.bootID = BootID(bytes: [UInt8](repeating: 9, count: 16))
            let untouched = try #require(try JSONSerialization.jsonObject(with: Data(session.wireEvent(other, nowWall: now, nowBoot: boot))) as? [String: Any])
            #expect(untouched["time"] as? Int64 == recordedWall, "another boot's events are sent as recorded")
        }
    }
}
