import ArgumentParser
import Foundation
import Logging
import ServiceLifecycle
import Synchronization
import TributaryAgentCore
import TributaryStore
import TributaryWire
import UnixSignals
import TributaryErrors
import TributaryExitStatus

struct AgentCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "tributary-agent",
        abstract: "Drain an app group's shared store, in order, and upload gzip batches to a collector.",
        discussion: """
            Runs until SIGTERM or SIGINT (a systemd service), or with --once drains and uploads \
            everything stored when it starts and exits. Events move store → outbox (SQLite, private to the agent) → \
            collector; nothing is dropped: rejected events go to the outbox's dead-letter table \
            (see `tributary dead-letters`).

            The app may set the group's server_url, format, flush_bulk_size and flush_interval_seconds \
            (`tributary config`, or SharedStore.setAgentSettings): each applies, within a poll interval, \
            where its option (--server, --format, --bulk-size, --flush-interval) is not given, nor \
            TRIBUTARY_SERVER or TRIBUTARY_FORMAT set in the environment; the format only with the group's \
            server_url.

            Exit codes: 0 success; 64 bad usage; 69 another agent is draining the group; 70 internal \
            error; 74 I/O error on the store or outbox (a full disk too); 75 the group's store was \
            deleted or created anew while running (a restart drains the new one); 77 the group directory is \
            world-writable, or the agent's user may not use it (permission denied: join the group that owns it); \
            78 configuration error (a --ca-file, --ca-file-append, --client-cert or --client-key that cannot be read or is \
            not PEM, a key without its certificate or not its key, a --pin-sha256 that is not a base64 SHA-256, \
            --metrics-address not servable, --outbox used by another agent, with hard links, locked by another \
            process, or not an outbox, \
            an agent.sock that is not a socket, a --group that \
            is not a directory, --once with events and no collector URL, a store written by a newer Tributary, \
            too), or in --once mode the collector refuses uploads (401/403/404, a TLS problem: untrusted, expired or \
            wrong-name certificate, pin mismatch, client certificate refused; or event after event: \
            --halt-after-dead-letters) or dead letters fill the outbox quota; 130 or 143 a second SIGINT or \
            SIGTERM ended it at once. Before it opens the store, the agent walks its pages in a child process; \
            a damaged store is moved aside whole into damaged-store-<time>/ in the group directory and a new one \
            made (logged as critical, and said by tributary status).
            """
    )

    @Option(help: ArgumentHelp("The app group directory.", valueName: "dir"))
    var group: String

    @Option(help: ArgumentHelp(
        """
            Collector URL the batches are POSTed to (default: $TRIBUTARY_SERVER, else the group's server_url, \
            set by the app; until there is one, events wait).
            """,
        valueName: "url"))
    var server: String?

    @Option(help: """
        Wire format: sensors (form, base64 gzip JSON array) or ndjson (gzip NDJSON) (default: $TRIBUTARY_FORMAT, \
        else the group's format while the server is the group's, else sensors).
        """)
    var format: WireFormat?

    @Option(help: ArgumentHelp(
        """
        The outbox file (default: $STATE_DIRECTORY/outbox.sqlite, else \
        $XDG_STATE_HOME/tributary/<group>-<hash>/outbox.sqlite, ~/.local/state for an unset $XDG_STATE_HOME).
        """,
        valueName: "path"))
    var outbox: String?

    @Flag(help: "Drain and upload everything stored when it starts, then exit (the background-fetch run a timer starts).")
    var once = false

    @Option(parsing: .unconditional, help: "With --once: exit 0 within this many seconds, whether or not the backlog is empty.")
    var deadline: Double?

    @Option(name: .customLong("stop-timeout"), parsing: .unconditional, help: "After SIGTERM, finish within this many seconds (keep it under systemd's TimeoutStopSec).")
    var stopTimeout: Double = 80

    @Option(parsing: .unconditional, help: "Stop claiming work this many seconds before a deadline.")
    var grace: Double = 1

    @Option(name: .customLong("background-budget"), parsing: .unconditional, help: "Seconds a flush request (app entered background) may spend uploading.")
    var backgroundBudget: Double = 30

    @Option(name: .customLong("metrics-address"), help: ArgumentHelp("Serve Prometheus metrics at http://HOST:PORT/metrics.", valueName: "host:port"))
    var metricsAddress: String?

    @Option(name: .customLong("bulk-size"), parsing: .unconditional, help: "Upload as soon as this many events are pending (default 100).")
    var bulkSize: Int?

    @Option(name: .customLong("flush-interval"), parsing: .unconditional, help: "Upload pending events at least this often, in seconds (default 15).")
    var flushInterval: Double?

    @Option(name: .customLong("batch-size"), parsing: .unconditional, help: "Most events per request.")
    var batchSize = 500

    @Option(name: .customLong("max-batch-bytes"), parsing: .unconditional, help: "Most uncompressed event bytes per request.")
    var maxBatchBytes = 1 << 20

    @Option(
        name: .customLong("drain-ahead"), parsing: .unconditional,
        help: """
            While the collector accepts uploads, pause the drain once the outbox holds this many events \
            (at least 2 × --batch-size); while uploads fail, drain on up to the outbox quota.
            """)
    var drainAhead = 20_000

    @Option(
        name: .customLong("drain-share"), parsing: .unconditional,
        help: """
            While producers are committing, the share of the time the agent's disk work may take \
            (0 < share ≤ 1): after each turn it rests 1/share − 1 times as long as its drains and \
            checkpoint took, so that their track() calls seldom wait behind its commits. 1: never rest \
            (--once never does). Full speed again a second after their last commit, or while they \
            append faster than the paced drain could keep up with.
            """)
    var drainShare = 0.05

    @Option(
        name: .customLong("gzip-level"), parsing: .unconditional,
        help: "gzip level of request bodies, 1 (fastest, the default; bodies ~1.2× those of level 6) … 9 (smallest).")
    var gzipLevel: Int32 = 1

    @Option(
        name: .customLong("halt-after-dead-letters"), parsing: .unconditional,
        help: """
            Halt uploads once this many events in a row were refused and dead-lettered (a collector that \
            refuses everything would otherwise dead-letter the whole backlog); 0: never halt.
            """)
    var haltAfterDeadLetters = 10

    @Option(name: .customLong("backoff-base"), parsing: .unconditional, help: "Retry backoff: first ceiling, in seconds (full jitter).")
    var backoffBase: Double = 1

    @Option(name: .customLong("backoff-cap"), parsing: .unconditional, help: "Retry backoff: largest ceiling, in seconds.")
    var backoffCap: Double = 60

    @Option(name: .customLong("max-retry-after"), parsing: .unconditional, help: "Longest Retry-After honoured, in seconds.")
    var maxRetryAfter: Double = 300

    @Option(name: .customLong("request-timeout"), parsing: .unconditional, help: "Longest one upload request may take, in seconds.")
    var requestTimeout: Double = 30

    @Option(name: .customLong("auth-token-file"), help: ArgumentHelp("File with a bearer token for the collector.", valueName: "path"))
    var authTokenFile: String?

    @OptionGroup(title: "TLS and proxies")
    var network: NetworkOptions

    @Option(name: .customLong("log-level"), help: "trace, debug, info, notice, warning, error or critical.")
    var logLevel: String = "info"

    func validate() throws {
        for (option, value) in [
            ("--bulk-size", bulkSize ?? 1), ("--batch-size", batchSize), ("--max-batch-bytes", maxBatchBytes),
            ("--drain-ahead", drainAhead),
        ] where value <= 0 {
            throw ValidationError("\(option) must be positive; got \(value).")
        }
        guard haltAfterDeadLetters >= 0 else {
            throw ValidationError("--halt-after-dead-letters must be 0 or more; got \(haltAfterDeadLetters).")
        }
        guard (1...9).contains(gzipLevel) else { throw ValidationError("--gzip-level must be 1 … 9.") }
        guard drainShare > 0 && drainShare <= 1 else {
            throw ValidationError("--drain-share must be above 0 and at most 1; got \(drainShare).")
        }
        if format == nil, let text = Self.environment("TRIBUTARY_FORMAT"), WireFormat(rawValue: text) == nil {
            throw ValidationError("TRIBUTARY_FORMAT must be sensors or ndjson, not '\(text)'.")
        }
        // A bad URL is a bad option (64) from the flag as from the environment, not a configuration
        // error found once the agent starts (78).
        if let (source, text) = server.map({ ("--server", $0) }) ?? Self.environment("TRIBUTARY_SERVER").map({ ("TRIBUTARY_SERVER", $0) }) {
            do throws(StoreError) {
                try AgentSettings.validateServerURL(text)
            } catch {
                throw ValidationError("\(source) must be an http:// or https:// URL with a host and a port of 1 … 65535 (if any), not '\(text)'.")
            }
        }
        for (flag, seconds, zeroAllowed) in durationOptions {
            try Self.validateSeconds(seconds, flag: flag, zeroAllowed: zeroAllowed)
        }
        guard backoffCap >= backoffBase else { throw ValidationError("--backoff-cap must be at least --backoff-base.") }
        if deadline != nil && !once { throw ValidationError("--deadline needs --once (a daemon's deadline is --stop-timeout).") }
        if let metricsAddress, MetricsEndpoint.parse(metricsAddress) == nil {
            throw ValidationError("--metrics-address must be HOST:PORT, e.g. 127.0.0.1:9464.")
        }
        guard Logger.Level(rawValue: logLevel) != nil else {
            throw ValidationError("--log-level must be one of trace, debug, info, notice, warning, error, critical.")
        }
    }

    /// An environment variable's value; nil when it is unset or empty (systemd's `VAR=` in an
    /// environment file).
    static func environment(_ name: String) -> String? {
        ProcessInfo.processInfo.environment[name].flatMap { $0.isEmpty ? nil : $0 }
    }

    /// Every option given in seconds: its flag, its value, and whether 0 means something.
    private var durationOptions: [(flag: String, seconds: Double?, zeroAllowed: Bool)] {
        [
            ("--deadline", deadline, false), ("--stop-timeout", stopTimeout, false), ("--grace", grace, true),
            ("--background-budget", backgroundBudget, false), ("--flush-interval", flushInterval, false),
            ("--backoff-base", backoffBase, false), ("--backoff-cap", backoffCap, false),
            ("--max-retry-after", maxRetryAfter, true), ("--request-timeout", requestTimeout, false),
        ]
    }

    /// The longest duration any option takes: a year. Longer ones mean nothing to a sync agent, and
    /// a value past what `Duration` holds (`inf`, `1e300`) would trap instead of being refused.
    static let longestSeconds: Double = 365 * 86_400

    static func validateSeconds(_ seconds: Double?, flag: String, zeroAllowed: Bool) throws {
        guard let seconds else { return }
        guard seconds.isFinite, seconds <= longestSeconds else {
            throw ValidationError("\(flag) must be a number of seconds up to \(Int(longestSeconds)) (a year); got \(seconds).")
        }
        // Below a millisecond a positive value becomes a zero Duration, which the agent's own check then
        // refused as a configuration error (78) instead of a bad option.
        guard zeroAllowed && seconds == 0 || seconds >= 0.001 else {
            throw ValidationError(
                "\(flag) must be \(zeroAllowed ? "0, or " : "")at least 0.001 seconds (a millisecond); got \(seconds).")
        }
    }

    func run() async throws {
        // Trapped first: a SIGTERM or SIGINT that comes while the agent opens its store and outbox (a slow
        // disk, an outbox migration, systemd stopping a unit still starting) waits for the agent's run, which
        // then stops as it would have a moment later, instead of killing it with the signal's default action.
        // A second one exits at once (below).
        let stopSignals = await UnixSignalsSequence(trapping: .sigterm, .sigint)
        let level = Logger.Level(rawValue: logLevel) ?? .info
        if metricsAddress != nil { MetricsEndpoint.bootstrap() }
        let journal = JournalLogHandler.stderrIsJournal()
        LoggingSystem.bootstrap { label in
            if journal {
                var handler = JournalLogHandler(label: label)
                handler.logLevel = level
                return handler
            }
            var handler = StreamLogHandler.standardError(label: label)
            handler.logLevel = level
            return handler
        }
        let logger = Logger(label: "tributary-agent")
        if !GlobalExecutor.moved.load(ordering: .relaxed) {
            logger.notice("Swift's tasks stay on libdispatch (its global-executor hook was taken): an idle agent wakes once a second")
        }
        let stops = StopSignals()
        let forwarding = stops.forward(stopSignals, logger: logger)
        defer { forwarding.cancel() }

        // The systemd units' environment files set these; an option given on the command line wins.
        let server = self.server ?? Self.environment("TRIBUTARY_SERVER")
        let format = self.format ?? Self.environment("TRIBUTARY_FORMAT").flatMap(WireFormat.init(rawValue:))
        // Absolute: the status file tells `tributary dead-letters --group` where the outbox is, from any
        // working directory, and the outbox's lock is taken by this path.
        let outboxPath = outbox.map { URL(fileURLWithPath: $0).standardizedFileURL.path }
        var config = AgentConfiguration(groupDirectory: group, serverURL: server, outboxPath: outboxPath)
        // Before the store is opened, this binary walks it in a child of its own (StoreCheck).
        config.storeWalker = [resolvedPath("/proc/self/exe") ?? CommandLine.arguments[0]]
        // What the command line and the environment leave out, the group's settings (written by the app) may set.
        if server == nil { config.settingsFromGroup.insert(.serverURL) }
        if format == nil { config.settingsFromGroup.insert(.format) }
        if bulkSize == nil { config.settingsFromGroup.insert(.flushBulkSize) }
        if flushInterval == nil { config.settingsFromGroup.insert(.flushIntervalSeconds) }
        config.upload.format = format ?? config.upload.format
        config.upload.batchSize = batchSize
        config.upload.haltAfterDeadLetters = haltAfterDeadLetters
        config.upload.maxBatchBytes = maxBatchBytes
        config.upload.gzipLevel = gzipLevel
        config.drainAhead = drainAhead
        config.drainShare = drainShare
        config.upload.backoff = Backoff(
            base: .seconds(backoffBase), cap: .seconds(backoffCap), maxRetryAfter: .seconds(maxRetryAfter))
        config.upload.requestTimeout = .seconds(requestTimeout)
        config.bulkSize = bulkSize ?? config.bulkSize
        config.flushInterval = flushInterval.map { .seconds($0) } ?? config.flushInterval
        config.once = once
        config.authTokenFile = authTokenFile
        network.apply(to: &config.upload)
        config.deadline = deadline.map { .seconds($0) }
        config.stopTimeout = .seconds(stopTimeout)
        config.grace = .seconds(grace)
        config.backgroundBudget = .seconds(backgroundBudget)
        let metrics = metricsAddress.flatMap(MetricsEndpoint.parse).map { MetricsEndpoint(host: $0.host, port: $0.port, logger: logger) }

        do {
            // Opened on a thread of its own: opening the store and the outbox blocks (a slow disk, a migration,
            // a new store behind a stopped writer's lock), and the signals are handled on the task pool.
            let configuration = config
            let agent = try await withCheckedThrowingContinuation { continuation in
                Thread.detachNewThread {
                    continuation.resume(with: Result { try Agent(configuration: configuration, logger: logger) })
                }
            }
            // The agent's own run ends the group; the metrics endpoint stops with it. A group shuts its
            // services down last first, one after the other: the agent is last, so a SIGTERM reaches it at
            // once. First, the agent's stop budget waited for the metrics server, whose shutdown waits for
            // every response it is writing: a scraper that stopped reading held the agent past it.
            var services: [ServiceGroupConfiguration.ServiceConfiguration] = []
            if let metrics { services.append(.init(service: metrics.service)) }
            services.append(
                .init(service: agent, successTerminationBehavior: .gracefullyShutdownGroup,
                      failureTerminationBehavior: .gracefullyShutdownGroup))
            let group = ServiceGroup(configuration: .init(services: services, logger: logger))
            await stops.attach(group)
            try await group.run()
        } catch {
            switch error {
            case let error as AgentError: logger.critical("\(error.message)")
            case let error as StoreError: logger.critical("\(error)")
            default: logger.critical("internal error: \(error)")
            }
            throw ExitCode(ExitStatus.of(error, as: .service).rawValue)
        }
    }
}

