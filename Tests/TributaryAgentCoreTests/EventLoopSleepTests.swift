import Testing

@testable import TributaryAgentCore

/// The system clock's sleeps, on SwiftNIO's event-loop timers (`EventLoopSleep`): never early,
/// cancellable, and split into several timers past the longest one.
@Suite("EventLoopSleep", .timeLimit(.minutes(1)))
struct EventLoopSleepTests {
    @Test("a sleep returns at its deadline, not before; a deadline already past returns at once")
    func notEarly() async throws {
        let deadline = ContinuousClock.now + .milliseconds(30)
        try await EventLoopSleep.sleep(until: deadline)
        #expect(ContinuousClock.now >= deadline)
        // No timer at all for an instant already gone: nothing to wait for, whatever the loop's load.
        try await EventLoopSleep.sleep(until: .now - .seconds(1))
    }

    @Test("a cancelled sleep throws CancellationError at once, one cancelled before it began too")
    func cancellation() async throws {
        let long = Task { try await EventLoopSleep.sleep(until: .now + .seconds(3600)) }
        // Cancelled while its timer is set (the task has had 100 ms to start and set it): the cancellation
        // handler cancels the timer, and the sleep ends with CancellationError, not in an hour.
        try await Task.sleep(for: .milliseconds(100))
        long.cancel()
        await #expect(throws: CancellationError.self) { try await long.value }

        let started = Task {
            withUnsafeCurrentTask { $0?.cancel() }
            try await EventLoopSleep.sleep(until: .now + .seconds(3600))
        }
        await #expect(throws: CancellationError.self) { try await started.value }
    }

    @Test("a sleep longer than the longest timer is several timers, and still ends at its deadline, not before")
    func splitIntoTimers() async throws {
        let deadline = ContinuousClock.now + .milliseconds(40)
        try await EventLoopSleep.sleep(until: deadline, timersOf: .milliseconds(7))
        #expect(ContinuousClock.now >= deadline)
    }

    @Test("the system clock's sleeps are these")
    func systemClock() async throws {
        let clock = SystemClock()
        let long = Task { try await clock.sleep(until: clock.now + .seconds(3600)) }
        long.cancel()
        await #expect(throws: CancellationError.self) { try await long.value }
        let deadline = clock.now + .milliseconds(20)
        try await clock.sleep(until: deadline)
        #expect(clock.now >= deadline)
    }
}
