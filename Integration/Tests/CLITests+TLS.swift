import Foundation
import Testing
import TributaryCollector
import TributaryTestSupport

extension CLITests {
    /// TLS files the agent cannot use: exit 78 (configuration) before anything is sent.
    @Suite("tributary-agent: TLS files it cannot use")
    struct TLSFiles {
        @Test(
            "not PEM, a key without its certificate, a key of another certificate, a bad pin: exit 78, nothing sent",
            arguments: [
                (["--ca-file", "NOT_PEM"], "--ca-file"),
                (["--ca-file-append", "NOT_PEM"], "--ca-file-append"),
                (["--ca-file", "MISSING"], "cannot be read"),
                (["--client-key", "CLIENT_KEY"], "--client-key needs --client-cert"),
                (["--client-cert", "CLIENT_CERT"], "--client-cert needs --client-key"),
                (["--client-cert", "CLIENT_CERT", "--client-key", "OTHER_KEY"], "is not the key of"),
                (["--client-cert", "CLIENT_CERT", "--client-key", "NOT_PEM"], "is not a PEM private key"),
                (["--pin-sha256", "c2hvcnQ="], "--pin-sha256"),
            ])
        func refused(_ options: [String], _ says: String) async throws {
            try await withTemporaryGroup { group in
                let directory = (group as NSString).deletingLastPathComponent
                let ca = try TestPKI(directory: directory)
                let client = try ca.issue("client", hosts: ["device-1"])
                let other = try ca.issue("other", hosts: ["device-2"])
                let notPEM = directory + "/not.pem"
                try Data("not a certificate\n".utf8).write(to: URL(fileURLWithPath: notPEM))
                let files = [
                    "NOT_PEM": notPEM, "MISSING": directory + "/missing.pem", "CLIENT_KEY": client.keyFile,
                    "CLIENT_CERT": client.certificateFile, "OTHER_KEY": other.keyFile,
                ]
                try await CLITests.trackOne(group)
                try await Collector.withRunning(CollectorConfiguration()) { collector in
                    let run = try await CLITests.runAgent(
                        ["--group", group, "--server", collector.url + "/sa", "--outbox", group + "-outbox.sqlite", "--once"]
                            + options.map { files[$0] ?? $0 })
                    #expect(run.status == 78, "\(run.stderr)")
                    #expect(run.stderr.contains(says), "\(run.stderr)")
                    #expect(try await collector.stats().requests == 0)
                }
            }
        }
    }
}

extension CLITests {
    /// `tributary-collector --tls-cert --tls-key [--client-ca]` serves https; its options go together.
    @Suite("tributary-collector: TLS")
    struct CollectorOverTLS {
        @Test("with --tls-cert and --tls-key it says LISTENING https://, and the agent delivers to it")
        func serves() async throws {
            try await withTemporaryGroup { group in
                let directory = (group as NSString).deletingLastPathComponent
                let ca = try TestPKI(directory: directory)
                let server = try ca.issue("server")
                let client = try ca.issue("client", hosts: ["device-1"])
                let collector = try ChildProcess(
                    "tributary-collector",
                    ["--port", "0", "--tls-cert", server.certificateFile, "--tls-key", server.keyFile, "--client-ca", ca.caFile])
                defer { collector.send(SIGKILL) }
                let line = try #require(await collector.waitForLine(startingWith: "LISTENING"))
                #expect(line.hasPrefix("LISTENING https://127.0.0.1:"), "\(line)")
                let port = try #require(line.split(separator: ":").last.map(String.init))
                try await CLITests.trackOne(group)
                let run = try await CLITests.runAgent([
                    "--group", group, "--server", "https://localhost:\(port)/sa", "--outbox", group + "-outbox.sqlite", "--once",
                    "--ca-file", ca.caFile, "--client-cert", client.certificateFile, "--client-key", client.keyFile,
                ])
                #expect(run.status == 0, "\(run.stderr)")
            }
        }

        @Test(
            "its TLS options go together, and must be PEM: exit 64",
            arguments: [["--tls-cert", "CERT"], ["--tls-key", "KEY"], ["--client-ca", "CERT"],
                        ["--tls-cert", "NOT_PEM", "--tls-key", "KEY"], ["--tls-cert", "CERT", "--tls-key", "NOT_PEM"]])
        func refused(_ options: [String]) async throws {
            try await withTemporaryGroup { group in
                let directory = (group as NSString).deletingLastPathComponent
                let server = try TestPKI(directory: directory).issue("server")
                let notPEM = directory + "/not.pem"
                try Data("not a certificate\n".utf8).write(to: URL(fileURLWithPath: notPEM))
                let files = ["CERT": server.certificateFile, "KEY": server.keyFile, "NOT_PEM": notPEM]
                let collector = try ChildProcess("tributary-collector", ["--port", "0"] + options.map { files[$0] ?? $0 })
                let limiter = collector.killAfter(.seconds(20))
                defer { limiter.cancel() }
                let result = await collector.finish()
                #expect(result.status == 64, "\(result.stderr)")
            }
        }
    }
}
