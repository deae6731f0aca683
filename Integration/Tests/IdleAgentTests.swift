import Foundation
import Testing
import TributaryCollector
import TributaryStore
import TributaryTestSupport

/// An agent process with nothing to do: it writes nothing to disk and is not woken for nothing; what
/// reaches the store after an idle spell wakes it at once. Counts from `/proc`, not timings, so that
/// a loaded 2-core machine changes nothing but how long the test takes.
@Suite("An idle agent sleeps", .serialized)
struct IdleAgentTests {
    /// What the kernel counts for a process: its threads' voluntary context switches (each is a sleep,
    /// so each wake-up ends in one), and the bytes it caused to be written to disk.
    struct Counts {
        var wakeups: Int
        var writtenBytes: Int

        init(pid: Int32) throws {
            let tasks = try FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task")
            wakeups = tasks.reduce(0) { sum, task in
                let status = (try? String(contentsOfFile: "/proc/\(pid)/task/\(task)/status", encoding: .utf8)) ?? ""
                return sum + (Self.field("voluntary_ctxt_switches", in: status) ?? 0)
            }
            let io = try String(contentsOfFile: "/proc/\(pid)/io", encoding: .utf8)
            writtenBytes = Self.field("write_bytes", in: io) ?? -1
        }

        static func field(_ name: String, in text: String) -> Int? {
            text.split(separator: "\n").first { $0.hasPrefix(name + ":") }
                .flatMap { Int($0.dropFirst(name.count + 1).trimmingCharacters(in: .whitespaces)) }
        }
    }

    @Test("idle with the watchdog on: no byte written, a few wake-ups in 6 s; a new event then wakes it and is delivered")
    func idleSleeps() async throws {
        try await withTemporaryGroup { group in
            try await Collector.withRunning(CollectorConfiguration()) { collector in
                try await DeadlineTests.produce(group, 1)
                let notify = try NotifySocket(path: group + "-notify")
                // A 10 s watchdog: pinged every 5 s, once in the window below.
                let agent = try ChildProcess(
                    "tributary-agent",
                    DeadlineTests.args(group, collector.url, ["--flush-interval", "1", "--bulk-size", "100"]),
                    environment: ["NOTIFY_SOCKET": notify.path, "WATCHDOG_USEC": "10000000"])
                _ = try await HybridBrowserTests.delivered(collector, count: 1, within: 60)
                #expect(try await collector.stats().unique == 1)
                // The delivery's own writes (the outbox, the status a second later, the checkpoint) settle.
                try await Task.sleep(for: .seconds(3))
                let before = try Counts(pid: agent.pid)
                try await Task.sleep(for: .seconds(6))
                let after = try Counts(pid: agent.pid)
                #expect(after.writtenBytes - before.writtenBytes == 0, "an idle agent wrote \(after.writtenBytes - before.writtenBytes) bytes")
                // One watchdog ping (a thread or two woken for it) and the runtime's odd wake-up. Polling
                // every 200 ms alone made 30 in this window (33 a second in all, before issue 36).
                #expect(after.wakeups - before.wakeups <= 12, "an idle agent woke \(after.wakeups - before.wakeups) times in 6 s")

                // An event stored now wakes it (inotify on the store): delivered within the flush interval.
                try await DeadlineTests.produce(group, 1)
                _ = try await HybridBrowserTests.delivered(collector, count: 2, within: 60)
                #expect(try await collector.stats().unique == 2)
                agent.send(SIGTERM)
                #expect(await agent.finish().status == 0)
            }
        }
    }
}
