import Foundation
import Testing
import Tributary
import TributaryCollector
import TributaryStore
import TributaryTestSupport

/// Hybrid pages in real headless Chromium, through the bridge, the agent and the reference collector.
@Suite("Hybrid pages in a real browser", .serialized)
struct HybridBrowserTests {
    /// Waits until the collector holds `count` unique events (or `seconds` pass); returns them.
    static func delivered(_ collector: RunningCollector, count: Int, within seconds: Double) async throws
        -> [ReceivedEvent]
    {
        let start = ContinuousClock.now
        while try await collector.stats().unique < count && ContinuousClock.now - start < .seconds(seconds) {
            try await Task.sleep(for: .milliseconds(50))
        }
        return try await collector.events(limit: 1_000_000)
    }

    @Test(
        "main frame, whitelisted iframe and legacy page arrive enriched; everything refused is counted and never arrives"
    )
    func pagesThroughTheBridge() async throws {
        try await withTemporaryGroup { group in
            // The main app ran once: it published its presets (version 4.2.0) to the group.
            var app = Tracker.Configuration(groupDirectory: group)
            app.appVersion = "4.2.0"
            let anonymousID = try Tracker(configuration: app).identity().anonymousID
            try await Collector.withRunning(CollectorConfiguration()) { collector in
                let ledger = group + "-hybrid-ledger"
                let perFrame = 6
                let sim = try await ChildProcess.run(
                    "tributary-sim",
                    ["hybrid", "--group", group, "--events", "\(perFrame)", "--scenario", "all", "--ledger", ledger])
                #expect(sim.status == 0, "\(sim.stderr)")
                // The agent starts once the pages are done. Each event keeps the identity in force when the page
                // tracked it: the pages' track_signup logs the app in part way, and only the events stored from
                // it on carry the login id.
                let agent = try ChildProcess(
                    "tributary-agent", Scenario.agentArguments(group, collector.url, once: false))

                // What the bridge counted, by reason.
                let line = try #require(sim.stdout.split(separator: "\n").first { $0.hasPrefix("BRIDGE ") })
                let summary = try #require(
                    try JSONSerialization.jsonObject(with: Data(line.dropFirst(7).utf8)) as? [String: Any])
                // main, iframe, the track_signup, two profile operations, two legacy events
                let accepted = 2 * perFrame + 1 + 2 + 2
                #expect(summary["accepted"] as? Int == accepted)
                #expect(
                    summary["rejected"] as? [String: Int] == [
                        // the foreign iframe's two events and its legacy navigation, and the navigation a
                        // foreign frame made its whitelisted child do
                        "foreign_origin": 4,
                        "foreign_project": 2,  // a whitelisted page of another project
                        "forged_identity": 2,  // a forged distinct_id, a claimed login
                        "malformed_message": 2, "message_too_large": 1, "unsupported_call_type": 1,
                        "invalid_event": 2,  // a bad event name, a profile_increment by a string
                    ])

                let acknowledged = Oracle.Ledger(producer: "hybrid", path: ledger).entries().map(\.eventID)
                #expect(acknowledged.count == accepted)
                let events = try await Self.delivered(collector, count: accepted, within: 30)
                #expect(Set(events.map(\.eventID)) == Set(acknowledged), "exactly the accepted events arrive")

                var lastIndex: [String: Int] = [:]
                var signedUp = false
                // The page's profile operations, for the user its track_signup logged in: the profile's
                // journey from the page to the collector.
                let profiles = events.filter { $0.type.hasPrefix("profile_") }
                #expect(profiles.map(\.type) == ["profile_set_once", "profile_increment"])
                for received in profiles {
                    let record = try received.jsonObject()
                    #expect(record["distinct_id"] as? String == "h5-user-7" && record["_hybrid_h5"] as? Bool == true)
                }
                let profile = try #require(try await collector.profile(of: "h5-user-7"))
                #expect(profile["$first_visit_time"] as? String == "2026-01-01 10:00:00.000")
                #expect(profile["first_frame"] as? String == "main" && profile["visits"] as? Int == 2)
                #expect(profile["$is_login_id"] == nil, "the app's identity decides, not the page's flag")
                for received in events where !received.type.hasPrefix("profile_") {
                    let event = try received.jsonObject()
                    let properties = try #require(event["properties"] as? [String: Any])
                    let lib = try #require(event["lib"] as? [String: Any])
                    let frame = properties["frame"] as? String
                    #expect(received.producer == "hybrid")
                    #expect(event["_hybrid_h5"] as? Bool == true && properties["_hybrid_h5"] == nil)
                    #expect(
                        properties["$app_version"] as? String == "4.2.0" && lib["$app_version"] as? String == "4.2.0")
                    #expect(properties["$os"] as? String == "Linux", "the app's presets override the page's guesses")
                    #expect(
                        properties["$model"] as? String != "iPhone" && properties["$manufacturer"] as? String != "Apple"
                    )
                    #expect(
                        properties["app_channel"] as? String == "tributary-sim", "super properties override the page's")
                    for key in ["server_url", "_nocache", "$project", "$token"] {
                        #expect(event[key] == nil && properties[key] == nil, "\(key) must not arrive")
                    }
                    #expect(lib["$lib"] as? String == "js" && properties["$lib"] as? String == "js")
                    #expect(event["time"] as? Int == properties["page_time"] as? Int, "the page's own time is kept")
                    if received.type == "track_signup" { signedUp = true }
                    if signedUp {
                        #expect(event["distinct_id"] as? String == "h5-user-7", "the page's track_signup logged the app in")
                        #expect(event["login_id"] as? String == "h5-user-7")
                    } else {
                        #expect(event["distinct_id"] as? String == anonymousID, "tracked before the sign-up")
                        #expect(event["login_id"] == nil)
                    }
                    #expect(event["anonymous_id"] as? String == anonymousID)
                    #expect(!["foreign", "hijacked", "other-project", "forged", "claimed-login"].contains(frame ?? ""))
                    #expect(!["Oversized", "Bad Name!"].contains(received.event ?? ""))
                    if let frame, let index = properties["index"] as? Int {
                        #expect(index == lastIndex[frame, default: -1] + 1, "\(frame) out of order")
                        lastIndex[frame] = index
                    }
                }
                #expect(lastIndex == ["main": perFrame - 1, "iframe": perFrame - 1, "legacy": 1])
                #expect(events.filter { $0.type == "track_signup" }.map(\.event) == ["$SignUp"])

                agent.send(SIGTERM)
                #expect(await agent.finish().status == 0)
            }
        }
    }

    @Test("tributary-sim hybrid refuses bad options with a clear message")
    func badOptions() async throws {
        let scenario = try await ChildProcess.run(
            "tributary-sim", ["hybrid", "--group", "/tmp/x", "--scenario", "odd"])
        #expect(scenario.status == 64)
        #expect(scenario.stderr.contains("--scenario must be pages or all"))
        let server = try await ChildProcess.run(
            "tributary-sim", ["hybrid", "--group", "/tmp/x", "--server-url", "nohost"])
        #expect(server.status == 64)
        #expect(server.stderr.contains("--server-url"))
    }

    @Test("tributary-sim hybrid without a browser to start exits 69 and says why, with nothing stored")
    func noBrowser() async throws {
        try await withTemporaryGroup { group in
            let missing = try await ChildProcess.run(
                "tributary-sim", ["hybrid", "--group", group, "--events", "3"],
                environment: ["TRIBUTARY_CHROMIUM": "/nonexistent/chromium"])
            #expect(missing.status == 69, "\(missing.stderr)")
            #expect(missing.stderr.contains("The headless browser is not available"), "\(missing.stderr)")
            #expect(missing.stderr.contains("/nonexistent/chromium"), "\(missing.stderr)")
            #expect(!missing.stdout.contains("READY"))
            // The browser starts before the store is opened: no group was created.
            #expect(!FileManager.default.fileExists(atPath: group))
        }
    }
}
