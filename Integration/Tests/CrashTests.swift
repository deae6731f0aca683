import Foundation
import Testing
import TributaryStore
import TributaryTestSupport

/// Real crashes of a real `tributary-sim app` process, then a restart that reports them.
@Suite("Crash capture with real processes", .serialized)
struct CrashTests {
    /// The Swift runtime's own backtracer would be chained to as well; it only slows the tests down.
    static let quiet = ["SWIFT_BACKTRACE": "enable=no"]

    struct Event {
        var name: String
        var pid: Int32
        var eventID: String
        var properties: [String: Any]
    }

    static func events(_ group: String) throws -> [Event] {
        try SharedStore(groupDirectory: group).events(limit: .max).map { entry in
            let record = try entry.record.get()
            let body = try #require(try JSONSerialization.jsonObject(with: Data(record.body)) as? [String: Any])
            return Event(
                name: body["event"] as? String ?? "", pid: record.pid, eventID: body["event_id"] as? String ?? "",
                properties: body["properties"] as? [String: Any] ?? [:])
        }
    }

    /// Events called `name` (and with that `$app_end_reason`, or from that process).
    static func named(_ name: String, in events: [Event], reason: String? = nil, pid: Int32? = nil) -> [Event] {
        var out: [Event] = []
        for e in events where e.name == name {
            if let reason, e.properties["$app_end_reason"] as? String != reason { continue }
            if let pid, e.pid != pid { continue }
            out.append(e)
        }
        return out
    }

    #if arch(x86_64)
        static let trapSignal = SIGILL  // Swift's fatalError ends in ud2
    #else
        static let trapSignal = SIGTRAP  // brk
    #endif

    @Test(
        "a crash is recorded, chained to the handler installed before ours, and reported at the next start",
        arguments: [
            ("segv", SIGSEGV, "SIGSEGV"), ("fatal", trapSignal, trapSignal == SIGILL ? "SIGILL" : "SIGTRAP"),
            ("abort", SIGABRT, "SIGABRT"), ("breakpoint", SIGTRAP, "SIGTRAP"),
        ])
    func crashAndRestart(kind: String, signal: Int32, name: String) async throws {
        try await withTemporaryGroup { group in
            let trace = group + "-foreign-sdk.trace"
            let ledger = group + "-ledger"
            let app = try ChildProcess(
                "tributary-sim",
                [
                    "app", "--group", group, "--events", "500", "--seed", "7", "--crash-after", "30", "--crash-kind",
                    kind, "--app-version", "1.0.0",
                    "--foreign-handler", trace, "--ledger", ledger,
                ], environment: Self.quiet)
            let crashedPID = app.pid
            let result = await app.finish()
            #expect(app.process.terminationReason == .uncaughtSignal, "\(result.stderr)")
            #expect(result.status == signal, "died by signal \(result.status), expected \(signal)")
            let traced = (try? String(contentsOfFile: trace, encoding: .utf8)) ?? ""
            #expect(
                traced == "foreign-handler signal \(signal < 10 ? "0" : "")\(signal)\n",
                "the other SDK's handler must run once, after ours: \(traced)")
            let crashFile = group + "/crash-app.records"
            let size = (try FileManager.default.attributesOfItem(atPath: crashFile)[.size] as? Int) ?? 0
            #expect(size > 0, "the crash record was written before the process died")

            let before = try Self.events(group)
            #expect(!before.map(\.name).contains("$AppCrashed"))
            let restart = try await ChildProcess.run(
                "tributary-sim", ["app", "--group", group, "--events", "5", "--seed", "8", "--ledger", ledger, "--app-version", "1.1.0"],
                environment: Self.quiet)
            #expect(restart.status == 0, "\(restart.stderr)")

            let events = try Self.events(group)
            let crashed = Self.named("$AppCrashed", in: events)
            try #require(crashed.count == 1)
            let reason = crashed[0].properties["app_crashed_reason"] as? String ?? ""
            #expect(reason.hasPrefix("\(name) (signal \(signal)"), "\(reason)")
            #expect(reason.contains("tributary-sim + 0x"), "the backtrace names the executable: \(reason)")
            // Reported by 1.1.0, the crash was 1.0.0's.
            #expect(crashed[0].properties["$app_version"] as? String == "1.0.0")
            let frames = reason.split(separator: "\n").count - 1
            #expect(frames >= 3, "\(reason)")

            // Starts and ends pair up: the crash's missing $AppEnd was backfilled, in the crashed session.
            let starts = Self.named("$AppStart", in: events)
            #expect(starts.count == Self.named("$AppEnd", in: events).count)
            let backfilled = Self.named("$AppEnd", in: events, reason: "crash")
            try #require(backfilled.count == 1)
            let lastStart = try #require(Self.named("$AppStart", in: events, pid: crashedPID).last)
            #expect(
                backfilled[0].properties["$session_id"] as? String == lastStart.properties["$session_id"] as? String)
            #expect(crashed[0].properties["$session_id"] as? String == lastStart.properties["$session_id"] as? String)
            #expect(backfilled[0].properties["$event_duration"] as? Double != nil)

