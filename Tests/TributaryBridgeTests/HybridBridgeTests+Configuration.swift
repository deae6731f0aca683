import Foundation
import Logging
import Testing
import Tributary
import TributaryTestSupport

@testable import TributaryBridge

// The bridge's configuration: server projects compared, origins normalised, values no page can match named.
extension HybridBridgeTests {
    @Test("server URLs compare by host and project (default 'default'); origins are normalised")
    func serverProjects() {
        #expect(
            ServerProject(url: "https://SA.example.com/sa?project=shop")
                == ServerProject(host: "sa.example.com", project: "shop"))
        #expect(ServerProject(url: "http://sa.example.com:8106/sa")?.project == "default")
        #expect(ServerProject(url: "http://sa.example.com/sa?project=")?.project == "default")
        #expect(ServerProject(url: "/relative/path") == nil)
        let configuration = BridgeConfiguration(serverURL: Self.server, allowedOrigins: ["HTTP://Example.com:80/"])
        #expect(configuration.allowedOrigins == ["http://example.com"])
    }

    @Test("opaque origins are never trusted, even when listed; origins are normalised when assigned too")
    func opaqueOriginsNeverTrusted() async throws {
        var configuration = BridgeConfiguration(serverURL: Self.server, allowedOrigins: ["null", "://", Self.origin])
        #expect(configuration.allowedOrigins == [Self.origin])
        configuration.allowedOrigins = ["HTTP://Example.com:80/", "NULL", ""]
        #expect(configuration.allowedOrigins == ["http://example.com"])
        configuration.allowedOrigins.insert("HTTPS://Example.com:443")
        #expect(configuration.allowedOrigins == ["http://example.com", "https://example.com"])

        try await withTemporaryGroup { group in
            let tracker = try Tracker(configuration: .init(groupDirectory: group, producerKind: .hybrid))
            var listed = BridgeConfiguration(serverURL: Self.server, allowedOrigins: [Self.origin])
            listed.allowedOrigins.insert("null")
            var logger = Logger(label: "tributary.bridge")
            logger.logLevel = .critical
            let bridge = HybridBridge(tracker: tracker, configuration: listed, logger: logger)
            for origin in ["null", "://", ""] {
                let result = await bridge.receive(Self.message(Self.pageEvent()), origin: origin)
                #expect(Self.reason(result) == .foreignOrigin, "origin '\(origin)': \(result)")
            }
            #expect(try tracker.store.status().pendingEvents == 0)
        }
    }

    @Test("a configuration value no page can ever match is named among its problems, not dropped unsaid")
    func configurationProblems() {
        let neverMatched = [
            "127.0.0.1:8080", "https://a.example/app", "null", "https://a.example ", "https://user@a.example",
            "https://*.a.example", "https://a.example:http",
        ]
        var configuration = BridgeConfiguration(serverURL: "sa.example.com/sa", allowedOrigins: Set(neverMatched + [Self.origin]))
        configuration.allowedServerURLs = ["https://b.example/sa", "/sa?project=x"]
        #expect(configuration.allowedOrigins == [Self.origin], "none of the others is ever a frame's origin")
        let problems = configuration.problems
        #expect(problems.count == neverMatched.count + 2, "\(problems)")
        for named in neverMatched.map({ "'\($0)'" }) + ["'/sa?project=x'"] {
            #expect(problems.contains { $0.contains(named) }, "\(named) not named: \(problems)")
        }
        // A whitelisted server still takes events: not "every page event" is refused.
        #expect(problems.contains { $0.contains("'sa.example.com/sa' is not an absolute URL") && $0.contains("naming the app's server") })
        let fine = BridgeConfiguration(
            serverURL: Self.server, allowedOrigins: [Self.origin, "HTTP://Example.com:80/", "http://[::1]:8080", "https://[::1]"])
        #expect(fine.problems.isEmpty, "\(fine.problems)")
        #expect(fine.allowedOrigins.count == 4)
    }
}
