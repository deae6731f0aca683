import AsyncHTTPClient
import Foundation
import Testing
import TributaryCollector
import TributaryTestSupport

@Suite("Control and statistics endpoints")
struct ControlTests {
    @Test("forcedStatus answers every ingest request until cleared through POST /control/faults")
    func forcedStatusThenCleared() async throws {
        let faults = FaultConfiguration(forcedStatus: 401)
        try await Collector.withRunning(CollectorConfiguration(faults: faults)) { collector in
            let client = Client(collector)
            let refused = try await client.post(Events.run(2))
            #expect(refused.status == 401)
            #expect(refused.object["code"] as? String == "forced_status")
            #expect(try await client.get("/control/faults").object["forced_status"] as? Int == 401)

            let cleared = try await client.postJSON("/control/faults", "{}")
            #expect(cleared.status == 200)
            #expect(cleared.object["forced_status"] is NSNull)
            #expect(collector.faults == .none)
            #expect(try await client.post(Events.run(2)).status == 200)

            let stats = try await collector.stats()
            #expect(stats.faults.forced == 1 && stats.unique == 2 && stats.requests == 2)
        }
    }

    @Test(
        "POST /control/faults rejects bad values and unknown keys, keeping the faults in force",
        arguments: [
            (#"{"failure_rate": 2}"#, "\"failure_rate\""),
            (#"{"fail_rate": 1}"#, "fail_rate"),
            (#"{"poison_pattern": "("}"#, "\"poison_pattern\""),
            (#"{"forced_status": 42}"#, "\"forced_status\""),
            (#"{"forced_status": 101}"#, "\"forced_status\""),
            (#"{"failure_status": 200}"#, "\"failure_status\""),
            ("[]", "fault configuration"),
        ]
    )
    func rejectsBadFaults(json: String, named: String) async throws {
        let faults = FaultConfiguration(seed: 9, latencyMillis: 1)
        try await Collector.withRunning(CollectorConfiguration(faults: faults)) { collector in
            let reply = try await Client(collector).postJSON("/control/faults", json)
            #expect(reply.status == 400)
            #expect((reply.object["error"] as? String)?.contains(named) == true, "\(reply.body)")
            #expect(collector.faults == faults)
        }
    }

    @Test("GET /stats serves the same figures as stats(), in snake_case JSON")
    func statsOverHTTP() async throws {
        try await Collector.withRunning(CollectorConfiguration()) { collector in
            let client = Client(collector)
            _ = try await client.post(Events.run(2, producer: "widget"))
            _ = try await client.post(Events.run(2, producer: "widget"))
            let reply = try await client.get("/stats")
            #expect(reply.status == 200)
            #expect(reply.object["rejected_batches"] as? Int == 0)
            #expect((reply.object["faults"] as? [String: Any])?["lost_ack"] as? Int == 0)
            let decoded = try JSONDecoder().decode(CollectorStats.self, from: Data(reply.body.utf8))
            #expect(decoded == (try await collector.stats()))
            #expect(decoded.orderViolations == ["widget": 2])
        }
    }

    @Test("An invalid configuration is refused before anything starts")
    func refusesInvalidConfiguration() async throws {
        await #expect(throws: CollectorError.self) {
            try await Collector.withRunning(CollectorConfiguration(faults: FaultConfiguration(hangRate: -1))) { _ in }
        }
        await #expect(throws: CollectorError.self) {
            try await Collector.withRunning(CollectorConfiguration(port: 70000)) { _ in }
        }
    }

    @Test("A port already in use is a serverNotStarted error, not a hang")
    func reportsBusyPort() async throws {
        try await Collector.withRunning(CollectorConfiguration()) { first in
            let error = await #expect(throws: CollectorError.self) {
                try await Collector.withRunning(CollectorConfiguration(port: first.port)) { _ in }
            }
            #expect(error?.code == .serverNotStarted)
        }
    }

    @Test("The executable prints LISTENING with its URL, serves, and exits 0 on SIGTERM")
    func executableLifecycle() async throws {
        let process = try ChildProcess(
            "tributary-collector",
            ["--port", "0", "--fail-rate", "1", "--retry-after", "3"]
        )
        let line = try #require(await process.waitForLine(startingWith: "LISTENING "))
        let url = String(line.dropFirst("LISTENING ".count))
        #expect(url.hasPrefix("http://127.0.0.1:"))
        let faults = try await fetch(url + "/control/faults")
        #expect(faults.contains(#""failure_rate":1"#) && faults.contains(#""retry_after":"3""#))
        process.send(SIGTERM)
        let result = await process.finish()
        #expect(result.status == 0, "\(result.stderr)")
        #expect(process.linesSkipped.isEmpty && result.stdout.isEmpty, "only the LISTENING line goes to stdout")
    }

    private func fetch(_ url: String) async throws -> String {
        let response = try await HTTPClient.shared.execute(HTTPClientRequest(url: url), timeout: Client.patience)
        return String(buffer: try await response.body.collect(upTo: 1 << 20))
    }
}
