import Foundation
import Hummingbird
import Logging
import NIOCore
import ServiceLifecycle
import Synchronization
import Testing
import Tributary
import TributaryTestSupport
import TributaryWire

@testable import TributaryAgentCore

/// The agent against answers the reference collector does not give: a server on loopback that answers
/// each request as a script says (by the request's number and its count of events), with a body of a
/// chosen length.
@Suite("Answers the reference collector does not give")
struct CollectorAnswerTests {
    /// A Hummingbird server answering `POST /sa` (Sensors form) as `script` says.
    final class ScriptedCollector: Sendable {
        /// The count of events of each request, in order.
        let requests = Mutex<[Int]>([])
        /// The events of the requests answered 2xx.
        let delivered = Mutex(0)

        /// Runs a server answering request n (from 1) of `events` events with `script(n, events)`, its
        /// body `padding` bytes long, until `body` returns.
        static func withRunning<T: Sendable>(
            padding: Int = 0, script: @escaping @Sendable (_ request: Int, _ events: Int) -> Int,
            _ body: (ScriptedCollector, String) async throws -> T
        ) async throws -> T {
            let collector = ScriptedCollector()
            let router = Router()
            router.post("sa") { request, _ -> Response in
                let bytes = try await request.body.collect(upTo: 64 << 20)
                let events = try WireFormat.sensors.decode(Array(bytes.readableBytesView), contentEncoding: nil).count
                let number = collector.requests.withLock { requests in
                    requests.append(events)
                    return requests.count
                }
                let status = script(number, events)
                if (200..<300).contains(status) { collector.delivered.withLock { $0 += events } }
                return Response(
                    status: .init(code: status),
                    body: .init(byteBuffer: ByteBuffer(repeating: UInt8(ascii: "x"), count: padding)))
            }
            let port = Mutex<Int?>(nil)
            var logger = Logger(label: "scripted-collector")
            logger.logLevel = .warning
            let app = Application(
                router: router, configuration: .init(address: .hostname("127.0.0.1", port: 0)),
                onServerRunning: { channel in port.withLock { $0 = channel.localAddress?.port } }, logger: logger)
            let services = ServiceGroup(configuration: .init(services: [app], logger: logger))
            return try await withThrowingTaskGroup(of: Void.self) { tasks in
                tasks.addTask { try await services.run() }
                let result: Result<T, any Error>
                do {
                    for _ in 0..<500 where port.withLock({ $0 }) == nil { try await Task.sleep(for: .milliseconds(10)) }
                    let bound = try #require(port.withLock { $0 })
                    result = .success(try await body(collector, "http://127.0.0.1:\(bound)/sa"))
                } catch {
                    result = .failure(error)
                }
                await services.triggerGracefulShutdown()
                try await tasks.waitForAll()
                return try result.get()
            }
        }
    }

    /// `count` events from one app producer, one durable `track` each.
    static func produce(_ group: String, count: Int) async throws {
        let tracker = try Tracker(configuration: .init(groupDirectory: group))
        for i in 0..<count { try await tracker.track("Ordinary", properties: ["i": .int(Int64(i))]) }
    }

    /// An agent for `url` whose `--once` run is bounded by a 20 s deadline: a regression loops until it,
    /// and fails the test's counts instead of hanging it.
    static func agent(_ group: String, _ url: String, _ adjust: (inout AgentConfiguration) -> Void = { _ in }) throws
        -> Agent
    {
        var config = AgentConfiguration(groupDirectory: group, serverURL: url, outboxPath: group + "-state/outbox.sqlite")
        config.upload.backoff = Backoff(base: .milliseconds(5), cap: .milliseconds(40), maxRetryAfter: .milliseconds(50))
        config.upload.requestTimeout = .seconds(5)
        config.deadline = .seconds(20)
        adjust(&config)
        return try Agent(configuration: config, logger: UploadTests.logger)
    }

    @Test("a 2xx with a 100 KB body is an acknowledgement: the batch is sent once")
    func longAcknowledgement() async throws {
        try await withTemporaryGroup { group in
            try await Self.produce(group, count: 4)
            try await ScriptedCollector.withRunning(padding: 100_000, script: { _, _ in 200 }) { collector, url in
                let agent = try Self.agent(group, url)
                _ = try await agent.runOnce()
                #expect(collector.requests.withLock { $0 } == [4])
                #expect(try agent.outbox.pending().count == 0)
            }
        }
    }

    @Test("a 400 with a 100 KB body is a rejection: each event is refused alone and dead-lettered, the reason cut short")
    func longRejection() async throws {
        try await withTemporaryGroup { group in
            try await Self.produce(group, count: 4)
            try await ScriptedCollector.withRunning(padding: 100_000, script: { _, _ in 400 }) { collector, url in
                let agent = try Self.agent(group, url)
                _ = try await agent.runOnce()
                let letters = try agent.outbox.deadLetters()
                #expect(letters.map(\.seq) == [1, 2, 3, 4])
                #expect(letters.allSatisfy { $0.status == 400 && $0.reason.hasPrefix("HTTP 400: xxx") && $0.reason.count < 300 })
                #expect(try agent.outbox.pending().count == 0)
                // Every dead letter was refused on its own.
                #expect(collector.requests.withLock { $0 }.filter { $0 == 1 }.count == 4)
            }
        }
    }

    @Test("a refusal of a whole batch that does not recur dead-letters nothing")
    func refusalNotRecurring() async throws {
        try await withTemporaryGroup { group in
            try await Self.produce(group, count: 8)
            try await ScriptedCollector.withRunning(script: { request, _ in request == 1 ? 400 : 200 }) { collector, url in
                let agent = try Self.agent(group, url)
                _ = try await agent.runOnce()
                #expect(try agent.outbox.deadLetters().isEmpty)
                #expect(collector.delivered.withLock { $0 } == 8)
                // 8 refused; then the halves 4, 2, 1 accepted, and the last one sent alone.
                #expect(collector.requests.withLock { $0 } == [8, 4, 2, 1, 1])
            }
        }
    }

    @Test("a 413 while bisecting ends the bisection; smaller batches deliver everything")
    func tooLargeWhileBisecting() async throws {
        try await withTemporaryGroup { group in
            try await Self.produce(group, count: 8)
            let script: @Sendable (Int, Int) -> Int = { request, events in request == 1 ? 400 : events > 2 ? 413 : 200 }
            try await ScriptedCollector.withRunning(script: script) { collector, url in
                let agent = try Self.agent(group, url)
                _ = try await agent.runOnce()
                #expect(try agent.outbox.deadLetters().isEmpty)
                #expect(collector.delivered.withLock { $0 } == 8)
                #expect(collector.requests.withLock { $0 } == [8, 4, 2, 2, 2, 2])
            }
        }
    }

    @Test("after a 413 the batch size grows back no further than the size it halved to")
    func tooLargeCeiling() async throws {
        try await withTemporaryGroup { group in
            try await Self.produce(group, count: 1000)
            try await ScriptedCollector.withRunning(script: { _, events in events > 150 ? 413 : 200 }) { collector, url in
                let agent = try Self.agent(group, url)  // batches of 500
                _ = try await agent.runOnce()
                let requests = collector.requests.withLock { $0 }
                #expect(collector.delivered.withLock { $0 } == 1000)
                #expect(requests.filter { $0 > 150 } == [500, 250], "\(requests)")
                #expect(requests.count == 2 + 8)
            }
        }
    }
}
