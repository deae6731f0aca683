import Foundation
import Hummingbird
import Logging
import Synchronization

/// The hybrid simulator's test pages, served from loopback, and the small JavaScript client that
/// speaks the Sensors JavaScript SDK's iOS bridge protocol.
///
/// Each frame of a page reports `GET /done?role=…&posted=…` once it has posted its messages, so the
/// simulator knows how many messages to wait for.
final class PageServer: Sendable {
    private struct State {
        var done: [String: Int] = [:]
    }

    private let state = Mutex(State())

    /// Roles that have reported, with the number of messages each posted.
    var reported: [String: Int] { state.withLock { $0.done } }

    private func report(_ role: String, posted: Int) { state.withLock { $0.done[role] = posted } }

    /// Serves the pages on 127.0.0.1 until the task is cancelled; `onListening` receives the port.
    func run(onListening: @escaping @Sendable (Int) async -> Void) async throws {
        let router = Router()
        router.get("/tributary-h5.js") { _, _ in Self.response(PageScripts.client, type: "text/javascript") }
        router.get("/page.html") { _, _ in Self.response(PageScripts.page, type: "text/html") }
        router.get("/done") { [self] request, _ in
            let role = request.uri.queryParameters.get("role") ?? "?"
            let posted = request.uri.queryParameters.get("posted").flatMap { Int($0) } ?? 0
            self.report(role, posted: posted)
            return Self.response("ok", type: "text/plain")
        }
        var logger = Logger(label: "tributary.sim.pages")
        logger.logLevel = .critical  // cancellation at exit is logged as an error by the server
        let application = Application(
            router: router,
            configuration: ApplicationConfiguration(
                address: .hostname("127.0.0.1", port: 0), serverName: "tributary-sim"),
            onServerRunning: { channel in await onListening(channel.localAddress?.port ?? 0) },
            logger: logger)
        try await application.run()
    }

    private static func response(_ text: String, type: String) -> Response {
        Response(
            status: .ok, headers: [.contentType: type + "; charset=utf-8", .cacheControl: "no-store"],
            body: ResponseBody(byteBuffer: ByteBuffer(string: text)))
    }
}

