import AsyncHTTPClient
import Foundation
import GRDB
import Logging
import ServiceLifecycle
import Synchronization
import TributaryStore

/// The sync agent: drains the group's shared store into the outbox, in order, and uploads batches to
/// the collector under the flush policies, until stopped (or, with `once`, until everything stored
/// when it started is sent).
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
    let lock: AgentLock
    let outboxLock: AgentLock
    let logger: Logger
    let wakeup: Wakeup
    /// A flush asked for, a stop asked for, the run started. In a class of their own: with these
    /// `Atomic`s (noncopyable) stored in `Agent` itself, Swift 6.3.1's release build crashed on this
    /// throwing init ("Found ownership error" in CopyPropagation, destroying a partly built agent).
    let flags = RunFlags()
    let budget: BudgetSlot
    let heartbeat = Heartbeat()
    /// The loop's parks between turns, for tests that move a ``ManualClock`` (``LoopParking``).
    let parking = LoopParking()
    let lastStatus = LastStatus()
    /// The events of a delivered batch whose rows are still in the outbox (the upload session's).
    let unsettledEvents = UnsettledEvents()
    let notifier = SystemdNotifier()
    let metrics = AgentMetrics()
    /// The drain's store deletes, on a thread of their own: a producer stopped inside its write
    /// transaction pauses the drain instead of holding the loop.
    let deletes: StoreDeletes

    /// The damaged store this agent moved aside at its start, and why (``StoreCheck``), if it did.
    let damagedStore: (directory: String, reason: String)?

    /// When this agent was created: ``AgentConfiguration/deadline`` counts from here, so the time its
    /// creation took (opening the store, migrating the outbox) is part of the run's budget.
    let createdAt: ContinuousClock.Instant

    /// Validates the configuration, opens (recovering) the store and the outbox, and claims the group.
    public init(configuration: AgentConfiguration, logger: Logger) throws {
        try configuration.validate()
        var configuration = configuration
        if let file = configuration.authTokenFile {
            configuration.upload.bearerToken = try Self.readToken(file)
        }
        // Bad PEM files, a key without its certificate or not its key, a bad pin or proxy: exit 78 before
        // anything is sent.
        configuration.upload.loadedTLS = try configuration.upload.tls.loaded()
        try configuration.upload.proxy.validate()
        self.configuration = configuration
        self.logger = logger
        createdAt = configuration.clock.now
        budget = BudgetSlot(clock: configuration.clock)
        let wakeup = Wakeup(clock: configuration.clock)
        self.wakeup = wakeup
        // A delete the drain stopped waiting for wakes the loop when it ends: draining goes on at once.
        let fatalIO = FatalIO.Latch()
        deletes = StoreDeletes(logger: logger, fatalIO: fatalIO, onFinished: { wakeup.signal() })
        let storeFile = configuration.groupDirectory + "/" + SharedStore.fileName
        let storeExisted = access(storeFile, F_OK) == 0
        // A store already there is walked by a child first, holding the group's lock (no other agent moves
        // it meanwhile): a damaged one crashed this process at every start.
        let earlyLock = storeExisted && configuration.storeWalker != nil ? try AgentLock.group(configuration.groupDirectory) : nil
        do {
            damagedStore = try earlyLock.flatMap { _ in try Self.setAsideIfDamaged(configuration, logger: logger) }
            store = try SharedStore(groupDirectory: configuration.groupDirectory)
        } catch {
            earlyLock?.release()
            throw error
        }
        if !storeExisted {
            // Intended when the agent starts before the app; a mistyped --group looks the same, and the
            // agent would wait on it for ever, quietly.
            logger.notice(
                "no shared store in the group directory: created an empty one, which producers will fill (check --group if events were expected here)",
                metadata: ["tributary.group": "\(store.groupDirectory)"])
        }
        lock = try earlyLock ?? AgentLock.group(store.groupDirectory)
        do {
            outboxLock = try AgentLock.outbox(configuration.outboxPath, groupDirectory: store.groupDirectory)
        } catch {
            lock.release()
            throw error
        }
        do {
            // Before READY=1: a long migration would otherwise meet systemd's start timeout, every start.
            outbox = try Outbox(path: configuration.outboxPath, fatalIO: fatalIO) { migrate in
                try SystemdNotifier().extendingStart(status: "migrating the outbox \(configuration.outboxPath)", migrate)
            }
            if let previous = try outbox.adoptStore(store.storeID) {
                logger.warning(
                    "the shared store is not the one this outbox drained before: it was created anew; draining it from its first event",
                    metadata: [
                        "tributary.group": "\(store.groupDirectory)", "tributary.store_id": "\(store.storeID)",
                        "tributary.previous_store_id": "\(previous.previousStoreID)",
                        "tributary.previous_last_drained_seq": "\(previous.lastDrainedSeq)",
                    ])
            }
        } catch {
            // An I/O error opening, migrating or recounting the outbox is fail-stop as in the loop (the
            // outbox, when it opened, stays open: closing it would checkpoint the WAL that just failed).
            outboxLock.release()
            lock.release()
            if FatalIO.matches(error) { throw fatalIO.trip(error) }
            // An AgentError says itself (another program's database: a configuration error, 78).
            if error is AgentError { throw error }
            throw AgentError(.startup, "Cannot open the outbox \(configuration.outboxPath): \(error).")
        }
        do {
            try checkDrainPosition()
        } catch {
            // A store error keeps its own code (and exit code); an outbox I/O error is fail-stop; any
            // other outbox error (a full disk, the outbox busy past its timeout) is an outbox error (74),
            // not an internal one.
            outboxLock.release()
            lock.release()
            if FatalIO.matches(error) { throw fatalIO.trip(error, keeping: outbox) }
            if error is StoreError || error is AgentError { throw error }
            throw AgentError(.outboxIO, "Cannot check the drain position in the outbox \(configuration.outboxPath): \(error).")
        }
        if damagedStore != nil { metrics.damagedStores.increment() }
    }

    /// Checks, at the start, where the drain goes on: the outbox that drained the group last, and the
    /// store's numbering against the outbox's position (``Outbox/reconcile(lastAssignedSeq:oldestSeq:identityAt:)``).
    func checkDrainPosition() throws {
        if let last = AgentChannel.readStatus(groupDirectory: store.groupDirectory)?.outboxPath, last != outbox.path {
            // A manual run with an outbox of its own, then the service's: what the first drained and did
            // not deliver is in its outbox, which this agent never reads.
            logger.warning(
                "the last agent to drain this group used another outbox: events it drained and did not deliver, if any, wait there; `tributary-agent --group \(store.groupDirectory) --outbox \(last) --once` sends them",
                metadata: ["tributary.group": "\(store.groupDirectory)", "tributary.other_outbox": "\(last)"])
        }
        let status = try store.status()
        let rewound = try outbox.reconcile(
            lastAssignedSeq: status.lastAssignedSeq, oldestSeq: status.oldestSeq
        ) { seq in
            try store.rawEvent(seq: seq).map(Outbox.recordIdentity)
        }
        if let rewound {
            logger.warning(
                "the shared store is an earlier copy of the one this outbox drained (restored from a backup or a snapshot?): it numbers new events with seqs drained before; draining all it holds again (events delivered before go again, and the collector drops them as duplicates)",
                metadata: [
                    "tributary.group": "\(store.groupDirectory)", "tributary.last_drained_seq": "\(rewound.before)",
                    "tributary.draining_after": "\(rewound.after)",
                ])
        }
    }

    static func readToken(_ path: String) throws -> String {
        let text: String
        do {
            text = try String(contentsOfFile: path, encoding: .utf8)
        } catch {
            // Why: missing, not this user's to read, a directory, not UTF-8.
            var info = stat()
            let reason: String
            if stat(path, &info) != 0 || access(path, R_OK) != 0 {
                reason = String(cString: strerror(errno))
            } else if info.st_mode & S_IFMT == S_IFDIR {
                reason = "it is a directory"
            } else {
                reason = "it could not be read as UTF-8 text (\(error.localizedDescription))"
            }
            throw AgentError(.configuration, "Cannot read the auth token file \(path): \(reason).")
        }
        let token = text.trimmingCharacters(in: .whitespacesAndNewlines)
        guard !token.isEmpty, !token.contains(where: \.isNewline) else {
            throw AgentError(.configuration, "The auth token file \(path) must hold one non-empty line.")
        }
        // The HTTP client refuses a header value with a control character or a non-ASCII byte on every
        // request, which looked like a transport error to retry for ever.
        guard token.utf8.allSatisfy({ (0x20...0x7E).contains($0) }) else {
            throw AgentError(
                .configuration,
                "The token in \(path) holds a control character or a non-ASCII byte, which an HTTP header cannot "
                    + "carry; a bearer token is printable ASCII.")
        }
        return token
    }

    /// Whether a stop has been asked for.
    var isStopping: Bool { flags.stopping.load(ordering: .acquiring) }

    /// Whether a flush was asked for since the last call (it takes the request).
    func takeFlushRequest() -> Bool { flags.flushRequested.exchange(false, ordering: .acquiringAndReleasing) }

    /// Marks the agent as started; false when it had been already (an agent runs once).
    func markStarted() -> Bool { !flags.started.exchange(true, ordering: .acquiringAndReleasing) }

    /// Asks the running loop to flush now (the "app entered background" moment). The flush gets its
    /// own budget (``AgentConfiguration/backgroundBudget``) to upload everything it can.
    public func requestFlush() {
        flags.flushRequested.store(true, ordering: .releasing)
        wakeup.signal()
    }

    /// Starts a clean stop: the agent keeps uploading for at most ``AgentConfiguration/stopTimeout``
    /// (less the grace period), then stops claiming work and returns. Idempotent.
    public func requestStop() {
        let started = budget.update { budget -> Bool in
            guard !flags.stopping.exchange(true, ordering: .acquiringAndReleasing) else { return false }
            let stop = BackgroundTask(
                budget: configuration.stopTimeout, grace: configuration.grace, reason: .stop, start: configuration.clock.now)
            if budget == nil || stop.expiresAt < budget!.expiresAt { budget = stop }
            return true
        }
        if started {
            notifier.stopping(extendBy: configuration.stopTimeout + .seconds(1))
            logger.info("stop requested; finishing within the stop timeout", metadata: [
                "tributary.stop_timeout_s": "\(configuration.stopTimeout.seconds)",
            ])
        }
        wakeup.signal()
    }

    /// `Service`: runs until graceful shutdown (SIGTERM starts the stop budget), or with `once` until
    /// everything is sent or the deadline expires.
    public func run() async throws {
        _ = try await withGracefulShutdownHandler {
            try await self.runLoop(once: self.configuration.once)
        } onGracefulShutdown: {
            self.requestStop()
        }
    }

    /// Drains and uploads everything stored when it starts (within ``AgentConfiguration/deadline`` if
    /// set), then returns.
    public func runOnce() async throws -> Report {
        try await runLoop(once: true)
    }
}
