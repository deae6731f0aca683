import Foundation
import Testing
import Tributary
import TributaryBridge
import TributaryCollector
import TributaryOracle
import TributaryTestSupport

/// The H5 mark on the wire: a page event the bridge accepted reaches the collector, through the real
/// agent, with `_hybrid_h5: true` at the event's top level (where sa-sdk-ios and sa-sdk-android put it),
/// in both wire formats; the app's own events carry no mark.
@Suite("The H5 mark on the wire", .serialized)
struct HybridWireTests {
    static let server = "https://sa.example.com/sa?project=default"
    static let origin = "http://127.0.0.1:8080"

    @Test("a page event arrives with _hybrid_h5: true at its top level, an app event without it", arguments: ["sensors", "ndjson"])
    func markOnTheWire(format: String) async throws {
        try await withTemporaryGroup { group in
            let app = try Tracker(configuration: .init(groupDirectory: group))
            let anonymousID = try app.identity().anonymousID
            let appReceipt = try await app.track("AppOwn", properties: ["_hybrid_h5": false])
            let bridge = HybridBridge(
                tracker: try Tracker(configuration: .init(groupDirectory: group, producerKind: .hybrid)),
                configuration: BridgeConfiguration(serverURL: Self.server, allowedOrigins: [Self.origin]))
            // The page marks its own property: the mark it gets is the top-level one, not this.
            let message = """
                {"callType":"app_h5_track","data":{"type":"track","event":"H5View","time":1700000000123,\
                "distinct_id":"\(anonymousID)","anonymous_id":"h5-anon","lib":{"$lib":"js"},\
                "properties":{"_hybrid_h5":"page","price":9.5},"server_url":"\(Self.server)"}}
                """
            let pageReceipt = try await bridge.receive(message, origin: Self.origin).get()

            try await Collector.withRunning(CollectorConfiguration()) { collector in
                let run = try await ChildProcess.run(
                    "tributary-agent", Scenario.agentArguments(group, collector.url, once: true, ["--format", format]))
                #expect(run.status == 0, "\(run.stderr)")
                // The collector keeps each event's text exactly as it arrived: what was on the wire.
                let events = Dictionary(uniqueKeysWithValues: try await collector.events().map { ($0.eventID, $0) })
                let page = try #require(try events[pageReceipt.eventID]?.jsonObject())
                #expect(page["_hybrid_h5"] as? Bool == true, "\(format): the mark is at the top level")
                #expect((page["properties"] as? [String: Any])?["_hybrid_h5"] == nil, "\(format): not among the properties")
                let own = try #require(try events[appReceipt.eventID]?.jsonObject())
                #expect(own["_hybrid_h5"] == nil, "\(format): an app event is not marked")
                #expect((own["properties"] as? [String: Any])?["_hybrid_h5"] as? Bool == false)
                #expect(try await collector.stats().hybridH5 == 1)
                let verdict = Oracle(ledgers: []).judge(try await Oracle.Observed.from(collector))
                #expect(verdict.delivered == 2 && verdict.mismarkedH5 == 0, "\(verdict)")
            }
        }
    }

    @Test("the oracle counts an event whose H5 mark is missing, misplaced or wrongly given")
    func oracleCountsMismarks() {
        let deliveries = [
            Oracle.Delivery(eventID: "a", producer: "h", producerSeq: 1, seq: 1, producerKind: "hybrid", markedH5: true),
            Oracle.Delivery(eventID: "b", producer: "h", producerSeq: 2, seq: 2, producerKind: "hybrid"),
            Oracle.Delivery(eventID: "c", producer: "app", producerSeq: 1, seq: 3, producerKind: "app", markedH5: true),
            Oracle.Delivery(eventID: "d", producer: "app", producerSeq: 2, seq: 4, producerKind: "app"),
        ]
        var oracle = Oracle(ledgers: [])
        oracle.unledgeredProducers = ["h", "app"]
        let verdict = oracle.judge(Oracle.Observed(deliveries: deliveries, wireDuplicates: 0))
        #expect(verdict.mismarkedH5 == 2 && !verdict.passed, "\(verdict)")
    }
}
