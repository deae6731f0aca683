import Hummingbird
import Logging
import Metrics
import Prometheus
import ServiceLifecycle
import TributaryAgentCore

/// Serves the agent's metrics as Prometheus text at `GET /metrics` (loopback recommended).
struct MetricsEndpoint {
    static let registry = PrometheusCollectorRegistry()

    /// Routes swift-metrics to the Prometheus registry; call once, before any metric is created.
    static func bootstrap() {
        MetricsSystem.bootstrap(PrometheusMetricsFactory(registry: registry))
    }

    /// Parses `HOST:PORT`.
    static func parse(_ text: String) -> (host: String, port: Int)? {
        guard let colon = text.lastIndex(of: ":"), let port = Int(text[text.index(after: colon)...]),
            (0...65535).contains(port)
        else { return nil }
        let host = String(text[..<colon]).trimmingCharacters(in: CharacterSet(charactersIn: "[]"))
        return host.isEmpty ? nil : (host, port)
    }

    let service: any Service

    init(host: String, port: Int, logger: Logger) {
        let router = Router()
        router.get("metrics") { _, _ -> String in
            MetricsEndpoint.registry.emitToString()
        }
        service = Served(
            application: Application(
                router: router, configuration: .init(address: .hostname(host, port: port), serverName: "tributary-agent"),
                logger: logger),
            address: "\(host):\(port)")
    }

    /// How long the server's graceful shutdown may wait for the responses it is writing before it is
    /// cancelled: a scraper that stopped reading would otherwise hold the process for as long as it likes.
    static let shutdownAllowance = Duration.seconds(1)

    /// The HTTP server, whose failure to serve (the port taken, an address not of this host) is a
    /// configuration error of `--metrics-address`: exit 78, which systemd does not restart. Its graceful
    /// shutdown lasts at most ``MetricsEndpoint/shutdownAllowance``.
    private struct Served<Inner: Service>: Service {
        let application: Inner
        let address: String

        func run() async throws {
            try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask {
                    do {
                        try await application.run()
                    } catch {
                        throw AgentError(.configuration, "Cannot serve metrics at \(address) (--metrics-address): \(error).")
                    }
                }
                group.addTask {
                    try await gracefulShutdown()
                    try await EventLoopSleep.sleep(until: .now + MetricsEndpoint.shutdownAllowance)
                }
                // Whichever ends first: the server (shut down, or failed), or the allowance after a
                // shutdown began, which then cancels the server.
                try await group.next()
                group.cancelAll()
            }
        }
    }
}

import Foundation
