import Foundation
import Testing
import Tributary
import TributaryCollector
import TributaryStore
import TributaryTestSupport
import TributaryWire

@testable import TributaryAgentCore

/// The agent settings the app writes into the group (``AgentSettings``), applied by a running agent.
@Suite("The agent follows the app's settings")
struct GroupSettingsTests {
    /// An agent as `tributary-agent` makes it when its command line gives only what `given` names.
    static func agent(
        _ group: String, serverURL: String? = nil, given: Set<AgentSettings.Key> = [],
        _ adjust: (inout AgentConfiguration) -> Void = { _ in }
    ) throws -> Agent {
        try UploadTests.agent(group, serverURL: serverURL) { config in
            config.settingsFromGroup = Set(AgentSettings.Key.allCases).subtracting(given)
            adjust(&config)
        }
    }

    /// Runs `agent` while `body` runs, then stops it and waits for its end.
    static func whileRunning(_ agent: Agent, _ body: () async throws -> Void) async throws {
        let running = Task { try await agent.run() }
        defer { running.cancel() }
        try await body()
        agent.requestStop()
        try await running.value
    }

    @Test("the group's settings apply where the command line left them, and the command line's win")
    func precedence() {
        var config = AgentConfiguration(groupDirectory: "/g", serverURL: "http://flag.example/sa")
        config.bulkSize = 300
        let group = AgentSettings(serverURL: "http://app.example/sa", format: .ndjson, flushBulkSize: 60, flushIntervalSeconds: 7.5)
        // Nothing left to the group: the configuration's own values.
        #expect(config.effective(group) == EffectiveSettings(
            serverURL: "http://flag.example/sa", format: .sensors, bulkSize: 300, flushInterval: .seconds(15)))
        config.settingsFromGroup = [.format, .flushIntervalSeconds]
        // The group's format goes with the group's server only: not to the one given here.
        #expect(config.effective(group) == EffectiveSettings(
            serverURL: "http://flag.example/sa", format: .sensors, bulkSize: 300, flushInterval: .milliseconds(7500)))
        config.settingsFromGroup = [.serverURL, .format]
        #expect(config.effective(group) == EffectiveSettings(
            serverURL: "http://app.example/sa", format: .ndjson, bulkSize: 300, flushInterval: .seconds(15)))
        // A group that leaves a setting out leaves the configuration's.
        config.settingsFromGroup = Set(AgentSettings.Key.allCases)
        #expect(config.effective(AgentSettings(flushBulkSize: 60)).serverURL == "http://flag.example/sa")
        #expect(config.effective(AgentSettings(flushBulkSize: 60)).bulkSize == 60)
        // No server URL of its own: the group's applies whatever else is left to it.
        let bare = AgentConfiguration(groupDirectory: "/g", serverURL: nil)
        #expect(bare.effective(group).serverURL == "http://app.example/sa")
        #expect(bare.effective(group).bulkSize == 100)
        #expect(bare.effective(AgentSettings(format: .ndjson)) == EffectiveSettings(
            serverURL: nil, format: .sensors, bulkSize: 100, flushInterval: .seconds(15)))
    }

    @Test("an agent with no server URL keeps the events until the app sets one, then delivers them all to it")
    func waitsForServer() async throws {
        try await withTemporaryGroup { group in
            try await UploadTests.produce(group, count: 300)
            try await Collector.withRunning(CollectorConfiguration()) { collector in
                let agent = try Self.agent(group)
                try await Self.whileRunning(agent) {
                    // Drained into the outbox, and nothing sent: there is nowhere to send it.
                    #expect(try await UploadTests.eventually { try agent.outbox.pending().count == 300 })
                    agent.requestFlush()
                    try await Task.sleep(for: .milliseconds(300))
                    #expect(try await collector.stats().requests == 0)
                    #expect(try await UploadTests.eventually { AgentChannel.readStatus(groupDirectory: group) != nil })
                    #expect(try #require(AgentChannel.readStatus(groupDirectory: group)).serverURL == nil)

                    let store = try SharedStore(groupDirectory: group)
                    try store.setAgentSettings(AgentSettings(serverURL: collector.url + "/sa", flushBulkSize: 50))
                    #expect(try await UploadTests.eventually { try await collector.stats().unique == 300 })
                    try await UploadTests.expectDelivered(collector, count: 300)
                    #expect(try await UploadTests.eventually {
                        AgentChannel.readStatus(groupDirectory: group)?.serverURL == collector.url + "/sa"
                    })
                }
            }
        }
    }

    @Test("a changed server or format takes effect for the next batch; settings that are not valid leave those in force")
    func changesWhileRunning() async throws {
        try await withTemporaryGroup { group in
            try await Collector.withRunning(CollectorConfiguration()) { first in
                try await Collector.withRunning(CollectorConfiguration()) { second in
                    let store = try SharedStore(groupDirectory: group)
                    try store.setAgentSettings(AgentSettings(serverURL: first.url + "/sa", flushBulkSize: 50))
                    let agent = try Self.agent(group)
                    try await Self.whileRunning(agent) {
                        let tracker = try Tracker(configuration: .init(groupDirectory: group, producerKind: .app))
                        for i in 0..<50 { try await tracker.track("First", properties: ["i": .int(Int64(i))]) }
                        #expect(try await UploadTests.eventually { try await first.stats().unique == 50 })

                        // An unknown key: refused as a whole, reported, and the first collector stays.
                        try store.setConfiguration(
                            AgentSettings.configurationKey, json: #"{"server_url":"\#(second.url)/ingest","retries":3}"#)
                        #expect(try await UploadTests.eventually {
                            AgentChannel.readStatus(groupDirectory: group)?.settingsProblem?.contains("\"retries\"") == true
                        })
                        for i in 0..<50 { try await tracker.track("StillFirst", properties: ["i": .int(Int64(i))]) }
                        #expect(try await UploadTests.eventually { try await first.stats().unique == 100 })

                        try store.setAgentSettings(AgentSettings(serverURL: second.url + "/ingest", format: .ndjson, flushBulkSize: 50))
                        #expect(try await UploadTests.eventually {
                            let status = AgentChannel.readStatus(groupDirectory: group)
                            return status?.settingsProblem == nil && status?.serverURL == second.url + "/ingest"
                        })
                        for i in 0..<50 { try await tracker.track("Second", properties: ["i": .int(Int64(i))]) }
                        #expect(try await UploadTests.eventually { try await second.stats().unique == 50 })
                        #expect(try await first.stats().unique == 100)
                        let names = Set(try await second.events(limit: 100).compactMap(\.event))
                        #expect(names == ["Second"])
                    }
                }
            }
        }
    }

    @Test("a bulk size the outbox cannot hold does not stall uploads: an outbox at its quota is flushed")
    func bulkSizeBeyondQuota() async throws {
        try await withTemporaryGroup { group in
            try await UploadTests.produce(group, count: 300)
            try await Collector.withRunning(CollectorConfiguration()) { collector in
                try SharedStore(groupDirectory: group).setAgentSettings(AgentSettings(
                    serverURL: collector.url + "/sa", flushBulkSize: 1_000_000, flushIntervalSeconds: 86_400))
                let agent = try Self.agent(group) {
                    $0.outboxQuotaBytes = 32 << 10
                    $0.flushInterval = .seconds(60)  // the first interval flush, before the group's interval applies
                }
                try await Self.whileRunning(agent) {
                    // Well before any interval: without the quota's flush nothing went for 60 s.
                    #expect(try await UploadTests.eventually(within: 20) { try await collector.stats().unique == 300 })
                    try await UploadTests.expectDelivered(collector, count: 300)
                }
            }
        }
    }

    @Test("a server URL given to the agent wins over the group's; --once with none at all is a configuration error")
    func givenServerWins() async throws {
        try await withTemporaryGroup { group in
            try await UploadTests.produce(group, count: 120)
            try await Collector.withRunning(CollectorConfiguration()) { given in
                try await Collector.withRunning(CollectorConfiguration()) { app in
                    let store = try SharedStore(groupDirectory: group)
                    try store.setConfiguration(AgentSettings.configurationKey, json: #"{"flush_bulk_size":"many"}"#)
                    await #expect(performing: { _ = try await Self.agent(group).runOnce() }, throws: { error in
                        guard let error = error as? AgentError, error.code == .configuration else { return false }
                        return error.message.contains("No collector URL") && error.message.contains("flush_bulk_size must be a number")
                    })
                    try store.setAgentSettings(AgentSettings(serverURL: app.url + "/sa"))
                    let report = try await Self.agent(group, serverURL: given.url + "/sa", given: [.serverURL]).runOnce()
                    #expect(report.delivered == 120)
                    try await UploadTests.expectDelivered(given, count: 120)
                    #expect(try await app.stats().requests == 0)
                }
            }
        }
    }
}
