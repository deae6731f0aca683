import Foundation
import Testing
import TributaryCollector
import TributaryStore
import TributaryTestSupport

/// Many short-lived extension processes while the main app and the agent run.
@Suite("App extensions in bursts", .serialized)
struct ExtensionBurstTests {
    static func nowMillis() -> Int64 { Int64(Date().timeIntervalSince1970 * 1000) }

    @Test(
        "50 extensions in bursts of 10: every event delivered once, in order, with its own trigger time and the app's presets"
    )
    func bursts() async throws {
        try await withTemporaryGroup { group in
            try await Collector.withRunning(CollectorConfiguration()) { collector in
                let appLedger = group + "-app-ledger"
                let app = try ChildProcess(
                    "tributary-sim",
                    [
                        "app", "--group", group, "--events", "300", "--rate", "150", "--app-version", "4.2.0",
                        "--ledger", appLedger,
                    ])
                #expect(await app.waitForLine(startingWith: "READY") != nil)  // the app's presets are published
                let agent = try ChildProcess(
                    "tributary-agent", Scenario.agentArguments(group, collector.url, once: false))

                let perExtension = 4
                var windows: [String: ClosedRange<Int64>] = [:]
                var ledgers: [String: String] = [:]
                for burst in 0..<5 {
                    let start = Self.nowMillis()
                    var running: [(id: String, process: ChildProcess)] = []
                    for k in 0..<10 {
                        let id = "ext-\(burst * 10 + k)"
                        ledgers[id] = group + "-\(id)-ledger"
                        running.append(
                            (
                                id,
                                try ChildProcess(
                                    "tributary-sim",
                                    [
                                        "extension", "--group", group, "--producer-id", id, "--events",
                                        "\(perExtension)",
                                        "--seed", "\(burst * 10 + k)", "--ledger", ledgers[id]!,
                                    ])
                            ))
                    }
                    for (id, process) in running {
                        let result = await process.finish()
                        #expect(result.status == 0, "\(id): \(result.stderr)")
                        windows[id] = start...Self.nowMillis()
                    }
                    try await Task.sleep(for: .milliseconds(100))
                }
                #expect(await app.finish().status == 0)

                let extensionIDs = ledgers.mapValues { Oracle.Ledger(producer: "", path: $0).entries().map(\.eventID) }
                let appIDs = Oracle.Ledger(producer: "app", path: appLedger).entries().map(\.eventID)
                let acknowledged = extensionIDs.values.flatMap { $0 } + appIDs
                #expect(extensionIDs.values.allSatisfy { $0.count == perExtension })
                // The scripted app ends its session after --events (background, terminate): a few events more.
                #expect(appIDs.count >= 300)
                _ = try await ChildProcess.run("tributary", ["flush", "--group", group])
                let events = try await HybridBrowserTests.delivered(collector, count: acknowledged.count, within: 60)
                #expect(events.count == acknowledged.count, "after dedup every acknowledged event arrives once")
                #expect(Set(events.map(\.eventID)) == Set(acknowledged))
                let oracle = Oracle(
                    ledgers: ledgers.map { Oracle.Ledger(producer: $0.key, path: $0.value) }
                        + [Oracle.Ledger(producer: "app", path: appLedger)])
                let verdict = try await oracle.judge(collector, group: group, outbox: Scenario.outbox(group))
                // Also each event's identity: the app logs in and out while the extensions track, and every
                // event must arrive under the identity its ledger line says it was stored under.
                #expect(verdict.passed, "\(verdict)")
                for (id, window) in windows {
                    let mine = events.filter { $0.producer == id }
                    #expect(
                        mine.map(\.producerSeq) == (1...UInt64(perExtension)).map { Optional($0) }, "\(id) out of order"
                    )
                    var lastTime: Int64 = 0
                    for (index, received) in mine.enumerated() {
                        let event = try received.jsonObject()
                        let properties = try #require(event["properties"] as? [String: Any])
                        let time = Int64(try #require(event["time"] as? Int))
                        #expect(properties["index"] as? Int == index)
                        #expect(
                            window.contains(time),
                            "\(id) event \(index): time \(time) is not its trigger time \(window)")
                        #expect(time >= lastTime, "\(id) event times go backwards")
                        lastTime = time
                        #expect(
                            properties["$app_version"] as? String == "4.2.0", "the app's presets are added at drain")
                        #expect((event["lib"] as? [String: Any])?["$lib_method"] as? String == "code")
                    }
                }
                agent.send(SIGTERM)
                #expect(await agent.finish().status == 0)
            }
        }
    }

    @Test("an extension refuses a schedule longer than a second")
    func staysShort() async throws {
        let result = try await ChildProcess.run(
            "tributary-sim", ["extension", "--group", "/tmp/x", "--events", "20", "--rate", "10"])
        #expect(result.status == 64)
        #expect(result.stderr.contains("exits within a second"))
    }
}
