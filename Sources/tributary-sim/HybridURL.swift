import ArgumentParser
import Foundation
import Logging
import TributaryBridge

/// `tributary-sim hybrid --url URL`: any page in headless Chromium with the bridge, as an app opens its
/// H5 page, recorded for `--duration` seconds.
extension Hybrid {
    /// The default of `--duration`.
    static let defaultDuration: Double = 10

    /// The options that only `--url` takes, and the URL itself.
    func validateURLMode() throws {
        guard let url else {
            if !allowedOrigins.isEmpty { throw ValidationError("--allow-origin needs --url (the test pages trust their own origins).") }
            if duration != nil { throw ValidationError("--duration needs --url (the test pages end by themselves).") }
            return
        }
        guard let components = URLComponents(string: url), ["http", "https"].contains(components.scheme?.lowercased()),
            components.host?.isEmpty == false
        else {
            throw ValidationError("--url must be an absolute http or https URL, like http://127.0.0.1:8080/page.html; got '\(url)'.")
        }
        if scenario != "pages" { throw ValidationError("--scenario is for the test pages; --url opens the page given.") }
        if let duration, !(duration > 0 && duration <= 86_400) {  // NaN and inf fail too
            throw ValidationError("--duration must be more than 0 and at most a day of seconds; got \(duration).")
        }
        let configuration = BridgeConfiguration(serverURL: serverURL, allowedOrigins: Set(pageOrigins(url)))
        let refused = configuration.problems.filter { $0.hasPrefix("Allowed origin") }
        guard refused.isEmpty else {
            throw ValidationError("--allow-origin: \(refused.joined(separator: "; "))")
        }
    }

    /// The origins whose frames may post: `--allow-origin`, else the page's own.
    private func pageOrigins(_ url: String) -> [String] {
        guard allowedOrigins.isEmpty else { return allowedOrigins }
        guard let components = URLComponents(string: url), let scheme = components.scheme, let host = components.host
        else { return [] }
        return ["\(scheme)://\(host)" + (components.port.map { ":\($0)" } ?? "")]
    }

    /// Opens `url`, records what its frames send for `--duration` seconds, then prints the counts.
    func runPage(_ url: String) async throws {
        var logger = Logger(label: "tributary.sim.hybrid")
        logger.logLevel = .error
        var configuration = BridgeConfiguration(serverURL: serverURL, allowedOrigins: Set(pageOrigins(url)))
        configuration.allowedServerURLs = allowedServerURLs
        let (host, bridge) = try startBridge(configuration, logger: logger)
        defer { host.close() }
        try await withThrowingTaskGroup(of: Void.self) { tasks in
            tasks.addTask { await host.run(bridge: bridge) }
            do {
                try await host.open(url)
            } catch {
                throw Self.browserFailure(error)
            }
            try await Task.sleep(for: .seconds(duration ?? Self.defaultDuration))
            // Messages received by then are finished (committed or refused) before the counts are read.
            let settle = ContinuousClock.now + .seconds(5)
            while bridge.snapshot.handled < bridge.snapshot.received.values.reduce(0, +), ContinuousClock.now < settle {
                try await Task.sleep(for: .milliseconds(20))
            }
            let counts = bridge.snapshot
            FileHandle.standardOutput.write(Data("BRIDGE \(Self.summary(counts))\n".utf8))
            var report = "tributary-sim: \(url): accepted \(counts.accepted)"
            for (reason, n) in counts.rejected.sorted(by: { $0.key < $1.key }) { report += ", \(reason) \(n)" }
            FileHandle.standardError.write(Data((report + "\n").utf8))
            host.close()
            tasks.cancelAll()
        }
    }
}
