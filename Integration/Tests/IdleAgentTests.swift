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
    /// What the kernel counts for a process: each thread's voluntary context switches (each is a
    /// sleep, so each wake-up ends in one), and the bytes it caused to be written to disk.
    struct Counts {
        var switches: [String: Int] = [:]
        /// Each thread's name (`comm`), by thread id.
        var names: [String: String] = [:]
        var writtenBytes: Int

        init(pid: Int32) throws {
            for task in try FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task") {
                let status = (try? String(contentsOfFile: "/proc/\(pid)/task/\(task)/status", encoding: .utf8)) ?? ""
                switches[task] = Self.field("voluntary_ctxt_switches", in: status) ?? 0
                names[task] = (try? String(contentsOfFile: "/proc/\(pid)/task/\(task)/comm", encoding: .utf8))?
                    .trimmingCharacters(in: .whitespacesAndNewlines)
            }
            let io = try String(contentsOfFile: "/proc/\(pid)/io", encoding: .utf8)
            writtenBytes = Self.field("write_bytes", in: io) ?? -1
        }

        /// libdispatch's monitored worker threads, named after their root queue's label
        /// (`com.apple.root.default-qos`, cut to its last 15 bytes): the first of them starts
        /// libdispatch's pool monitor, which wakes the process once a second from then on. The
        /// overcommitting queues' threads (`…-qos.overcommit`) are not monitored; one serves the
        /// signal sources of the agent's stop signals, asleep in `epoll_wait` until a signal comes.
        var dispatchWorkers: [String] {
            names.values.filter { $0.hasSuffix("-qos") }.sorted()
        }

        /// Wake-ups since `before`: the live threads' new switches, and one for each thread that ended.
        func wakeups(since before: Counts) -> Int {
            switches.reduce(0) { $0 + $1.value - (before.switches[$1.key] ?? 0) }
                + before.switches.keys.filter { switches[$0] == nil }.count
        }

        static func field(_ name: String, in text: String) -> Int? {
            text.split(separator: "\n").first { $0.hasPrefix(name + ":") }
                .flatMap { Int($0.dropFirst(name.count + 1).trimmingCharacters(in: .whitespaces)) }
        }
    }

    @Test("idle with the watchdog on: no byte written, no libdispatch worker, fewer than one wake-up a second (10 s); a new event then wakes it and is delivered")
    func idleSleeps() async throws {
        try await withTemporaryGroup { group in
            try await Collector.withRunning(CollectorConfiguration()) { collector in
                try await DeadlineTests.produce(group, 1)
                let notify = try NotifySocket(path: group + "-notify")
                // systemd's watchdog as the unit sets it (30 s): pinged every 15 s, at most once in the window.
                let agent = try ChildProcess(
                    "tributary-agent",
                    DeadlineTests.args(group, collector.url, ["--flush-interval", "1", "--bulk-size", "100"]),
                    environment: ["NOTIFY_SOCKET": notify.path, "WATCHDOG_USEC": "30000000"])
                _ = try await HybridBrowserTests.delivered(collector, count: 1, within: 60)
                #expect(try await collector.stats().unique == 1)
                // The delivery's own writes (the outbox, the status a second later, the checkpoint) settle.
                try await Task.sleep(for: .seconds(3))
                let before = try Counts(pid: agent.pid)
                try await Task.sleep(for: .seconds(10))
                let after = try Counts(pid: agent.pid)
                #expect(after.writtenBytes - before.writtenBytes == 0, "an idle agent wrote \(after.writtenBytes - before.writtenBytes) bytes")
                // No libdispatch worker is alive: its tasks run on SwiftNIO's event loops, its blocking work
                // on its own threads, its sleeps are event-loop timers (docs/agent-core.md, "Tasks and
                // threads"). A worker exits after 5 s with nothing to do, but the pool monitor its first
                // one started does not: the wake-up bound below catches that monitor.
                #expect(after.dispatchWorkers.isEmpty, "libdispatch worker threads in an idle agent: \(after.dispatchWorkers)")
                // What is left: a watchdog ping (its timer on an event loop, the pinger's thread, the next
                // timer: 3-4 wake-ups), and not one a second. With libdispatch's monitor it was 13-27 in 10 s;
                // before issue 36, polling every 200 ms (the loop and the flush socket) made about 330.
                let woke = after.wakeups(since: before)
                #expect(woke < 10, "an idle agent woke \(woke) times in 10 s")

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
