import Foundation
import Logging
import Testing
import Tributary
import TributaryTestSupport

@testable import TributaryBridge

/// A real headless browser showing pages served from 127.0.0.1, its frames handled by a bridge over a
/// fresh group: for tests whose pages need an http origin the bridge trusts (a `data:` page's origin
/// is opaque).
struct BrowserHarness: Sendable {
    /// The web view host (its browser runs until the harness ends).
    let host: WebViewHost
    /// The bridge the host hands the pages' messages to.
    let bridge: HybridBridge
    /// The hybrid tracker the bridge writes through.
    let tracker: Tracker
    /// `http://127.0.0.1:<port>`, the pages' origin, the only one trusted.
    let origin: String

    /// The app's server URL the injected script announces.
    static let server = "https://sa.example.com/sa?project=shop"

    /// Serves `pages` (path → HTML), opens `path` in a new tab and runs `body` while the host handles
    /// what the page sends; then stops the browser and the server, even when `body` throws. The host
    /// logs through `hostLogger`.
    static func run(
        pages: [String: String], open path: String = "/", configure: (inout BridgeConfiguration) -> Void = { _ in },
        hostLogger: Logger = Logger(label: "tributary.webview"),
        _ body: @Sendable (BrowserHarness) async throws -> Void
    ) async throws {
        try await withTemporaryGroup { group in
            try await withTestPages(pages) { port in
                let origin = "http://127.0.0.1:\(port)"
                // The browser is spawned before the store is opened: no child inherits an open LMDB environment.
                var configuration = BridgeConfiguration(serverURL: server, allowedOrigins: [origin])
                configure(&configuration)
                let host = try WebViewHost(configuration: configuration, logger: hostLogger)
                defer { host.close() }
                var logger = Logger(label: "tributary.bridge")
                logger.logLevel = .critical  // rejections are the point of these tests; keep their output quiet
                let tracker = try Tracker(configuration: .init(groupDirectory: group, producerKind: .hybrid))
                let bridge = HybridBridge(tracker: tracker, configuration: configuration, logger: logger)
                // Ends once the browser is closed (below, on every path).
                try await withThrowingTaskGroup(of: Void.self) { tasks in
                    tasks.addTask { await host.run(bridge: bridge) }
                    defer { tasks.cancelAll() }
                    try await host.open(origin + path)
                    try await body(BrowserHarness(host: host, bridge: bridge, tracker: tracker, origin: origin))
                }
            }
        }
    }

    /// Waits (up to 60 s) until `condition` holds; records an issue naming `what` if it never does.
    func wait(for what: String, until condition: () -> Bool) async throws {
        let start = ContinuousClock.now
        while !condition() {
            guard ContinuousClock.now - start < .seconds(60) else {
                Issue.record("timed out waiting for \(what); bridge counts: \(bridge.snapshot)")
                return
            }
            try await Task.sleep(for: .milliseconds(20))
        }
    }

    /// A page script that posts `messages` (JavaScript expressions evaluating to strings) through the
    /// bridge, in order, once the injected script is there. `server` and `event(name)` are in scope:
    /// the announced server URL, and a valid `app_h5_track` message for an event named `name`.
    static func posting(_ messages: [String]) -> String {
        """
        <!doctype html><html><body><script>
        (function post() {
          var h = window.webkit && window.webkit.messageHandlers;
          if (!h || !h.sensorsdataNativeTracker) { setTimeout(post, 10); return; }
          var server = window.SensorsData_iOS_JS_Bridge.sensorsdata_app_server_url;
          function event(name) {
            return JSON.stringify({ callType: 'app_h5_track', data: {
              type: 'track', event: name, time: Date.now(), distinct_id: 'page-anon', anonymous_id: 'page-anon',
              lib: { $lib: 'js' }, properties: {}, server_url: server } });
          }
        \(messages.map { "  h.sensorsdataNativeTracker.postMessage(\($0));" }.joined(separator: "\n"))
        })();
        </script></body></html>
        """
    }
}
