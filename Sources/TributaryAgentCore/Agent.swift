import AsyncHTTPClient
import Foundation
import Logging
import ServiceLifecycle
import Synchronization
import TributaryStore

/// The sync agent: drains the group's shared store into the outbox, in order, and uploads batches to
/// the collector under the flush policies, until stopped (or, with `once`, until everything is sent).
///
/// Run it as a swift-service-lifecycle `Service` (graceful shutdown stops it cleanly after the step
/// in progress), or call ``runOnce()``.
public final class Agent: Service, Sendable {
    /// What a run did.
    public struct Report: Sendable, Equatable {
        public var drained = 0
        public var delivered = 0
        public var requests = 0
    }

    public let configuration: AgentConfiguration
    let store: SharedStore
    public let outbox: Outbox
    private let lock: GroupLock
    private let logger: Logger
    private let wakeup = Wakeup()
    private let flushRequested = Atomic<Bool>(false)
    private let stopRequested = Atomic<Bool>(false)

    /// Validates the configuration, opens (recovering) the store and the outbox, and claims the group.
    public init(configuration: AgentConfiguration, logger: Logger) throws {
        try configuration.validate()
        var configuration = configuration
        if let file = configuration.authTokenFile {
            configuration.upload.bearerToken = try Self.readToken(file)
        }
        self.configuration = configuration
        self.logger = logger
        store = try SharedStore(groupDirectory: configuration.groupDirectory)
        lock = try GroupLock(groupDirectory: store.groupDirectory)
        do {
            outbox = try Outbox(path: configuration.outboxPath)
        } catch {
            lock.release()
            throw AgentError(.startup, "Cannot open the outbox \(configuration.outboxPath): \(error).")
        }
    }

    static func readToken(_ path: String) throws -> String {
        guard let text = try? String(contentsOfFile: path, encoding: .utf8) else {
            throw AgentError(.configuration, "Cannot read the auth token file \(path).")
        }
        let token = text.trimmingCharacters(in: .whitespacesAndNewlines)
        guard !token.isEmpty, !token.contains(where: \.isNewline) else {
            throw AgentError(.configuration, "The auth token file \(path) must hold one non-empty line.")
        }
        return token
    }

    /// Asks the running loop to flush now (the "app entered background" moment).
    public func requestFlush() {
        flushRequested.store(true, ordering: .releasing)
        wakeup.signal()
    }

    /// Asks the running loop to stop after the step in progress.
    public func requestStop() {
        stopRequested.store(true, ordering: .releasing)
        wakeup.signal()
    }

    /// `Service`: runs until graceful shutdown (or, with `once`, until everything is sent).
    public func run() async throws {
        _ = try await withGracefulShutdownHandler {
            try await self.runLoop()
        } onGracefulShutdown: {
            self.requestStop()
        }
    }

    /// Drains and uploads everything there is, then returns.
    public func runOnce() async throws -> Report {
        return try await runLoop(once: true)
    }

    private func runLoop(once: Bool? = nil) async throws -> Report {
        let once = once ?? configuration.once
        let listener = try FlushListener(groupDirectory: store.groupDirectory) { [weak self] in self?.requestFlush() }
        let client = HTTPClientFactory.make(readTimeout: configuration.upload.requestTimeout)
        let session = UploadSession(outbox: outbox, client: client, configuration: configuration.upload, logger: logger)
        var loop = LoopState(clock: ContinuousClock(), interval: configuration.flushInterval)
        loop.flushing = once
        logger.info("agent started", metadata: [
            "tributary.group": "\(store.groupDirectory)", "tributary.outbox": "\(outbox.path)",
            "tributary.server": "\(configuration.upload.serverURL)", "tributary.format": "\(configuration.upload.format)",
        ])
        defer {
            listener.stop()
            writeStatus(session: session, state: "stopped", loop: loop)
            lock.release()
        }
        do {
            let report = try await loopBody(session: session, loop: &loop, once: once)
            try await client.shutdown()
            logger.info("agent stopped", metadata: [
                "tributary.drained": "\(report.drained)", "tributary.delivered": "\(report.delivered)",
            ])
            return report
        } catch {
            try? await client.shutdown()
            throw error
        }
    }

    private struct LoopState {
        let clock: ContinuousClock
        let interval: Duration
        var flushing = false
        var notBefore: ContinuousClock.Instant?
        var nextIntervalFlush: ContinuousClock.Instant
        var lastStatusWrite: ContinuousClock.Instant
        var lastUploadMillis: Int64?
        var state = "idle"
        var report = Report()
        var outboxFullLogged = false

