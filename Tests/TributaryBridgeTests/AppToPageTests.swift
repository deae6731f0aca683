import Foundation
import Testing
import Tributary
import TributaryStore

@testable import TributaryBridge

/// The app to page direction in a real browser: the app's info pushed after a load (scheme 1) and asked
/// for (scheme 2, message handler and legacy channel), KKJSBridge-style calls with answers, errors and
/// time-outs, replies only in the asking frame, a foreign frame given nothing, refusals counted.
@Suite("App to page", .serialized)
struct AppToPageTests {
    /// What every test page shares: a log of what the app handed it, `call` as a promise, and `report`,
    /// which tracks the log as an event (the test reads it from the store).
    static let common = """
        var log = { pushes: [], replies: [] };
        window.sensorsdata_app_js_bridge_call_js = function (text) { log.pushes.push(JSON.parse(text)); };
        function sleep(ms) { return new Promise(function (r) { setTimeout(r, ms); }); }
        function call(m, f, p, options) {
          return new Promise(function (r) { window.TributaryJSBridge.call(m, f, p, r, options); });
        }
        async function ready() {
          while (!window.TributaryJSBridge || !window.webkit || !window.webkit.messageHandlers) { await sleep(10); }
        }
        function report(name, extra) {
          var server = window.SensorsData_iOS_JS_Bridge.sensorsdata_app_server_url;
          var properties = { log: JSON.stringify(log) };
          for (var k in (extra || {})) { properties[k] = extra[k]; }
          window.webkit.messageHandlers.sensorsdataNativeTracker.postMessage(JSON.stringify({ callType: 'app_h5_track',
            data: { type: 'track', event: name, time: Date.now(), distinct_id: 'page-anon', anonymous_id: 'page-anon',
              lib: { $lib: 'js' }, properties: properties, server_url: server } }));
        }
        """

    /// The page the app opens (http://127.0.0.1:PORT); its foreign iframe is http://localhost:PORT, not trusted.
    static let main = """
        <!doctype html><html><body><script>\(common)
        var foreignLog = null;
        window.addEventListener('message', function (e) { foreignLog = e.data; });
        (async function () {
          await ready();
          var child = document.createElement('iframe');
          child.src = '/child.html';
          document.body.appendChild(child);
          var outsider = document.createElement('iframe');
          outsider.src = 'http://localhost:' + location.port + '/foreign.html';
          document.body.appendChild(outsider);
          log.info = await call('app', 'info', {});
          log.identity = await call('app', 'identity', {});
          log.track = await call('tracker', 'track', { event: 'FromCall', properties: { via: 'call' } });
          log.profile = await call('tracker', 'profileSet', { properties: { name: 'Ada' } });
          log.badProfile = await call('tracker', 'profileIncrement', { properties: { visits: 'many' } });
          log.flush = await call('tracker', 'flush', {});
          log.unknownModule = await call('camera', 'open', {});
          log.unknownMethod = await call('app', 'reboot', {});
          log.oversized = await call('app', 'info', { pad: 'x'.repeat(5000) }, { timeout: 700 });
          window.__tributaryNativeCall(JSON.stringify({ module: 'app', method: 'info', data: {}, callbackId: 'abc' }));
          window.__tributaryNativeCall(JSON.stringify({ module: 'app', method: 'info', data: {}, callbackId: 2 }));
          var before = log.pushes.length;
          window.webkit.messageHandlers.sensorsdataNativeTracker.postMessage(JSON.stringify({ callType: 'getAppInfo' }));
          var legacy = document.createElement('iframe');
          legacy.style.display = 'none';
          legacy.src = 'sensorsanalytics://getAppInfo';
          document.body.appendChild(legacy);
          for (var i = 0; i < 300 && (foreignLog === null || log.pushes.length < before + 2); i++) { await sleep(10); }
          report('MainSaw', { foreign: foreignLog, asked: log.pushes.length - before });
        })();
        </script></body></html>
        """

    /// A trusted child frame: its first call has callback id 1 as the main frame's does, another method.
    static let child = """
        <!doctype html><html><body><script>\(common)
        (async function () {
          await ready();
          log.first = await call('tracker', 'track', { event: 'ChildCall', properties: {} });
          log.second = await call('app', 'identity', {});
          await sleep(300);
          report('ChildSaw');
        })();
        </script></body></html>
        """

    /// A frame of an origin the app does not trust: it asks for everything and must get nothing.
    static let foreignFrame = """
        <!doctype html><html><body><script>\(common)
        (async function () {
          await ready();
          log.call = await call('app', 'identity', {}, { timeout: 700 });
          window.webkit.messageHandlers.sensorsdataNativeTracker.postMessage(JSON.stringify({ callType: 'getAppInfo' }));
          await sleep(300);
          window.parent.postMessage(JSON.stringify(log), '*');
        })();
        </script></body></html>
        """