            // Page views and leaves pair up too: the page on screen at the crash was left at the crash,
            // between $AppCrashed and the $AppEnd, in the crashed session, with its properties.
            let leaves = Self.named("$AppPageLeave", in: events)
            #expect(Self.named("$AppViewScreen", in: events).count == leaves.count)
            let names = events.map(\.name)
            let crashedAt = try #require(names.firstIndex(of: "$AppCrashed"))
            #expect(Array(names[crashedAt...].prefix(3)) == ["$AppCrashed", "$AppPageLeave", "$AppEnd"])
            let leftAtCrash = events[crashedAt + 1]
            #expect(leftAtCrash.properties["$session_id"] as? String == lastStart.properties["$session_id"] as? String)
            #expect(leftAtCrash.properties["page_kind"] as? String != nil)
            #expect(leftAtCrash.properties["event_duration"] as? Double != nil)
            let files = try FileManager.default.contentsOfDirectory(atPath: group)
            #expect(!files.contains("page-app-\(crashedPID).visit"), "the crashed process's visit file is gone")

            // Nothing acknowledged before the crash was lost.
            let stored = Set(events.map(\.eventID))
            let acknowledged = Oracle.Ledger(producer: "", path: ledger).entries().map(\.eventID)
            #expect(acknowledged.count >= 30)
            #expect(Set(acknowledged).isSubset(of: stored))
            #expect(
                (try? FileManager.default.attributesOfItem(atPath: crashFile)[.size] as? Int) == 0,
                "the crash file is emptied once reported")
        }
    }

    @Test("a start leaves alone the crash file another live instance of the app writes to; its crash is reported later")
    func liveInstanceKeepsItsCrashFile() async throws {
        try await withTemporaryGroup { group in
            // Two instances of the app, both producer "app": B runs on (and is crashed later), A crashes now.
            let b = try ChildProcess(
                "tributary-sim", ["app", "--group", group, "--events", "100000", "--rate", "10"], environment: Self.quiet)
            #expect(await b.waitForLine(startingWith: "READY") != nil)
            let a = try ChildProcess(
                "tributary-sim", ["app", "--group", group, "--events", "100", "--crash-after", "5", "--crash-kind", "abort"],
                environment: Self.quiet)
            #expect(await a.finish().status == SIGABRT)
            // C starts while B runs: it must not take the file B's handlers write to.
            let c = try await ChildProcess.run("tributary-sim", ["app", "--group", group, "--events", "3"], environment: Self.quiet)
            #expect(c.status == 0, "\(c.stderr)")
            #expect(Self.named("$AppCrashed", in: try Self.events(group)).isEmpty, "A's record waits: B holds the file")
            b.send(SIGABRT)  // recorded by B's handler, and raised again
            let bExit = await b.finish()
            #expect(b.process.terminationReason == .uncaughtSignal && bExit.status == SIGABRT, "\(bExit.stderr)")
            // D, with no other instance left, reports both crashes.
            let d = try await ChildProcess.run("tributary-sim", ["app", "--group", group, "--events", "1"], environment: Self.quiet)
            #expect(d.status == 0, "\(d.stderr)")
            #expect(Self.named("$AppCrashed", in: try Self.events(group)).count == 2)
        }
    }

    @Test("four threads crashing at once leave one intact record and one $AppCrashed")
    func concurrentCrashes() async throws {
        try await withTemporaryGroup { group in
            let app = try ChildProcess(
                "tributary-sim",
                ["app", "--group", group, "--events", "100", "--crash-after", "5", "--crash-kind", "threads"],
                environment: Self.quiet)
            let result = await app.finish()
            #expect(app.process.terminationReason == .uncaughtSignal && result.status == SIGSEGV, "\(result.stderr)")
            let restart = try await ChildProcess.run(
                "tributary-sim", ["app", "--group", group, "--events", "3"], environment: Self.quiet)
            #expect(restart.status == 0, "\(restart.stderr)")
            let events = try Self.events(group)
            #expect(Self.named("$AppCrashed", in: events).count == 1)
            #expect(Self.named("$AppEnd", in: events, reason: "crash").count == 1)
            #expect(Self.named("$AppStart", in: events).count == Self.named("$AppEnd", in: events).count)
        }
    }

    @Test("chained to the Swift runtime's backtracer (installed at process start), then the default action")
    func swiftBacktracer() async throws {
        try await withTemporaryGroup { group in
            let app = try ChildProcess(
                "tributary-sim",
                ["app", "--group", group, "--events", "100", "--crash-after", "5", "--crash-kind", "segv"],
                environment: ["SWIFT_BACKTRACE": "enable=yes,interactive=no"])
            let result = await app.finish()
            #expect(app.process.terminationReason == .uncaughtSignal && result.status == SIGSEGV, "\(result.stderr)")
            #expect(result.stderr.contains("Program crashed: Bad pointer dereference"), "\(result.stderr.prefix(500))")
            let size =
                (try FileManager.default.attributesOfItem(atPath: group + "/crash-app.records")[.size] as? Int) ?? 0
            #expect(size > 0)
        }
    }

    @Test("a session without a crash: the mix of automatic events, every start paired with an end")
    func scriptedSession() async throws {
        try await withTemporaryGroup { group in
            let ledger = group + "-ledger"
            let run = try await ChildProcess.run(
                "tributary-sim", ["app", "--group", group, "--events", "400", "--seed", "3", "--ledger", ledger])
            #expect(run.status == 0, "\(run.stderr)")
            let events = try Self.events(group)
            #expect(events.count >= 400)
            let names = Set(events.map(\.name))
            let starts = Self.named("$AppStart", in: events).count
            let ends = Self.named("$AppEnd", in: events).count
            let sessions = Set(events.map { $0.properties["$session_id"] as? String })
            for expected in ["$AppStart", "$AppEnd", "$AppViewScreen", "$AppPageLeave", "$AppClick", "$AppExposure", "$AppPerformance"] {
                #expect(names.contains(expected), "no \(expected) in \(names.sorted())")
            }
            #expect(starts == ends)
            #expect(!sessions.contains(nil), "every event has a $session_id")
            #expect(sessions.count >= 2, "background trips end sessions")
            let ledgerLines = ((try? String(contentsOfFile: ledger, encoding: .utf8)) ?? "").split(separator: "\n")
            #expect(ledgerLines.count == events.count)
            // Same seed, same session.
            try await withTemporaryGroup { other in
                _ = try await ChildProcess.run(
                    "tributary-sim", ["app", "--group", other, "--events", "400", "--seed", "3"])
                let replay = try Self.events(other)
                #expect(replay.map(\.name) == events.map(\.name))
            }
        }
    }
}
