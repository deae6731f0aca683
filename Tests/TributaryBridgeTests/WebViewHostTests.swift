import Foundation
import Logging
import Testing
import Tributary
import TributaryTestSupport

@testable import TributaryBridge

/// The web-view host against the real headless Chromium, without the page servers.
@Suite("Web view host")
struct WebViewHostTests {
    @Test("a missing browser binary is a typed error")
    func missingBrowser() {
        let configuration = BridgeConfiguration(serverURL: HybridBridgeTests.server, allowedOrigins: [])
        #expect(throws: BrowserError.self) {
            _ = try WebViewHost(configuration: configuration, executable: "/nonexistent/chromium")
        }
    }

    @Test("a host dropped without close() stops its browser and removes its profile")
    func droppedHost() async throws {
        let configuration = BridgeConfiguration(serverURL: HybridBridgeTests.server, allowedOrigins: [])
        var host: WebViewHost? = try WebViewHost(configuration: configuration)
        let pid = try #require(host?.browserPID)
        let profile = try #require(host?.profileDirectory)
        try await host?.open("about:blank")
        host = nil
        // Reaped by the stop: no such process (a zombie would still answer kill 0).
        #expect(kill(pid, 0) != 0 && errno == ESRCH, "the browser of a dropped host still runs")
        #expect(!FileManager.default.fileExists(atPath: profile))
    }

    @Test("the injected script reaches the page; a frame with an opaque origin is refused as foreign")
    func opaqueOrigin() async throws {
        try await withTemporaryGroup { group in
            let configuration = BridgeConfiguration(
                serverURL: HybridBridgeTests.server, allowedOrigins: ["http://127.0.0.1:1"])
            let host = try WebViewHost(configuration: configuration)
            defer { host.close() }
            var logger = Logger(label: "tributary.bridge")
            logger.logLevel = .critical
            let tracker = try Tracker(configuration: .init(groupDirectory: group, producerKind: .hybrid))
            let bridge = HybridBridge(tracker: tracker, configuration: configuration, logger: logger)
            var singleton: String?
            // Posts the server URL the injected script announces, once the bridge is there.
            let script =
                "(function post() { var h = window.webkit && window.webkit.messageHandlers;"
                + " if (h && h.sensorsdataNativeTracker) {"
                + " h.sensorsdataNativeTracker.postMessage(window.SensorsData_iOS_JS_Bridge.sensorsdata_app_server_url);"
                + " } else { setTimeout(post, 10); } })();"
            try await withThrowingTaskGroup(of: Void.self) { tasks in
                tasks.addTask { await host.run(bridge: bridge) }
                try await host.open("data:text/html,<script>\(script)</script>")
                let start = ContinuousClock.now
                while bridge.snapshot.received.isEmpty && ContinuousClock.now - start < .seconds(60) {
                    try await Task.sleep(for: .milliseconds(20))
                }
                singleton = host.singletonDirectory
                host.close()
                try await tasks.waitForAll()
            }
            // Its helpers may still write there as the browser ends: a removal that met their files left
            // whole profiles in the temporary directory.
            #expect(!FileManager.default.fileExists(atPath: host.profileDirectory), "the browser's profile was left behind")
            // Chromium's singleton directory is outside the profile and outlives a SIGTERMed browser.
            let left = try #require(singleton, "the browser made no singleton socket")
            #expect(!FileManager.default.fileExists(atPath: left), "the browser's singleton directory was left behind")
            #expect(bridge.snapshot.received == ["null": 1], "data: documents have an opaque origin")
            #expect(bridge.rejections == [.foreignOrigin: 1])
            #expect(try tracker.store.status().pendingEvents == 0)
        }
    }

    /// A frame tree and the origin a `sensorsanalytics://` navigation of one of its frames is credited with.
    struct Navigation: Sendable, CustomStringConvertible {
        var name: String
        var frame: String
        var origins: [String: String]
        var parents: [String: String]
        var credited: String
        var description: String { name }
    }

    static let trusted = "http://127.0.0.1:8080"
    static let foreign = "http://localhost:9090"
    static let navigations: [Navigation] = [
        Navigation(
            name: "a trusted frame navigating itself", frame: "top", origins: ["top": trusted], parents: [:],
            credited: trusted),
        Navigation(
            name: "a fresh iframe speaks for the trusted page that made it", frame: "fresh", origins: ["top": trusted],
            parents: ["fresh": "top"], credited: trusted),
        Navigation(
            name: "an opaque (sandboxed, srcdoc) iframe navigating itself is credited with its own origin",
            frame: "sandboxed", origins: ["top": trusted, "sandboxed": "null"], parents: ["sandboxed": "top"],
            credited: "null"),
        Navigation(
            name: "a fresh iframe of an opaque frame", frame: "fresh",
            origins: ["top": trusted, "sandboxed": "null"], parents: ["fresh": "sandboxed", "sandboxed": "top"],
            credited: "null"),
        Navigation(
            name: "a foreign frame navigating its trusted child", frame: "child",
            origins: ["top": foreign, "child": trusted], parents: ["child": "top"], credited: foreign),
    ]

    @Test("a legacy navigation is credited with the frame's own origin, opaque ones included", arguments: navigations)
    func navigationOrigin(_ case_: Navigation) {
        #expect(
            WebViewHost.navigationOrigin(
                frame: case_.frame, origins: case_.origins, parents: case_.parents, trusted: [Self.trusted])
                == case_.credited)
    }

    @Test("in the browser, a sandboxed iframe's legacy navigation is refused; a same-origin srcdoc iframe's is not")
    func sandboxedLegacyNavigation() async throws {
        // The page makes two srcdoc iframes that load sensorsanalytics://trackEvent themselves: one
        // sandboxed (an opaque origin), one not (its parent's origin). Each waits for the injected
        // script first: Chromium puts a sandboxed iframe in a process of its own and does not always
        // hold its first document until the host has set it up.
        let page = """
            <!doctype html><html><body><script>
            (function start() {
              var bridge = window.SensorsData_iOS_JS_Bridge;
              if (!bridge) { setTimeout(start, 10); return; }
              function frame(name, sandboxed) {
                var event = JSON.stringify({ type: 'track', event: name, time: Date.now(), distinct_id: 'page-anon',
                  anonymous_id: 'page-anon', lib: { $lib: 'js' }, properties: {}, server_url: bridge.sensorsdata_app_server_url });
                var iframe = document.createElement('iframe');
                if (sandboxed) { iframe.setAttribute('sandbox', 'allow-scripts'); }
                var url = 'sensorsanalytics://trackEvent?event=' + encodeURIComponent(event);
                iframe.srcdoc = '<script>(function go() { if (!window.SensorsData_iOS_JS_Bridge) { setTimeout(go, 10); return; }'
                  + ' location.href = ' + JSON.stringify(url) + '; })();</' + 'script>';
                document.body.appendChild(iframe);
              }
              frame('FromSameOrigin', false);
              frame('FromSandboxed', true);
            })();
            </script></body></html>
            """
        try await BrowserHarness.run(pages: ["/": page]) { harness in
            try await harness.wait(for: "both navigations") {
                harness.bridge.snapshot.accepted + harness.bridge.rejections.values.reduce(0, +) == 2
            }
            #expect(harness.bridge.snapshot.accepted == 1)
            #expect(harness.bridge.rejections == [.foreignOrigin: 1])
            #expect(harness.bridge.snapshot.received == [harness.origin: 1, "null": 1])
            let stored = try harness.tracker.store.events(limit: 10).map {
                String(decoding: try $0.record.get().body, as: UTF8.self)
            }
            #expect(stored.count == 1 && stored.allSatisfy { $0.contains(#""event":"FromSameOrigin""#) })
        }
    }
}

