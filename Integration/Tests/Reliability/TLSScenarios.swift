import Foundation
import Testing
import TributaryCollector
import TributaryStore
import TributaryTestSupport

extension ReliabilityScenarios {
    /// Scenario 15: the real agent process against the real collector over TLS, with a private CA and
    /// certificates made at test time (``TestPKI``). Each case: events stored, an agent run against a
    /// collector whose certificate (or whose demand for the agent's) is wrong, which must halt keeping
    /// everything (exit 78 in `--once` mode, the cause and the fix on its error line, nothing delivered,
    /// nothing dead-lettered); then the configuration fixed (a collector with a good certificate on the
    /// same database, or the agent given the right CA, pin or client certificate) and a run that
    /// delivers everything, in order. Both wire formats.
    @Suite("Reliability: TLS", .serialized, .timeLimit(.minutes(6)))
    struct TLSScenarios {
        /// One row of the TLS table.
        struct Case: Sendable, CustomTestStringConvertible {
            var name: String
            /// The collector's certificate while the agent is refused: good, wrongCA, expired, wrongName.
            var serverCertificate: Certificate = .good
            /// Whether the collector requires client certificates from the test CA.
            var mutual = false
            /// The agent's TLS options while refused, and once fixed (see ``options(_:_:)``).
            var refused: [Option]
            var fixed: [Option] = [.caFile]
            /// What the refused run's error line must say.
            var says: String
            var testDescription: String { name }
        }

        enum Certificate: Sendable { case good, wrongCA, expired, wrongName }
        enum Option: Sendable { case caFile, caFileAppend, wrongCAFile, clientCert, wrongClientCert, goodPin, wrongPin }

        static let cases: [Case] = [
            Case(name: "good chain (--ca-file)", refused: [], fixed: [.caFile], says: ""),
            Case(name: "good chain (--ca-file-append)", refused: [], fixed: [.caFileAppend], says: ""),
            Case(name: "no --ca-file: the system's roots do not know the private CA", refused: [], says: "a CA the agent does not trust"),
            Case(name: "wrong CA", refused: [.wrongCAFile], says: "a CA the agent does not trust"),
            Case(name: "expired certificate", serverCertificate: .expired, refused: [.caFile], says: "expired on"),
            Case(name: "wrong host name", serverCertificate: .wrongName, refused: [.caFile], says: "not issued for the host name"),
            Case(name: "pin mismatch", refused: [.caFile, .wrongPin], fixed: [.caFile, .wrongPin, .goodPin], says: "matches no --pin-sha256"),
            Case(name: "mTLS without a client certificate", mutual: true, refused: [.caFile], fixed: [.caFile, .clientCert],
                 says: "client certificate"),
            Case(name: "mTLS with a client certificate of another CA", mutual: true, refused: [.caFile, .wrongClientCert],
                 fixed: [.caFile, .clientCert], says: "client certificate"),
        ]