        init(clock: ContinuousClock, interval: Duration) {
            self.clock = clock
            self.interval = interval
            nextIntervalFlush = clock.now.advanced(by: interval)
            lastStatusWrite = clock.now.advanced(by: .seconds(-10))
        }
    }

    private func loopBody(session: UploadSession, loop: inout LoopState, once: Bool) async throws -> Report {
        while !stopRequested.load(ordering: .acquiring) && !Task.isCancelled {
            let drained = try drainRespectingQuota(&loop)
            loop.report.drained += drained
            let pending = try outbox.pending().count
            let now = loop.clock.now

            if flushRequested.exchange(false, ordering: .acquiringAndReleasing) {
                loop.flushing = true
                loop.notBefore = nil  // a flush request retries at once, as the iOS SDK does
            }
            if pending >= configuration.bulkSize || (pending > 0 && now >= loop.nextIntervalFlush) {
                loop.flushing = true
            }
            if now >= loop.nextIntervalFlush { loop.nextIntervalFlush = now.advanced(by: loop.interval) }

            var progressed = drained > 0
            if loop.flushing && pending > 0 && (loop.notBefore.map { now >= $0 } ?? true) {
                loop.state = "uploading"
                let step = try await session.step()
                loop.report.requests += 1
                switch step {
                case .empty:
                    loop.flushing = once
                case .progressed(let delivered):
                    loop.report.delivered += delivered
                    if delivered > 0 { loop.lastUploadMillis = BootClock.wallMillis() }
                    loop.notBefore = nil
                    progressed = true
                case .wait(let delay):
                    loop.notBefore = loop.clock.now.advanced(by: delay)
                    if let reason = session.haltReason {
                        loop.state = "halted"
                        if once {
                            throw AgentError(.halted, "The collector refuses uploads (\(reason)); every event is kept.")
                        }
                        if let file = configuration.authTokenFile, let token = try? Self.readToken(file) {
                            session.updateToken(token)
                        }
                    } else {
                        loop.state = "backoff"
                    }
                }
            } else if pending == 0 {
                loop.state = "idle"
                if loop.flushing && !once { loop.flushing = false }
            }

            if loop.clock.now - loop.lastStatusWrite >= .seconds(1) {
                writeStatus(session: session, state: loop.state, loop: loop)
                loop.lastStatusWrite = loop.clock.now
            }
            if once && pending == 0 && drained == 0, try store.status().pendingEvents == 0 {
                break
            }
            if progressed { continue }
            var timeout = configuration.pollInterval
            if let notBefore = loop.notBefore, loop.flushing { timeout = min(timeout, max(.zero, notBefore - loop.clock.now)) }
            await wakeup.wait(timeout: max(timeout, .milliseconds(1)))
        }
        return loop.report
    }

    /// Drains what the store holds, unless the outbox is at its quota.
    private func drainRespectingQuota(_ loop: inout LoopState) throws -> Int {
        let bytes = try outbox.pending().bytes
        if bytes >= configuration.outboxQuotaBytes {
            if !loop.outboxFullLogged {
                logger.warning("outbox at its quota; draining paused until uploads make room", metadata: [
                    "tributary.outbox.bytes": "\(bytes)", "tributary.outbox.quota": "\(configuration.outboxQuotaBytes)",
                ])
                loop.outboxFullLogged = true
            }
            return 0
        }
        loop.outboxFullLogged = false
        let drainer = Drainer(store: store, outbox: outbox, chunkSize: configuration.drainChunk, logger: logger)
        return try drainer.drainAvailable(maxEvents: configuration.drainChunk * 10)
    }

    private func writeStatus(session: UploadSession, state: String, loop: LoopState) {
        do {
            let counters = try outbox.counters()
            let status = AgentStatus(
                pid: getpid(), state: state, haltReason: session.haltReason, lastError: session.lastError,
                outboxPath: outbox.path, outboxPending: try outbox.pending().count, delivered: counters.delivered,
                deadLetters: counters.deadLetters, batches: counters.batches, retries: counters.retries,
                corruptRecords: counters.corruptRecords, lastUploadMillis: loop.lastUploadMillis,
                updatedMillis: BootClock.wallMillis())
            try status.write(groupDirectory: store.groupDirectory)
        } catch {
            logger.warning("could not write the status file", metadata: ["tributary.reason": "\(error)"])
        }
    }
}