extension WebViewHostTests {
    @Test("in the browser, a page cycling cross-site iframes: the host's frame records and commands stay bounded, and nothing is logged as a warning")
    func iframeChurn() async throws {
        // Each round adds an iframe from another site (localhost against 127.0.0.1: a process, and a
        // target, of its own under site isolation) holding an iframe of its own, lets it load, and
        // removes it. Then the page posts one event, and the host has handled every event before it.
        let rounds = 8  // a renderer process each: more would load the machine for other suites
        let page = """
            <!doctype html><html><body><script>
            var round = 0;
            function next() {
              if (round === \(rounds)) {
                window.webkit.messageHandlers.sensorsdataNativeTracker.postMessage(JSON.stringify({
                  callType: 'app_h5_track', data: { type: 'track', event: 'ChurnDone', time: Date.now(),
                  distinct_id: 'page-anon', anonymous_id: 'page-anon', lib: { $lib: 'js' }, properties: {},
                  server_url: window.SensorsData_iOS_JS_Bridge.sensorsdata_app_server_url } }));
                return;
              }
              round += 1;
              var iframe = document.createElement('iframe');
              iframe.onload = function () { setTimeout(function () { iframe.remove(); setTimeout(next, 20); }, 50); };
              iframe.src = 'http://localhost:' + location.port + '/child?' + round;
              document.body.appendChild(iframe);
            }
            (function start() { if (!window.webkit) { setTimeout(start, 10); return; } next(); })();
            </script></body></html>
            """
        let child = "<!doctype html><html><body><iframe srcdoc='<p>inner</p>'></iframe></body></html>"
        let logs = CapturedLogs()
        try await BrowserHarness.run(
            pages: ["/": page, "/child": child], hostLogger: Logger(label: "test") { _ in logs }
        ) { harness in
            try await harness.wait(for: "the page's event after the churn") { harness.bridge.snapshot.accepted == 1 }
            // The iframes' ends come from their own targets and the browser, and may trail the page's message.
            try await harness.wait(for: "the frames' ends") {
                let origins = harness.host.origins.get()
                return origins.frames.count <= 2 && origins.parents.isEmpty && harness.host.unansweredCommands == 0
            }
            let origins = harness.host.origins.get()
            // Left: the frame and context of the page and of the browser's first tab (about:blank);
            // every iframe's went with it.
            #expect(origins.frames.count == 2, "\(origins.frames)")
            #expect(origins.parents.isEmpty, "\(origins.parents)")
            #expect(origins.contexts.count == 2, "\(origins.contexts)")
            #expect(harness.host.unansweredCommands == 0)
        }
        let lines = logs.store.lines.withLock { $0 }
        // Each cross-site iframe's target was set up before its first document: the script run for a
        // document already there found none, which is expected, and logged for debugging only.
        #expect(lines.filter { $0.hasPrefix("debug DevTools command failed") }.count >= rounds, "\(lines)")
        #expect(!lines.contains { $0.hasPrefix("warning") || $0.hasPrefix("error") }, "\(lines)")
    }
}
