import Foundation
import Testing
import TributaryCollector
import TributaryTestSupport

extension CLITests {
    /// A collector on the IPv6 loopback, `http://[::1]:PORT` and `https://[::1]:PORT`, end to end: a
    /// certificate for another name is refused, one naming the address `::1` itself is accepted.
    @Suite("tributary-agent: IPv6")
    struct IPv6 {
        @Test("http://[::1]:PORT and https://[::1]:PORT (a certificate for the name ip6-localhost is refused as a wrong name)")
        func loopback() async throws {
            try await withTemporaryGroup { group in
                try await CLITests.trackOne(group)
                try await Collector.withRunning(CollectorConfiguration(host: "::1")) { collector in
                    #expect(collector.url.hasPrefix("http://[::1]:"))
                    let run = try await CLITests.runAgent(
                        ["--group", group, "--server", collector.url + "/sa", "--outbox", group + "-outbox.sqlite", "--once"])
                    #expect(run.status == 0, "\(run.stderr)")
                    #expect(try await collector.stats().unique == 1)
                }
                let directory = (group as NSString).deletingLastPathComponent
                let ca = try TestPKI(directory: directory)
                let server = try ca.issue("server", hosts: ["ip6-localhost"])
                var config = CollectorConfiguration(host: "::1")
                config.tls = CollectorTLS(certificateFile: server.certificateFile, keyFile: server.keyFile)
                try await CLITests.trackOne(group)
                try await Collector.withRunning(config) { collector in
                    #expect(collector.url.hasPrefix("https://[::1]:"))
                    let run = try await CLITests.runAgent(
                        ["--group", group, "--server", collector.url + "/sa", "--outbox", group + "-outbox.sqlite", "--once",
                         "--ca-file", ca.caFile])
                    #expect(run.status == 78, "\(run.stderr)")
                    #expect(run.stderr.contains("not issued for the host name"), "\(run.stderr)")
                    #expect(try await collector.stats().unique == 0)
                }
            }
        }

        @Test("https://[::1]:PORT with a certificate naming the address ::1 (an IP address name) delivers end to end")
        func certificateForTheAddress() async throws {
            try await withTemporaryGroup { group in
                let directory = (group as NSString).deletingLastPathComponent
                let ca = try TestPKI(directory: directory)
                let server = try ca.issue("server", hosts: ["::1"])
                var config = CollectorConfiguration(host: "::1")
                config.tls = CollectorTLS(certificateFile: server.certificateFile, keyFile: server.keyFile)
                for _ in 0..<3 { try await CLITests.trackOne(group) }
                try await Collector.withRunning(config) { collector in
                    let run = try await CLITests.runAgent(
                        ["--group", group, "--server", collector.url + "/sa", "--outbox", group + "-outbox.sqlite", "--once",
                         "--ca-file", ca.caFile, "--pin-sha256", server.pin])
                    #expect(run.status == 0, "\(run.stderr)")
                    #expect(try await collector.stats().unique == 3)
                    #expect(try await collector.events().map(\.seq) == [1, 2, 3])
                }
            }
        }
    }
}
