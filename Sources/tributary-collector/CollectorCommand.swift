import ArgumentParser
import Foundation
import Logging
import ServiceLifecycle
import TributaryCollector
import TributaryStore
import TributaryWire
import TributaryErrors
import TributaryExitStatus

/// `tributary-collector`: the reference collector as a process. Wiring only; the behaviour lives in
/// the `TributaryCollector` library.
struct CollectorCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "tributary-collector",
        abstract: "Reference collector for Tributary batches, with dedup, order checks and fault injection.",
        discussion: """
            Accepts batches on POST /sa or POST /ingest (either path; the Content-Type says whether the body \
            is the Sensors form or gzip NDJSON), stores unique events \
            in SQLite, and serves GET /stats, GET /events and GET|POST /control/faults; POST /count/<name>/… \
            counts another SDK's batches by name without storing them (GET /count). Once listening it \
            prints exactly one line to stdout: "LISTENING http://HOST:PORT" (https:// with --tls-cert). SIGTERM or SIGINT shut it down \
            gracefully (exit 0). Logs go to stderr. Exit codes: 0 after a graceful shutdown, 64 for bad \
            options, 1 when the database cannot be opened or the address cannot be bound. \
            See docs/collector.md.
            """
    )

    @Option(help: "Address to bind.")
    var host = "127.0.0.1"

    @Option(parsing: .unconditional, help: "TCP port to bind; 0 picks a free port (printed on the LISTENING line).")
    var port = 0

    @Option(
        help: ArgumentHelp(
            "Require 'Authorization: Bearer <token>' on ingest requests (else 401). "
                + "Also read from TRIBUTARY_COLLECTOR_TOKEN."
        )
    )
    var token: String?

    @Option(
        name: .customLong("db"),
        help: ArgumentHelp("SQLite database file (created if missing); default: in memory.", valueName: "path")
    )
    var databasePath: String?

    @Option(parsing: .unconditional, help: "Largest ingest body accepted, as sent and after decompression (else 413).")
    var maxBodyBytes = CollectorConfiguration.defaultMaxBodyBytes

    @Option(parsing: .unconditional, help: "Most events one ingest request may carry (else 413, which the agent answers by splitting).")
    var maxRequestEvents = CollectorConfiguration.defaultMaxEventsPerRequest

    @Option(parsing: .unconditional, help: "Seed of the fault generator: the same seed gives the same fault decisions.")
    var seed: UInt64 = 0

    @Option(parsing: .unconditional, help: "Probability (0...1) of answering an ingest request with --fail-status, storing nothing.")
    var failRate = 0.0

    @Option(parsing: .unconditional, help: "Status of injected failures (300...599).")
    var failStatus = 503

    @Option(help: "Retry-After header value sent with injected failures and forced statuses (seconds or an HTTP date).")
    var retryAfter: String?

    @Option(parsing: .unconditional, help: "Milliseconds of delay before every ingest response.")
    var latencyMs = 0

    @Option(parsing: .unconditional, help: "Probability (0...1) of holding an ingest request without ever answering.")
    var hangRate = 0.0

    @Option(parsing: .unconditional, help: "Probability (0...1) of resetting the connection before answering, storing nothing.")
    var resetRate = 0.0

    @Option(parsing: .unconditional, help: "Probability (0...1) of storing a batch, then resetting the connection without an answer.")
    var lostAckRate = 0.0

    @Option(
        name: .customLong("poison"),
        help: ArgumentHelp(
            "Reject batches with an event whose name matches this regular expression.",
            valueName: "regex"
        )
    )
    var poisonPattern: String?

    @Option(parsing: .unconditional, help: "Status of poisoned batches.")
    var poisonStatus = 400

    @Option(
        name: .customLong("max-events"), parsing: .unconditional,
        help: ArgumentHelp("Reject batches of more than N events with 413.", valueName: "n")
    )
    var maxEventsPerBatch: Int?

    @Option(
        parsing: .unconditional,
        help: "Answer every ingest request with this status, storing nothing (until changed via POST /control/faults)."
    )
    var forcedStatus: Int?

    @Option(name: .customLong("tls-cert"), help: ArgumentHelp("PEM file of the server certificate (and its chain): serve https (needs --tls-key).", valueName: "pem"))
    var tlsCert: String?

    @Option(name: .customLong("tls-key"), help: ArgumentHelp("PEM file of --tls-cert's private key.", valueName: "pem"))
    var tlsKey: String?

    @Option(
        name: .customLong("client-ca"),
        help: ArgumentHelp(
            "PEM file of the CAs whose client certificates are required: a client without one cannot connect (mutual TLS; needs --tls-cert).",
            valueName: "pem"))
    var clientCA: String?

    @Option(help: "Log level: trace, debug, info, notice, warning, error or critical.")
    var logLevel: Logger.Level = .info

    func validate() throws {
        if (tlsCert == nil) != (tlsKey == nil) { throw ValidationError("--tls-cert and --tls-key go together.") }
        if clientCA != nil && tlsCert == nil { throw ValidationError("--client-ca needs --tls-cert and --tls-key (it is mutual TLS).") }
        do {
            try collectorConfiguration().validate()
        } catch {
            throw ValidationError(error.message)
        }
    }

    func run() async throws {
        do {
            try await serve()
        } catch {
            // Said here, as ArgumentParser would, and ended with the status of the one exit table.
            FileHandle.standardError.write(Data("tributary-collector: \(error)\n".utf8))
            throw ExitCode(ExitStatus.of(error, as: .command).rawValue)
        }
    }

    private func serve() async throws {
        MallocPolicy.reuseLargeBuffers(singleArena: false)
        let logLevel = self.logLevel
        LoggingSystem.bootstrap { label in
            var handler = StreamLogHandler.standardError(label: label)
            handler.logLevel = logLevel
            return handler
        }
        let logger = Logger(label: "tributary.collector")
        let collector = try Collector(configuration: collectorConfiguration(), logger: logger) { url in
            // Unbuffered: stdout is a pipe under systemd and in tests, where print() would sit in a buffer.
            FileHandle.standardOutput.write(Data("LISTENING \(url)\n".utf8))
        }
        let group = ServiceGroup(
            configuration: .init(
                services: [.init(service: collector)],
                gracefulShutdownSignals: [.sigterm, .sigint],
                logger: logger
            )
        )
        try await group.run()
    }

    private func collectorConfiguration() -> CollectorConfiguration {
        var configuration = CollectorConfiguration(
            host: host,
            port: port,
            token: token ?? ProcessInfo.processInfo.environment["TRIBUTARY_COLLECTOR_TOKEN"],
            databasePath: databasePath,
            maxBodyBytes: maxBodyBytes,
            maxEventsPerRequest: maxRequestEvents,
            faults: FaultConfiguration(
                seed: seed,
                failureRate: failRate,
                failureStatus: failStatus,
                retryAfter: retryAfter,
                latencyMillis: latencyMs,
                hangRate: hangRate,
                resetRate: resetRate,
                lostAckRate: lostAckRate,
                poisonPattern: poisonPattern,
                poisonStatus: poisonStatus,
                maxEventsPerBatch: maxEventsPerBatch,
                forcedStatus: forcedStatus
            )
        )
        if let tlsCert, let tlsKey {
            configuration.tls = CollectorTLS(certificateFile: tlsCert, keyFile: tlsKey, clientCAFile: clientCA)
        }
        return configuration
    }
}

extension Logger.Level: @retroactive ExpressibleByArgument {}

/// The entry point: descriptors 0–2 taken first (``StandardDescriptors``), then the command.
@main
enum CollectorCommandMain {
    static func main() async {
        StandardDescriptors.takeClosed()
        await CollectorCommand.main(CommandLineArguments.helpFirst(Array(CommandLine.arguments.dropFirst())))
    }
}