/// The page sources.
enum PageScripts {
    /// The JavaScript client: a tiny analytics SDK that hands its events to the app, as the Sensors
    /// JavaScript SDK's iOS bridge plugin does.
    static let client = #"""
        (function () {
          function rand() { return Math.random().toString(36).slice(2, 10); }
          function serverOf(url) {
            try {
              var u = new URL(url);
              return { host: u.hostname.toLowerCase(), project: u.searchParams.get('project') || 'default' };
            } catch (e) { return null; }
          }
          function TributaryH5(options) {
            this.serverURL = options.serverURL;
            this.anonymousID = 'h5-' + rand();
            this.distinctID = this.anonymousID;
            this.loginID = null;
            this.posted = 0;
          }
          // The event the web SDK would send, with what it guesses from the user agent.
          TributaryH5.prototype.event = function (type, name, properties) {
            var now = Date.now();
            var props = {
              $os: 'iOS', $os_version: '17.0', $model: 'iPhone', $manufacturer: 'Apple', $app_version: 'h5-guess',
              $lib: 'js', $lib_version: '1.27.10', $screen_width: 390, $url: location.href, $title: document.title,
              $project: 'page-project', $token: 'page-token', app_channel: 'page', page_time: now
            };
            for (var k in (properties || {})) { props[k] = properties[k]; }
            var data = {
              type: type, event: name, time: now, distinct_id: this.distinctID, anonymous_id: this.anonymousID,
              lib: { $lib: 'js', $lib_method: 'code', $lib_version: '1.27.10' }, properties: props,
              _nocache: String(Math.random()).slice(2), server_url: this.serverURL
            };
            if (this.loginID) { data.login_id = this.loginID; }
            return data;
          };
          // Is the app's bridge there, and for our server (host and project)? The JS SDK's own check.
          TributaryH5.prototype.bridgeVerified = function () {
            var bridge = window.SensorsData_iOS_JS_Bridge;
            var handlers = window.webkit && window.webkit.messageHandlers;
            if (!bridge || !handlers || !handlers.sensorsdataNativeTracker) { return false; }
            var app = serverOf(bridge.sensorsdata_app_server_url), mine = serverOf(this.serverURL);
            return !!app && !!mine && app.host === mine.host && app.project === mine.project;
          };
          // Posts a raw message string through the message handler.
          TributaryH5.prototype.post = function (text) {
            window.webkit.messageHandlers.sensorsdataNativeTracker.postMessage(text);
            this.posted++;
          };
          TributaryH5.prototype.send = function (data) {
            this.post(JSON.stringify({ callType: 'app_h5_track', data: data }));
          };
          TributaryH5.prototype.track = function (name, properties) {
            this.send(this.event('track', name, properties));
          };
          TributaryH5.prototype.login = function (id) {
            this.distinctID = id;
            this.loginID = id;
            var data = this.event('track_signup', '$SignUp', {});
            data.original_id = this.anonymousID;
            this.send(data);
          };
          // A user-profile operation (profile_set_once, …), as the web SDK's setOnceProfile etc. send it.
          TributaryH5.prototype.profile = function (type, properties) {
            var data = {
              type: type, time: Date.now(), distinct_id: this.distinctID, anonymous_id: this.anonymousID,
              lib: { $lib: 'js', $lib_method: 'code', $lib_version: '1.27.10' },
              properties: Object.assign({ $is_login_id: !!this.loginID }, properties || {}),
              _nocache: String(Math.random()).slice(2), server_url: this.serverURL
            };
            if (this.loginID) { data.login_id = this.loginID; }
            this.send(data);
          };
          // The legacy channel: the app marked its user agent; events travel as a navigation.
          TributaryH5.legacyMarker = function () {
            var m = / \/sa-sdk-ios\/sensors-verify\/([^ ?]+)\?([^ ]+)/.exec(navigator.userAgent);
            return m ? { host: m[1], project: m[2] } : null;
          };
          TributaryH5.prototype.trackLegacy = function (name, properties) {
            var frame = document.createElement('iframe');
            frame.style.display = 'none';
            frame.src = 'sensorsanalytics://trackEvent?event=' +
              encodeURIComponent(JSON.stringify(this.event('track', name, properties)));
            document.documentElement.appendChild(frame);
            this.posted++;
            setTimeout(function () { frame.remove(); }, 100);
          };
          // Resolves once the app's bridge is there (at most `ms`): the app may add it just after the
          // document starts, as an app does that sets up its web view's bridge late.
          TributaryH5.prototype.ready = async function (ms) {
            for (var waited = 0; waited < ms; waited += 10) {
              var handlers = window.webkit && window.webkit.messageHandlers;
              if (window.SensorsData_iOS_JS_Bridge && handlers && handlers.sensorsdataNativeTracker) { return true; }
              await new Promise(function (r) { setTimeout(r, 10); });
            }
            return false;
          };
          TributaryH5.prototype.done = function (role) {
            return fetch('/done?role=' + encodeURIComponent(role) + '&posted=' + this.posted);
          };
          window.TributaryH5 = TributaryH5;
        })();
        """#

    /// One page for every role; `?role=` chooses what it does, `?frames=` which iframes it embeds.
    static let page = #"""
        <!doctype html>
        <html><head><meta charset="utf-8"><title>Tributary hybrid page</title>
        <script src="/tributary-h5.js"></script></head>
        <body><script>
        (async function () {
          var q = new URLSearchParams(location.search);
          var role = q.get('role'), n = +(q.get('events') || 0), rate = +(q.get('rate') || 0);
          var seed = +(q.get('seed') || 1), maxBytes = +(q.get('max') || 65536);
          var sdk = new TributaryH5({ serverURL: q.get('server') });
          await sdk.ready(5000);
          function next() { seed = (seed * 1103515245 + 12345) % 2147483648; return seed; }
          function sleep(ms) { return new Promise(function (r) { setTimeout(r, ms); }); }
          (q.get('frames') || '').split(' ').filter(Boolean).forEach(function (src) {
            var frame = document.createElement('iframe');
            frame.src = src;
            document.body.appendChild(frame);
          });
          async function trackAll(name) {
            for (var i = 0; i < n; i++) {
              sdk.track(name, { frame: role, index: i, choice: next() % 10 });
              if (rate > 0) { await sleep(1000 / rate); }
            }
          }
          if (role === 'main' && q.get('scenario') === 'all') {
            sdk.post('not json at all');
            sdk.post(JSON.stringify({ callType: 'app_h5_track' }));
            sdk.post(JSON.stringify({ callType: 'app_h5_track',
              data: sdk.event('track', 'Oversized', { padding: 'x'.repeat(maxBytes) }) }));
            sdk.post(JSON.stringify({ callType: 'visualized_track', data: {} }));
            sdk.send(sdk.event('track', 'Bad Name!', {}));
            var forged = sdk.event('track', 'H5View', { frame: 'forged' });
            forged.distinct_id = 'someone-else';
            sdk.send(forged);
            var claimed = sdk.event('track', 'H5View', { frame: 'claimed-login' });
            claimed.login_id = 'user-evil';
            sdk.send(claimed);
            sdk.login('h5-user-7');
            sdk.profile('profile_set_once', { $first_visit_time: '2026-01-01 10:00:00.000', first_frame: 'main' });
            sdk.profile('profile_increment', { visits: 2 });
            sdk.profile('profile_increment', { visits: 'many' });
          }
          if (role === 'main' || role === 'iframe') {
            if (sdk.bridgeVerified()) { await trackAll('H5View'); }
          } else if (role === 'foreign' || role === 'other-project') {
            // A page that posts whatever the app says: the native side must refuse it.
            for (var i = 0; i < 2; i++) { sdk.track('H5View', { frame: role, index: i }); }
            if (role === 'foreign') { sdk.trackLegacy('H5Legacy', { frame: role, index: 0 }); }
          } else if (role === 'hijacker') {
            // A foreign frame that embeds a whitelisted page and navigates it to sensorsanalytics://
            // (a frame may navigate its children): the native side must credit it to this frame.
            await new Promise(function (resolve) {
              var child = document.createElement('iframe');
              child.onload = function () {
                child.onload = null;
                child.src = 'sensorsanalytics://trackEvent?event=' +
                  encodeURIComponent(JSON.stringify(sdk.event('track', 'H5Legacy', { frame: 'hijacked', index: 0 })));
                sdk.posted++;
                setTimeout(resolve, 200);
              };
              child.src = q.get('child');
              document.body.appendChild(child);
            });
          } else if (role === 'legacy') {
            var marker = TributaryH5.legacyMarker(), mine = new URL(sdk.serverURL);
            if (marker && marker.host === mine.hostname && marker.project === (mine.searchParams.get('project') || 'default')) {
              for (var j = 0; j < 2; j++) { sdk.trackLegacy('H5Legacy', { frame: role, index: j }); await sleep(150); }
            }
          }
          // The hijacker's child is navigated away before it could report.
          if (role !== 'idle') { await sdk.done(role); }
        })();
        </script></body></html>
        """#
}
