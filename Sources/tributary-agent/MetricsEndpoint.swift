import Hummingbird
import Logging
import Metrics
import Prometheus
import ServiceLifecycle

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
        service = Application(
            router: router, configuration: .init(address: .hostname(host, port: port), serverName: "tributary-agent"),
            logger: logger)
    }
}

import Foundation
