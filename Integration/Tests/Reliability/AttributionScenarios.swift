import Foundation
import Testing
import TributaryCollector
import TributaryStore
import TributaryTestSupport

/// Attribution: every event reaches the collector under the identity in force when it was tracked,
/// whatever the producer kind and whenever the agent drains it. The ledgers of `tributary-sim`
/// record each event's `distinct_id` as stored, and the oracle counts an event that arrives under
/// another one as misattributed.
extension ReliabilityScenarios {
    @Suite("Reliability: identity changes between tracking and draining", .serialized, .timeLimit(.minutes(4 * Reliability.soak)))
    struct AttributionScenarios {
        @Test("logins and logouts while extensions and the app track, drained after them all: no event attributed to another user")
        func identityChangesBeforeTheDrain() async throws {
            let rounds = 4 * Reliability.soak
            try await withTemporaryGroup { group in
                try await Collector.withRunning(CollectorConfiguration()) { collector in
                    var ledgers: [Oracle.Ledger] = []
                    var problems: [String] = []
                    // The store exists before the first login (the CLI refuses a group without one).
                    ledgers += try await Scenario.produce(group, [("app-0", 3)])
                    for round in 1...rounds {
                        let login = try await ChildProcess.run("tributary", ["login", "--group", group, "--producer-id", "account", "user-\(round)"])
                        if login.status != 0 { problems.append("login user-\(round): \(login.stderr)") }
                        let id = "ext-\(round)"
                        let ledger = Oracle.Ledger(producer: id, path: group + "-ledger-" + id)
                        let ext = try await ChildProcess.run(
                            "tributary-sim",
                            ["extension", "--group", group, "--producer-id", id, "--events", "3", "--ledger", ledger.path])
                        if ext.status != 0 { problems.append("\(id): \(ext.stderr)") }
                        ledgers.append(ledger)
                        ledgers += try await Scenario.produce(group, [("app-\(round)", 3)])
                        if round.isMultiple(of: 2) {
                            let logout = try await ChildProcess.run("tributary", ["logout", "--group", group, "--producer-id", "account"])
                            if logout.status != 0 { problems.append("logout: \(logout.stderr)") }
                        }
                    }
                    // Only now the agent drains: with the identity current at drain time, every event of
                    // every extension would have gone out as the last user's (or the anonymous id's).
                    try await Scenario.drain(group, collector)
                    var oracle = Oracle(ledgers: ledgers)
                    oracle.batchSize = Scenario.batchSize
                    oracle.unledgeredProducers = ["account"]  // the CLI's $SignUp and $Logout, checked below
                    let verdict = try await Scenario.conclude(
                        "identity changes before the drain", test: "identityChangesBeforeTheDrain", iterations: rounds,
                        oracle: oracle, collector: collector, group: group, problems: problems)
                    #expect(verdict.acknowledged == 3 + rounds * 6)
                    let events = try await collector.events().map { try $0.jsonObject() }
                    let users = Set(events.compactMap { $0["login_id"] as? String })
                    #expect(users == Set((1...rounds).map { "user-\($0)" }), "every user's events arrive under that user")
                    // The identity changes themselves arrive in order: each login's $SignUp under the new
                    // login, each logout's $Logout under the login that ended.
                    let changes = events.filter { ["$SignUp", "$Logout"].contains($0["event"] as? String) }
                        .map { "\($0["event"] as? String ?? "?") \($0["distinct_id"] as? String ?? "?")" }
                    let expected = (1...rounds).flatMap { round in
                        ["$SignUp user-\(round)"] + (round.isMultiple(of: 2) ? ["$Logout user-\(round)"] : [])
                    }
                    #expect(changes == expected)
                }
            }
        }
    }
}
