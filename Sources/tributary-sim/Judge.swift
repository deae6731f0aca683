import ArgumentParser
import Foundation
import Logging
import TributaryCollector
import TributaryOracle

/// `tributary-sim judge`: the reliability oracle as a command, for runs outside the test suite (the
/// system test's virtual machine, `make system-test`): producers' ledgers against what a collector's
/// database holds, and the store's and outbox's health checks. Prints one row of the reliability table.
struct Judge: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Judges a run: producers' ledgers against a collector's database (the reliability oracle).",
        discussion: """
            Prints one tab-separated row of the reliability table (docs/reliability.md) on stdout, and the \
            verdict in words on stderr. Exit codes: 0 the run upheld every promise; 1 it did not (the row \
            says FAIL); 64 bad usage; 74 the collector's database cannot be read.
            """
    )

    @Option(help: "The scenario's name, the row's first column.")
    var scenario: String

    @Option(parsing: .unconditional, help: "The row's iterations column.")
    var iterations = 1

    @Option(
        name: .customLong("collector-db"),
        help: ArgumentHelp("The collector's SQLite database (tributary-collector --db).", valueName: "path"))
    var collectorDatabase: String

    @Option(
        name: .customLong("ledger"),
        help: ArgumentHelp("A producer's ledger (tributary-sim --ledger), as PRODUCER=PATH; repeatable.", valueName: "producer=path"))
    var ledgers: [String] = []

    @Option(
        name: .customLong("ledger-dir"),
        help: ArgumentHelp("Every PRODUCER.ledger file in this directory is the ledger of PRODUCER.", valueName: "dir"))
    var ledgerDirectory: String?

    @Option(help: ArgumentHelp("The group directory whose store to check (stale reader slots).", valueName: "dir"))
    var group: String?

    @Option(help: ArgumentHelp("The agent's outbox to check (SQLite integrity_check).", valueName: "path"))
    var outbox: String?

    @Option(
        name: .customLong("crash-windows"), parsing: .unconditional,
        help: "Agent processes that ended without a clean stop (each may repeat two batches on the wire).")
    var crashWindows = 0

    @Option(
        name: .customLong("in-flight-windows"), parsing: .unconditional,
        help: "Clean stops and lost acknowledgements (each may repeat one batch on the wire).")
    var inFlightWindows = 0

    @Option(name: .customLong("batch-size"), parsing: .unconditional, help: "The agent's --batch-size.")
    var batchSize = 500

    @Option(
        name: .customLong("cut-producer"),
        help: ArgumentHelp(
            "A producer a power cut ended: its events past its ledger's last one may arrive; repeatable.",
            valueName: "producer"))
    var cutProducers: [String] = []

    @Flag(name: .customLong("all-cut"), help: "Every producer was ended by a power cut (as --cut-producer for each).")
    var allCut = false

    @Option(
        name: .customLong("cut-callers"),
        help: ArgumentHelp(
            "The track() callers the cut producers matching PATTERN (a shell pattern: pl-*-2) had at once (load --concurrency; 1 when unnamed): up to N - 1 of such a producer's events below its ledger's last one may arrive unlisted; repeatable, the first match counts.",
            valueName: "pattern=n"))
    var cutCallers: [String] = []

    @Option(
        name: .customLong("unledgered-producer"),
        help: ArgumentHelp("A producer nobody kept a ledger for (a `tributary track`): never unexpected; repeatable.", valueName: "producer"))
    var unledgeredProducers: [String] = []

    func validate() throws {
        for ledger in ledgers where !ledger.contains("=") {
            throw ValidationError("--ledger takes PRODUCER=PATH, not '\(ledger)'.")
        }
        guard !ledgers.isEmpty || ledgerDirectory != nil else {
            throw ValidationError("Name the ledgers: --ledger PRODUCER=PATH or --ledger-dir DIR.")
        }
        guard iterations >= 0, crashWindows >= 0, inFlightWindows >= 0, batchSize > 0 else {
            throw ValidationError("--iterations, --crash-windows and --in-flight-windows must not be negative, --batch-size must be positive.")
        }
        for rule in cutCallers where CutCallersRule(argument: rule) == nil {
            throw ValidationError("--cut-callers takes PATTERN=N, N a positive number of callers, not '\(rule)'.")
        }
    }

    func run() async throws {
        var oracle = Oracle(ledgers: try allLedgers())
        oracle.crashWindows = crashWindows
        oracle.inFlightWindows = inFlightWindows
        oracle.batchSize = batchSize
        oracle.cutProducers = Set(allCut ? oracle.ledgers.map(\.producer) : cutProducers)
        oracle.cutCallers = CutCallersRule.resolve(cutCallers.compactMap(CutCallersRule.init(argument:)), producers: oracle.cutProducers)
        oracle.unledgeredProducers = Set(unledgeredProducers)
        guard FileManager.default.fileExists(atPath: collectorDatabase) else {
            throw runFailure("No collector database at \(collectorDatabase).", exitCode: 74)
        }
        let observed: Oracle.Observed
        do {
            var configuration = CollectorConfiguration()
            configuration.databasePath = collectorDatabase
            let collector = try Collector(configuration: configuration, logger: Logger(label: "tributary.judge"))
            observed = try await Oracle.Observed.from(collector)
        } catch {
            throw runFailure("Cannot read the collector's database \(collectorDatabase): \(error)", exitCode: 74)
        }
        var verdict = oracle.judge(observed)
        verdict.healthProblems += Oracle.healthProblems(group: group, outbox: outbox)
        var result = verdict.passed ? "pass" : "FAIL"
        if !verdict.healthProblems.isEmpty { result += " (" + verdict.healthProblems.joined(separator: "; ") + ")" }
        FileHandle.standardOutput.write(Data(ReliabilityRow.line(scenario, iterations: iterations, verdict: verdict, result: result).utf8))
        FileHandle.standardError.write(Data("tributary-sim judge: \(scenario): \(verdict)\n".utf8))
        if !verdict.passed { throw ExitCode(1) }
    }

    /// The `--ledger` pairs and the ledgers of `--ledger-dir`, sorted by producer.
    private func allLedgers() throws -> [Oracle.Ledger] {
        var found = ledgers.map { pair in
            let parts = pair.split(separator: "=", maxSplits: 1)
            return Oracle.Ledger(producer: String(parts[0]), path: parts.count > 1 ? String(parts[1]) : "")
        }
        if let ledgerDirectory {
            let names: [String]
            do {
                names = try FileManager.default.contentsOfDirectory(atPath: ledgerDirectory)
            } catch {
                throw runFailure("Cannot list the ledgers in \(ledgerDirectory): \(error.localizedDescription)", exitCode: 74)
            }
            for name in names.sorted() where name.hasSuffix(".ledger") {
                found.append(Oracle.Ledger(producer: String(name.dropLast(".ledger".count)), path: ledgerDirectory + "/" + name))
            }
        }
        return found
    }
}