    static func object(_ text: Any?) -> [String: Any] {
        guard let text = text as? String else { return [:] }
        return (try? JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any]) ?? [:]
    }

    @Test("app info pushed and asked for, calls answered in the asking frame only, a foreign frame given nothing")
    func appToPage() async throws {
        try await BrowserHarness.run(
            pages: ["/app.html": Self.main, "/child.html": Self.child, "/foreign.html": Self.foreignFrame], open: "/app.html",
            configure: { $0.maxMessageBytes = 4096 }
        ) { harness in
            let store = harness.tracker.store
            func stored() throws -> [[String: Any]] {
                try store.events(limit: 100).map { entry in
                    (try JSONSerialization.jsonObject(with: Data(try entry.record.get().body)) as? [String: Any]) ?? [:]
                }
            }
            try await harness.wait(for: "both frames' reports") {
                let names = Set(((try? stored()) ?? []).compactMap { $0["event"] as? String })
                return names.isSuperset(of: ["MainSaw", "ChildSaw"])
            }
            let records = try stored()
            let identity = try harness.tracker.identity()
            func properties(_ name: String) -> [String: Any] {
                records.first { $0["event"] as? String == name }?["properties"] as? [String: Any] ?? [:]
            }
            let main = Self.object(properties("MainSaw")["log"])
            let child = Self.object(properties("ChildSaw")["log"])

            // Scheme 1 (after the load) and scheme 2 (message handler, legacy channel): the app's identity.
            let pushes = main["pushes"] as? [[String: Any]] ?? []
            #expect(pushes.count >= 3, "\(pushes)")
            #expect(properties("MainSaw")["asked"] as? Int == 2, "getAppInfo answered on both channels")
            for push in pushes {
                #expect(push["anonymous_id"] as? String == identity.anonymousID && push["type"] as? String == "linux")
                #expect(push["server_url"] as? String == BrowserHarness.server)
            }
            #expect((child["pushes"] as? [Any])?.isEmpty == false, "the trusted child frame got the push after its load")

            // Calls: answers, errors, the page-side time-out.
            func data(_ key: String, in log: [String: Any] = main) -> [String: Any] {
                (log[key] as? [String: Any])?["data"] as? [String: Any] ?? [:]
            }
            func error(_ key: String, in log: [String: Any] = main) -> String? {
                ((log[key] as? [String: Any])?["error"] as? [String: Any])?["code"] as? String
            }
            #expect(data("info")["anonymous_id"] as? String == identity.anonymousID)
            #expect(data("identity")["distinct_id"] as? String == identity.distinctID)
            let trackedID = try #require(data("track")["event_id"] as? String)
            #expect(data("profile")["event_id"] is String)
            #expect(error("badProfile") == "rejected")
            #expect(data("flush")["requested"] is Bool)
            #expect(error("unknownModule") == "unknown_module" && error("unknownMethod") == "unknown_method")
            #expect(error("oversized") == "timeout", "an oversized call is refused unanswered: the page times out")

            // Replies reach only the asking frame: both frames' first call had callback id 1.
            let childTracked = try #require(data("first", in: child)["event_id"] as? String)
            #expect(childTracked != trackedID)
            #expect(data("second", in: child)["distinct_id"] as? String == identity.distinctID)

            // The foreign frame got nothing: no push, no answer (its call timed out).
            let foreign = Self.object(properties("MainSaw")["foreign"] as? String)
            #expect((foreign["pushes"] as? [Any])?.isEmpty == true, "\(foreign)")
            #expect(error("call", in: foreign) == "timeout", "\(foreign)")

            // What the calls stored: through the tracker, as page records, marked H5.
            let fromCall = try #require(records.first { $0["event"] as? String == "FromCall" })
            #expect(fromCall["event_id"] as? String == trackedID && fromCall["_hybrid_h5"] as? Bool == true)
            #expect(records.contains { $0["event"] as? String == "ChildCall" })
            let profile = try #require(records.first { $0["type"] as? String == "profile_set" })
            #expect((profile["properties"] as? [String: Any])?["name"] as? String == "Ada")
            #expect(!records.contains { $0["type"] as? String == "profile_increment" }, "a refused call stores nothing")

            // Every refusal counted once, by reason.
            let counts = harness.bridge.snapshot
            #expect(
                counts.rejected == [
                    .forgedCallbackID: 1, .repeatedCallbackID: 1, .messageTooLarge: 1, .unknownModule: 1,
                    .unknownMethod: 1, .foreignOrigin: 2,
                ], "\(counts.rejected)")
            // main: 6 calls answered (2 more answered with errors are refusals), 2 app infos asked for; the
            // child: 2 calls. And a push after each trusted frame's load (main, child, the legacy iframe's
            // blank document), not page messages.
            #expect(counts.answered == 6 + 2 + 2, "\(counts)")
            #expect(counts.pushed >= 2, "\(counts)")
        }
    }
}
