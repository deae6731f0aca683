import Foundation
import Testing
import Tributary
import TributaryBridge
import TributaryCollector
import TributaryTestSupport

/// User profiles end to end, with real components: the library and a page's records through the bridge
/// into the real LMDB store, the real agent (retries, dedup) in both wire formats, the reference
/// collector keeping the profile; and the `tributary profile` command.
@Suite("User profiles end to end", .serialized)
struct ProfileJourneyTests {
    static let server = "https://sa.example.com/sa?project=default"
    static let origin = "http://127.0.0.1:8080"

    @Test("app and page profile operations reach the collector's profile once each, through lost acknowledgements", arguments: ["sensors", "ndjson"])
    func journey(format: String) async throws {
        try await withTemporaryGroup { group in
            let app = try Tracker(configuration: .init(groupDirectory: group))
            _ = try app.login("user-9")
            try await app.profileSet(["name": "Ada", "plan": "free"])
            try await app.profileIncrement(["visits": 1])
            let bridge = HybridBridge(
                tracker: try Tracker(configuration: .init(groupDirectory: group, producerKind: .hybrid)),
                configuration: BridgeConfiguration(serverURL: Self.server, allowedOrigins: [Self.origin]))
            for (type, properties) in [
                ("profile_set_once", #"{"$first_visit_time":"2026-01-01 10:00:00.000","name":"Page"}"#),
                ("profile_increment", #"{"visits":2}"#), ("profile_append", #"{"tags":["h5"]}"#),
            ] {
                let message = """
                    {"callType":"app_h5_track","data":{"type":"\(type)","time":1700000000500,"distinct_id":"user-9",\
                    "login_id":"user-9","anonymous_id":"h5-anon","lib":{"$lib":"js"},"properties":\(properties),\
                    "server_url":"\(Self.server)"}}
                    """
                _ = try await bridge.receive(message, origin: Self.origin).get()
            }
            try await app.profileUnset(["plan"])

            // Every second batch is committed and its acknowledgement lost: the agent sends it again.
            let faults = FaultConfiguration(seed: 5, lostAckRate: 0.5)
            try await Collector.withRunning(CollectorConfiguration(faults: faults)) { collector in
                let run = try await ChildProcess.run(
                    "tributary-agent",
                    Scenario.agentArguments(group, collector.url, once: true, ["--format", format, "--batch-size", "1"]))
                #expect(run.status == 0, "\(run.stderr)")
                let stats = try await collector.stats()
                #expect(stats.faults.lostAck > 0 && stats.duplicates > 0, "the retry and dedup path was taken: \(stats)")
                #expect(
                    stats.profileRecords == [
                        "profile_set": 1, "profile_set_once": 1, "profile_increment": 2, "profile_append": 1,
                        "profile_unset": 1,
                    ])
                #expect(stats.profiles == 1 && stats.hybridH5 == 3)
                let profile = try #require(try await collector.profile(of: "user-9"))
                #expect(profile["name"] as? String == "Ada", "set_once from the page kept the app's name")
                #expect(profile["$first_visit_time"] as? String == "2026-01-01 10:00:00.000")
                #expect(profile["visits"] as? Int == 3, "each increment applied once")
                #expect(profile["tags"] as? [String] == ["h5"])
                #expect(profile["plan"] == nil)
                let seqs = try await collector.events().compactMap(\.seq)
                #expect(seqs == seqs.sorted(), "in store order")
            }
        }
    }

    @Test("tributary profile stores each operation, and refuses a broken rule with exit 65, writing nothing")
    func command() async throws {
        try await withTemporaryGroup { group in
            _ = try Tracker(configuration: .init(groupDirectory: group))
            for arguments in [
                ["set", "--properties", #"{"name":"Ada"}"#], ["set-once", "--properties", #"{"first":"x"}"#],
                ["increment", "--properties", #"{"visits":1}"#], ["append", "--properties", #"{"tags":["a"]}"#],
                ["unset", "name"], ["delete"],
            ] {
                let run = try await ChildProcess.run("tributary", ["profile"] + arguments + ["--group", group])
                #expect(run.status == 0, "\(arguments): \(run.stderr)")
            }
            let refused = try await ChildProcess.run(
                "tributary", ["profile", "increment", "--properties", #"{"visits":"many"}"#, "--group", group])
            #expect(refused.status == 65 && refused.stderr.contains("profile_increment takes a number"), "\(refused.stderr)")
            let usage = try await ChildProcess.run("tributary", ["profile", "merge", "--group", group])
            #expect(usage.status == 64 && usage.stderr.contains("OPERATION must be"), "\(usage.stderr)")
            let inspect = try await ChildProcess.run("tributary", ["inspect", "--group", group])
            #expect(
                inspect.stdout.split(separator: "\n").compactMap { $0.split(separator: "\t").last.map(String.init) } == [
                    "profile_set", "profile_set_once", "profile_increment", "profile_append", "profile_unset",
                    "profile_delete",
                ], "\(inspect.stdout)")
        }
    }
}
