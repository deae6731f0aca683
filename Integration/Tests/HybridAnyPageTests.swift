import Foundation
import Testing
import TributaryStore
import TributaryTestSupport

/// `tributary-sim hybrid --url`: a page the test serves on loopback (never the internet), opened in
/// real headless Chromium with the bridge, as an app opens its H5 page.
@Suite("tributary-sim hybrid --url", .serialized)
struct HybridAnyPageTests {
    /// A page that posts through the bridge as the Sensors JavaScript SDK's iOS bridge does: events for
    /// the app's server and for a second allowed one, a profile_set_once, and what the bridge refuses; it
    /// embeds a frame of another port (not trusted) that posts too.
    static func page(foreignFrame: String) -> String {
        """
        <!doctype html><html><head><title>any page</title></head><body><script>
        (function post() {
          var h = window.webkit && window.webkit.messageHandlers;
          if (!h || !h.sensorsdataNativeTracker) { setTimeout(post, 10); return; }
          var app = window.SensorsData_iOS_JS_Bridge.sensorsdata_app_server_url;
          function send(type, name, server, properties) {
            var data = { type: type, time: Date.now(), distinct_id: 'page-anon', anonymous_id: 'page-anon',
              lib: { $lib: 'js', $lib_version: '1.27.10' }, properties: properties || {}, server_url: server };
            if (name) { data.event = name; }
            h.sensorsdataNativeTracker.postMessage(JSON.stringify({ callType: 'app_h5_track', data: data }));
          }
          send('track', '$pageview', app, { $url: location.href });
          send('track', 'AddToCart', app, { price: 9.5 });
          send('track', 'Shared', 'https://sb.example.com/sa?project=shop', {});
          send('profile_set_once', null, app, { $first_visit_time: '2026-01-01 10:00:00.000' });
          send('track', 'Elsewhere', 'https://sa.example.com/sa?project=other', {});
          send('item_set', null, app, {});
          h.sensorsdataNativeTracker.postMessage('not json');
          var frame = document.createElement('iframe');
          frame.src = '\(foreignFrame)';
          document.body.appendChild(frame);
        })();
        </script></body></html>
        """
    }

    static let foreignFrame = """
        <!doctype html><html><body><script>
        (function post() {
          var h = window.webkit && window.webkit.messageHandlers;
          if (!h || !h.sensorsdataNativeTracker) { setTimeout(post, 10); return; }
          h.sensorsdataNativeTracker.postMessage(JSON.stringify({ callType: 'app_h5_track', data: {} }));
        })();
        </script></body></html>
        """

    @Test("records what any page sends, for the page's origin and the servers allowed, and prints the counts by reason")
    func anyPage() async throws {
        try await withTemporaryGroup { group in
            try await withTestPages(["/frame.html": Self.foreignFrame]) { foreignPort in
                let page = Self.page(foreignFrame: "http://localhost:\(foreignPort)/frame.html")
                try await withTestPages(["/shop/index.html": page]) { port in
                    let ledger = group + "-ledger"
                    let sim = try await ChildProcess.run(
                        "tributary-sim",
                        [
                            "hybrid", "--group", group, "--url", "http://127.0.0.1:\(port)/shop/index.html",
                            "--server-url", "https://sa.example.com/sa?project=shop",
                            "--allow-server-url", "https://sb.example.com/sa?project=shop", "--duration", "4",
                            "--ledger", ledger,
                        ])
                    #expect(sim.status == 0, "\(sim.stderr)")
                    let line = try #require(sim.stdout.split(separator: "\n").first { $0.hasPrefix("BRIDGE ") })
                    let summary = try #require(
                        try JSONSerialization.jsonObject(with: Data(line.dropFirst(7).utf8)) as? [String: Any])
                    #expect(summary["accepted"] as? Int == 4, "\(line)")
                    #expect(
                        summary["rejected"] as? [String: Int] == [
                            "foreign_project": 1, "unsupported_type": 1, "malformed_message": 1, "foreign_origin": 1,
                        ], "\(line)")
                    #expect(sim.stderr.contains("accepted 4, foreign_origin 1"), "\(sim.stderr)")
                    // Every accepted record is in the store and the ledger, once.
                    let store = try openExistingStore(group)
                    let bodies = try store.events(limit: 100).map { entry in
                        try JSONSerialization.jsonObject(with: Data(try entry.record.get().body)) as? [String: Any]
                    }
                    #expect(bodies.map { $0?["event"] as? String ?? $0?["type"] as? String } == [
                        "$pageview", "AddToCart", "Shared", "profile_set_once",
                    ])
                    #expect(Oracle.Ledger(producer: "hybrid", path: ledger).entries().count == 4)
                }
            }
        }
    }

    @Test("--url options are checked: a bad URL, an origin that can never be trusted, --duration without --url", arguments: [
        (["--url", "file:///etc/passwd"], "--url must be an absolute http or https URL"),
        (["--url", "http://127.0.0.1:1/", "--allow-origin", "127.0.0.1:8080"], "--allow-origin"),
        (["--url", "http://127.0.0.1:1/", "--duration", "0"], "--duration must be more than 0"),
        (["--duration", "3"], "--duration needs --url"),
        (["--allow-origin", "http://127.0.0.1:1"], "--allow-origin needs --url"),
        (["--allow-server-url", "nohost"], "--allow-server-url"),
    ])
    func badOptions(arguments: [String], message: String) async throws {
        let result = try await ChildProcess.run("tributary-sim", ["hybrid", "--group", "/tmp/tributary-none"] + arguments)
        #expect(result.status == 64, "\(result.stderr)")
        #expect(result.stderr.contains(message), "\(result.stderr)")
    }
}