        @Test("the agent over TLS: certificate problems halt keeping every event, fixed they deliver in order",
              arguments: cases, ["sensors", "ndjson"])
        func tls(_ tlsCase: Case, format: String) async throws {
            try await withTemporaryGroup { group in
                let directory = (group as NSString).deletingLastPathComponent
                let pki = try PKI(directory: directory)
                let database = directory + "/collector.sqlite"
                var oracle = Oracle(ledgers: try await Scenario.produce(group, [("tls", 120)]))
                oracle.batchSize = Scenario.batchSize
                var problems: [String] = []
                let refusedIsGood = tlsCase.says.isEmpty
                if !refusedIsGood {
                    let config = try collector(pki, tlsCase.serverCertificate, mutual: tlsCase.mutual, database: database)
                    try await Collector.withRunning(config) { collector in
                        let run = try await ChildProcess.run(
                            "tributary-agent", arguments(group, collector, format, pki, tlsCase.refused))
                        if run.status != 78 { problems.append("refused run: exit \(run.status), not 78: \(run.stderr)") }
                        if !run.stderr.contains(tlsCase.says) {
                            problems.append("refused run: the error does not say '\(tlsCase.says)': \(run.stderr)")
                        }
                        if !run.stderr.contains("fix:") { problems.append("refused run names no fix: \(run.stderr)") }
                        if try await collector.stats().unique != 0 { problems.append("a refused agent delivered events") }
                    }
                    let letters = try await ChildProcess.run("tributary", ["dead-letters", "--outbox", Scenario.outbox(group), "--json"])
                    if letters.stdout.contains("event_id") { problems.append("events were dead-lettered: \(letters.stdout)") }
                }
                let config = try collector(pki, .good, mutual: tlsCase.mutual, database: database)
                try await Collector.withRunning(config) { collector in
                    let run = try await ChildProcess.run("tributary-agent", arguments(group, collector, format, pki, tlsCase.fixed))
                    if run.status != 0 { problems.append("fixed run: exit \(run.status): \(run.stderr)") }
                    try await Scenario.conclude(
                        "TLS (\(format)): \(tlsCase.name)", test: "TLSScenarios/tls", iterations: 1, oracle: oracle,
                        collector: collector, group: group, problems: problems)
                }
            }
        }

        /// The test's CAs and certificates.
        struct PKI {
            let ca: TestPKI
            let otherCA: TestPKI
            let server: TestPKI.Leaf
            let wrongCAServer: TestPKI.Leaf
            let expired: TestPKI.Leaf
            let wrongName: TestPKI.Leaf
            let client: TestPKI.Leaf
            let otherClient: TestPKI.Leaf
            let other: TestPKI.Leaf

            init(directory: String) throws {
                ca = try TestPKI(directory: directory)
                otherCA = try TestPKI(directory: directory, name: "Another CA", file: "other-ca")
                server = try ca.issue("server")
                wrongCAServer = try otherCA.issue("server-other-ca")
                expired = try ca.issue("expired", notBefore: Date() - 10 * 86_400, notAfter: Date() - 86_400)
                wrongName = try ca.issue("wrong-name", hosts: ["collector.invalid"])
                client = try ca.issue("client", hosts: ["device-1"])
                otherClient = try otherCA.issue("client-other-ca", hosts: ["device-1"])
                other = try ca.issue("unrelated")
            }
        }

        func collector(_ pki: PKI, _ certificate: Certificate, mutual: Bool, database: String) throws -> CollectorConfiguration {
            let leaf =
                switch certificate {
                case .good: pki.server
                case .wrongCA: pki.wrongCAServer
                case .expired: pki.expired
                case .wrongName: pki.wrongName
                }
            var config = CollectorConfiguration(databasePath: database)
            config.tls = CollectorTLS(
                certificateFile: leaf.certificateFile, keyFile: leaf.keyFile, clientCAFile: mutual ? pki.ca.caFile : nil)
            return config
        }

        func arguments(_ group: String, _ collector: RunningCollector, _ format: String, _ pki: PKI, _ options: [Option])
            -> [String]
        {
            var extra = ["--format", format, "--deadline", "30"]
            for option in options {
                switch option {
                case .caFile: extra += ["--ca-file", pki.ca.caFile]
                case .caFileAppend: extra += ["--ca-file-append", pki.ca.caFile]
                case .wrongCAFile: extra += ["--ca-file", pki.otherCA.caFile]
                case .clientCert: extra += ["--client-cert", pki.client.certificateFile, "--client-key", pki.client.keyFile]
                case .wrongClientCert:
                    extra += ["--client-cert", pki.otherClient.certificateFile, "--client-key", pki.otherClient.keyFile]
                case .goodPin: extra += ["--pin-sha256", pki.server.pin]
                case .wrongPin: extra += ["--pin-sha256", pki.other.pin]
                }
            }
            // The certificates name localhost; the collector listens on 127.0.0.1.
            let url = "https://localhost:\(collector.port)"
            return Scenario.agentArguments(group, url, extra)
        }
    }
}
