import Foundation
import Synchronization
import Testing
import Tributary
import TributaryStore
import TributaryTestSupport

@testable import TributaryAgentCore

/// What wakes an idle agent from outside: a producer's commit to the store (inotify) and a flush
/// datagram on `agent.sock`. Counts, not timings: each wait is for a count to be reached.
@Suite("Wake sources")
struct WakeSourcesTests {
    final class Counts: Sendable {
        let flushes = Atomic<Int>(0)
        let changes = Atomic<Int>(0)
    }

    /// Waits until `done` holds, up to 30 s (a loaded machine); returns whether it did.
    func eventually(_ done: () -> Bool) async throws -> Bool {
        let start = ContinuousClock.now
        while !done() {
            guard ContinuousClock.now - start < .seconds(30) else { return false }
            try await Task.sleep(for: .milliseconds(10))
        }
        return true
    }

    @Test("a commit to the store and a flush datagram each wake the agent; nothing else does; stop ends the listener")
    func commitsAndFlushes() async throws {
        try await withTemporaryGroup { group in
            let tracker = try Tracker(configuration: .init(groupDirectory: group))
            let counts = Counts()
            let sources = try WakeSources(
                groupDirectory: group, coalesce: .milliseconds(200),
                onFlush: { counts.flushes.add(1, ordering: .relaxed) },
                onStoreChange: { counts.changes.add(1, ordering: .relaxed) })
            #expect(sources.watchesStore)
            try await tracker.track("Ordinary")
            #expect(try await eventually { counts.changes.load(ordering: .relaxed) >= 1 }, "a commit woke nothing")
            #expect(AgentChannel.flush(groupDirectory: group) == .sent)
            #expect(try await eventually { counts.flushes.load(ordering: .relaxed) == 1 }, "a flush woke nothing")
            // With the last window over, nothing more comes while nothing changes.
            try await Task.sleep(for: .milliseconds(400))
            let settled = counts.changes.load(ordering: .relaxed)
            try await Task.sleep(for: .milliseconds(400))
            #expect(counts.changes.load(ordering: .relaxed) == settled, "woken with nothing changed")
            sources.stop()
            #expect(access(group + "/" + AgentChannel.socketFile, F_OK) != 0, "the socket is still there")
        }
    }

    @Test("a burst of commits wakes the agent a few times, not once per commit")
    func burstCoalesces() async throws {
        try await withTemporaryGroup { group in
            let tracker = try Tracker(configuration: .init(groupDirectory: group))
            try await tracker.track("Ordinary")  // the store's files exist before they are watched
            let counts = Counts()
            // A window far longer than the burst, however slow the machine: the burst is one wake-up
            // at once and one at the window's end.
            let sources = try WakeSources(
                groupDirectory: group, coalesce: .seconds(30), onFlush: {},
                onStoreChange: { counts.changes.add(1, ordering: .relaxed) })
            defer { sources.stop() }
            for i in 0..<50 { try await tracker.track("Ordinary", properties: ["i": .int(Int64(i))]) }
            #expect(try await eventually { counts.changes.load(ordering: .relaxed) >= 1 })
            #expect(counts.changes.load(ordering: .relaxed) == 1, "\(counts.changes.load(ordering: .relaxed)) wake-ups for 50 commits")
        }
    }
}
