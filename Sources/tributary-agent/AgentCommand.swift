import ArgumentParser
import Foundation
import Logging
import ServiceLifecycle
import TributaryAgentCore
import TributaryStore
import TributaryWire

@main
struct AgentCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "tributary-agent",
        abstract: "Drain an app group's shared store, in order, and upload gzip batches to a collector.",
        discussion: """
            Runs until SIGTERM or SIGINT (a systemd service), or with --once drains and uploads \
            everything there is and exits. Events move store → outbox (SQLite, private to the agent) → \
            collector; nothing is dropped: rejected events go to the outbox's dead-letter table \
            (see `tributary dead-letters`).

            Exit codes: 0 success; 64 bad usage; 69 another agent is draining the group; 74 I/O error \
            on the store or outbox; 78 configuration error, or in --once mode the collector refuses \
            uploads (401/403/404).
            """
    )

    @Option(help: ArgumentHelp("The app group directory.", valueName: "dir"))
    var group: String

    @Option(help: ArgumentHelp("Collector URL the batches are POSTed to.", valueName: "url"))
    var server: String

    @Option(help: "Wire format: sensors (form, base64 gzip JSON array) or ndjson (gzip NDJSON).")
    var format: WireFormat = .sensors

    @Option(help: ArgumentHelp("The outbox file (default: $STATE_DIRECTORY/outbox.sqlite, else under ~/.local/state/tributary).", valueName: "path"))
    var outbox: String?

    @Flag(help: "Drain and upload everything there is, then exit.")
    var once = false

    @Option(name: .customLong("bulk-size"), help: "Upload as soon as this many events are pending.")
    var bulkSize = 100

    @Option(name: .customLong("flush-interval"), help: "Upload pending events at least this often, in seconds.")
    var flushInterval: Double = 15

    @Option(name: .customLong("batch-size"), help: "Most events per request.")
    var batchSize = 500

    @Option(name: .customLong("max-batch-bytes"), help: "Most uncompressed event bytes per request.")
    var maxBatchBytes = 1 << 20

    @Option(name: .customLong("backoff-base"), help: "Retry backoff: first ceiling, in seconds (full jitter).")
    var backoffBase: Double = 1

    @Option(name: .customLong("backoff-cap"), help: "Retry backoff: largest ceiling, in seconds.")
    var backoffCap: Double = 60

    @Option(name: .customLong("max-retry-after"), help: "Longest Retry-After honoured, in seconds.")
    var maxRetryAfter: Double = 300

    @Option(name: .customLong("request-timeout"), help: "Longest one upload request may take, in seconds.")
    var requestTimeout: Double = 30

    @Option(name: .customLong("auth-token-file"), help: ArgumentHelp("File with a bearer token for the collector.", valueName: "path"))
    var authTokenFile: String?

    @Option(name: .customLong("log-level"), help: "trace, debug, info, notice, warning, error or critical.")
    var logLevel: String = "info"

    func validate() throws {
        guard bulkSize > 0, batchSize > 0, maxBatchBytes > 0 else {
            throw ValidationError("--bulk-size, --batch-size and --max-batch-bytes must be positive.")
        }
        guard flushInterval > 0, backoffBase > 0, backoffCap >= backoffBase, maxRetryAfter >= 0, requestTimeout > 0 else {
            throw ValidationError("--flush-interval, --backoff-base and --request-timeout must be positive, and --backoff-cap ≥ --backoff-base.")
        }
        guard Logger.Level(rawValue: logLevel) != nil else {
            throw ValidationError("--log-level must be one of trace, debug, info, notice, warning, error, critical.")
        }
    }

    func run() async throws {
        let level = Logger.Level(rawValue: logLevel) ?? .info
        LoggingSystem.bootstrap { label in
            var handler = StreamLogHandler.standardError(label: label)
            handler.logLevel = level
            return handler
        }
        let logger = Logger(label: "tributary-agent")

        var config = AgentConfiguration(groupDirectory: group, serverURL: server, outboxPath: outbox)
        config.upload.format = format
        config.upload.batchSize = batchSize
        config.upload.maxBatchBytes = maxBatchBytes
        config.upload.backoff = Backoff(
            base: .seconds(backoffBase), cap: .seconds(backoffCap), maxRetryAfter: .seconds(maxRetryAfter))
        config.upload.requestTimeout = .seconds(requestTimeout)
        config.bulkSize = bulkSize
        config.flushInterval = .seconds(flushInterval)
        config.once = once
        config.authTokenFile = authTokenFile

        do {
            let agent = try Agent(configuration: config, logger: logger)
            if once {
                _ = try await agent.runOnce()
            } else {
                let group = ServiceGroup(configuration: .init(
                    services: [.init(service: agent)], gracefulShutdownSignals: [.sigterm, .sigint], logger: logger))
                try await group.run()
            }
        } catch let error as AgentError {
            logger.critical("\(error.message)")
            switch error.code {
            case .alreadyRunning: throw ExitCode(69)
            case .configuration, .halted: throw ExitCode(78)
            default: throw ExitCode(74)
            }
        } catch let error as StoreError {
            logger.critical("\(error)")
            throw ExitCode(error.code == .insecureDirectory ? 77 : 74)
        }
    }
}

extension WireFormat: ExpressibleByArgument {}