extension WireFormat: ExpressibleByArgument {}

/// SIGTERM and SIGINT from the agent's first step on. The first asks the service group to stop, gracefully;
/// one that comes before the group exists (the agent still opening its store and outbox) is kept for it,
/// and the group then starts its services and stops them. The second ends the process at once (a start
/// that hangs, an impatient Ctrl-C): the store and the outbox are crash-safe, and nothing is lost.
private final class StopSignals: Sendable {
    private let state = Mutex<(group: ServiceGroup?, requested: Bool)>((nil, false))

    /// Handles `signals` until the returned task is cancelled.
    func forward(_ signals: UnixSignalsSequence, logger: Logger) -> Task<Void, Never> {
        Task {
            for await signal in signals {
                let (group, again) = state.withLock { state in
                    defer { state.requested = true }
                    return (state.group, state.requested)
                }
                if again {
                    logger.warning("\(signal) again: exiting at once; every event is kept in the store or the outbox")
                    _exit(128 + signal.rawValue)
                }
                logger.notice("\(signal): stopping (another SIGTERM or SIGINT exits at once)")
                await group?.triggerGracefulShutdown()
            }
        }
    }

    /// Hands `group` the stop requests from now on, and the one that came before, if any.
    func attach(_ group: ServiceGroup) async {
        let requested = state.withLock { state in
            state.group = group
            return state.requested
        }
        if requested { await group.triggerGracefulShutdown() }
    }
}

/// The entry point: descriptors 0–2 taken first (``StandardDescriptors``), then the command.
@main
enum AgentCommandMain {
    static func main() async {
        StandardDescriptors.takeClosed()
        StoreCheck.walkerMain(Array(CommandLine.arguments.dropFirst()))  // a child walking a store: exits here
        // Swift's tasks run on SwiftNIO's event loops, not libdispatch's global queues, whose first worker
        // thread starts a monitor that wakes the process once a second for ever (GlobalExecutor). Should a
        // hook be set already, the tasks stay on libdispatch: the agent works the same, and wakes more.
        GlobalExecutor.moveToEventLoops()
        // Before any other thread allocates: an arena a thread already has stays its own. (Run after the
        // command's first `await`, the pool's threads had arenas of their own, each keeping a drain
        // chunk's buffer resident: peak anon 31 MiB instead of 21 at a 1,000,000-event backlog.)
        MallocPolicy.reuseLargeBuffers(singleArena: true)
        await AgentCommand.main(CommandLineArguments.helpFirst(Array(CommandLine.arguments.dropFirst())))
    }
}
