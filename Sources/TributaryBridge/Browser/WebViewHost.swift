import Foundation
import Logging
import Synchronization

/// Plays the WKWebView's part for the bridge, in headless Chromium over the DevTools protocol.
///
/// | WKWebView (iOS SDK)                                   | here (DevTools protocol)                          |
/// | ----------------------------------------------------- | ------------------------------------------------- |
/// | `WKUserScript` at document start, all frames          | `Page.addScriptToEvaluateOnNewDocument`, per target |
/// | `WKScriptMessageHandler` `sensorsdataNativeTracker`   | `Runtime.addBinding` + `Runtime.bindingCalled`    |
/// | `WKScriptMessage.frameInfo.securityOrigin`            | origin of the binding call's execution context    |
/// | `decidePolicyForNavigationAction` (legacy channel)    | `Page.frameRequestedNavigation`                   |
/// | custom user agent (legacy marker)                     | `Emulation.setUserAgentOverride`                  |
/// | `evaluateJavaScript` in one frame (answers, app info) | `Runtime.evaluate` with the frame's `contextId`   |
/// | `loading` turning false (scheme 1)                    | `Page.frameStoppedLoading`                        |
///
/// Site isolation puts cross-site iframes in processes (targets) of their own; the host auto-attaches
/// to every page and iframe target (`Target.setAutoAttach`, `flatten`, `waitForDebuggerOnStart`) and
/// sets each one up while it waits, so no frame escapes the script or the binding. Chromium does not
/// always hold a new tab's very first document that long; that document gets the script by
/// `Runtime.evaluate` as soon as the tab is set up (a page should check for the bridge before use).
public final class WebViewHost: Sendable {
    /// The binding the injected script forwards `postMessage` to.
    public static let bindingName = "__tributaryNativeTracker"

    /// The trust rules and the server URL the injected script announces.
    public let configuration: BridgeConfiguration
    private let browser: ChromiumProcess
    let pipe: DevToolsPipe
    private let inbox: AsyncStream<Queued>
    private let queue: MessageQueueGauge
    /// What the DevTools reader knows of the browser's contexts and frames (only its thread writes it).
    let origins: SendableBox<FrameOrigins>
    let logger: Logger
    /// The last callback id each execution context ("<session>#<id>") used for a call (run's task only).
    let callbackIDs = SendableBox<[String: Int]>([:])

    /// Starts a headless browser for an app with `configuration`.
    ///
    /// Start it before opening the shared store: the browser is spawned, and a child should never
    /// inherit an open LMDB environment.
    public init(
        configuration: BridgeConfiguration, executable: String? = nil,
        logger: Logger = Logger(label: "tributary.webview")
    ) throws(BrowserError) {
        self.configuration = configuration
        self.logger = logger
        browser = try ChromiumProcess(executable: executable)
        let (stream, continuation) = AsyncStream.makeStream(of: Queued.self)
        inbox = stream
        let queue = MessageQueueGauge(limit: max(configuration.maxQueuedBytes, configuration.maxMessageBytes))
        self.queue = queue
        let trusted = configuration.allowedOrigins
        // Only the reader thread writes it; boxed to be captured.
        let origins = SendableBox(FrameOrigins())
        self.origins = origins
        let maxFrameBytes = Self.maxFrameBytes(for: configuration)
        pipe = DevToolsPipe(browser: browser, maxFrameBytes: maxFrameBytes, logger: logger) { message in
            let queued = origins.update { Self.take(message, origins: &$0, queue: queue, trusted: trusted) }
            guard let queued else { return }
            continuation.yield(queued)
            if message.method == DevToolsPipe.closedEvent { continuation.finish() }
        }
    }

    /// A message for ``run(bridge:)``, with the origin of the frame that sent it (a page message's).
    struct Queued: Sendable {
        var message: DevToolsMessage
        var origin: String
    }

    /// What the DevTools reader does with `message`, in the order the browser sent it: a frame or
    /// context event updates `origins` and goes no further; anything else is queued for
    /// ``run(bridge:)`` if ``admit(_:to:)`` takes it, with the origin it is credited with (resolved here,
    /// against the frames and contexts the browser had reported before it). Frame events are thus never
    /// queued: a page that adds and removes iframes in a loop while ``run(bridge:)`` waits on a commit
    /// piled them up, unbounded.
    static func take(
        _ message: DevToolsMessage, origins: inout FrameOrigins, queue: MessageQueueGauge, trusted: Set<String>
    ) -> Queued? {
        if origins.record(message) { return nil }
        // The end of a trusted frame's loading, for the app's info (scheme 1); any other frame's is not
        // ours. Bounded by the queue like page messages (a page making iframes in a loop), but a full queue
        // skips the push rather than counting a page message as overloaded.
        if message.method == "Page.frameStoppedLoading" {
            guard let frame = message.body["frameId"]?.string, let origin = origins.frames[frame], trusted.contains(origin),
                queue.admitUncounted(loadEventBytes)
            else { return nil }
            return Queued(message: message, origin: origin)
        }
        // Any other message is credited with "null" (it is no page's).
        let isPage = isPageMessage(message)
        let origin = isPage ? origin(of: message, in: origins, trusted: trusted) : "null"
        if isPage {
            // A frame not on the whitelist is refused here, unqueued: its messages neither wait for the
            // commits of trusted ones nor take their room in the queue (a foreign iframe posting as fast
            // as it can got a trusted page's messages dropped as overloaded). They are counted, and the
            // first since ``run(bridge:)`` last took the count queues one marker for it to do so.
            let normalized = BridgeConfiguration.normalizedOrigin(origin)
            if BridgeConfiguration.isOpaque(normalized) || !trusted.contains(normalized) {
                guard queue.countForeign(normalized) else { return nil }
                return Queued(
                    message: DevToolsMessage(id: nil, method: foreignRefusedEvent, sessionID: nil, body: .null, error: nil),
                    origin: "null")
            }
        }
        guard admit(message, to: queue) else { return nil }
        return Queued(message: message, origin: origin)
    }

    /// A page's message: a binding call (one over the frame limit too), a `sensorsanalytics:` navigation.
    static func isPageMessage(_ message: DevToolsMessage) -> Bool {
        queuedBytes(message) != nil
            || (message.method == DevToolsPipe.frameTooLargeEvent && message.body["method"]?.string == "Runtime.bindingCalled")
    }

    /// The marker the DevTools reader queues when page messages of frames not on the whitelist were
    /// refused unread (``MessageQueueGauge/takeForeign()`` has the counts).
    static let foreignRefusedEvent = "Tributary.foreignRefused"

    /// The origin a page message is credited with: its execution context's for a binding call (one too
    /// large to be read too), ``navigationOrigin(frame:origins:parents:trusted:)`` for a navigation;
    /// "null" when it is not known, or for any other message.
    static func origin(of message: DevToolsMessage, in origins: FrameOrigins, trusted: Set<String>) -> String {
        let body = message.body
        switch message.method {
        case "Runtime.bindingCalled", DevToolsPipe.frameTooLargeEvent:
            guard let id = body["executionContextId"]?.int else { return "null" }
            return origins.context(id, session: message.sessionID ?? "")
        case "Page.frameRequestedNavigation":
            guard let frame = body["frameId"]?.string,
                origins.reportedByItsOwnRenderer(frame: frame, session: message.sessionID ?? "", trusted: trusted)
            else { return "null" }
            return navigationOrigin(frame: frame, origins: origins.frames, parents: origins.parents, trusted: trusted)
        default:
            return "null"
        }
    }

    /// The script injected into every frame at document start: the `window.webkit.messageHandlers`
    /// and `window.SensorsData_iOS_JS_Bridge` the Sensors JavaScript SDK looks for.
    public var userScript: String {
        """
        (function () {
          var bridge = window.SensorsData_iOS_JS_Bridge = window.SensorsData_iOS_JS_Bridge || {};
          bridge.sensorsdata_app_server_url = \(JSON.quoted(configuration.serverURL));
          var webkit = window.webkit = window.webkit || {};
          var handlers = webkit.messageHandlers = webkit.messageHandlers || {};
          handlers.sensorsdataNativeTracker = {
            postMessage: function (message) {
              window.\(Self.bindingName)(typeof message === 'string' ? message : JSON.stringify(message));
            }
          };
        })();
        \(Self.callScript)
        """
    }

    /// Opens a page (a new tab) at `url`. Call ``run()`` concurrently; it handles what the page sends.
    /// - Throws: ``BrowserError`` `timedOut` when the browser does not answer one of the three DevTools
    ///   commands this takes within `timeout` each (default 30 s), `browserExited` when it is gone.
    public func open(_ url: String, timeout: Duration = .seconds(30)) async throws {
        let version = try await pipe.call("Browser.getVersion", timeout: timeout)
        let userAgent = (version["userAgent"]?.string ?? "Mozilla/5.0") + configuration.userAgentMarker
        userAgentOverride.set(userAgent)
        _ = try await pipe.call(
            "Target.setAutoAttach",
            ["autoAttach": .bool(true), "waitForDebuggerOnStart": .bool(true), "flatten": .bool(true)],
            timeout: timeout)
        _ = try await pipe.call("Target.createTarget", ["url": .string(url)], timeout: timeout)
    }

    /// What a page message counts against ``BridgeConfiguration/maxQueuedBytes``: a binding call's payload,
    /// a `sensorsanalytics:` navigation's URL (the legacy channel); nil for any other message.
    static func queuedBytes(_ message: DevToolsMessage) -> Int? {
        switch message.method {
        case "Runtime.bindingCalled":
            return max(message.body["payload"]?.string?.utf8.count ?? 0, 1)
        case "Page.frameRequestedNavigation":
            guard let url = message.body["url"]?.string, url.hasPrefix("sensorsanalytics:") else { return nil }
            return url.utf8.count
        default:
            return nil
        }
    }

    /// Whether the DevTools reader queues `message` for ``run(bridge:)``. A page's message (a binding
    /// call, a `sensorsanalytics:` navigation) only while `queue` has room for it; the browser's events
    /// ``run(bridge:)`` handles always; nothing else. What `run` does not handle is not queued: a page
    /// (a foreign frame too) can send console messages, exceptions and other navigations as fast as it
    /// likes, and they piled up, uncounted, while `run` waited on a commit. (Frame and context events
    /// never get here: ``take(_:origins:queue:trusted:)`` takes them in.)
    static func admit(_ message: DevToolsMessage, to queue: MessageQueueGauge) -> Bool {
        if let bytes = queuedBytes(message) { return queue.admit(bytes) }
        // A frame over the limit matters only as a binding call (refused as message_too_large); a page
        // logging multi-MB strings in a loop made one of these per console message.
        if message.method == DevToolsPipe.frameTooLargeEvent {
            return message.body["method"]?.string == "Runtime.bindingCalled"
        }
        return browserEvents.contains(message.method ?? "")
    }

    /// The browser's events ``run(bridge:)`` handles, queued whatever their number: a new target (a tab,
    /// a cross-site iframe's process) to set up, and the end of the browser.
    static let browserEvents: Set<String> = ["Target.attachedToTarget", DevToolsPipe.closedEvent]

    private let userAgentOverride = SendableBox<String>("")

    /// The largest DevTools frame the host reads: `max(6 × maxMessageBytes, 2 MiB) + 64 KiB`.
    ///
    /// A message of `maxMessageBytes` fits even when every byte is escaped (`\u0001` is 6 bytes for
    /// 1), and so does any URL Chromium handles (at most 2 MiB: a frame's `Target.attachedToTarget`
    /// or a legacy navigation is never cut), with 64 KiB for the rest of the frame. A longer frame is
    /// skipped unread; if it is a bridge message, it is refused as `message_too_large`.
    static func maxFrameBytes(for configuration: BridgeConfiguration) -> Int {
        let message = min(max(configuration.maxMessageBytes, 0), Int.max / 8)
        return max(6 * message, 2 << 20) + (64 << 10)
    }

    /// Stops the browser; ``run()`` returns soon after.
    public func close() { browser.terminate() }

    /// A host dropped without ``close()`` stops its browser too. The browser could not stop by itself:
    /// the DevTools reader's thread keeps the pipe, and the pipe the browser, for as long as the browser
    /// runs.
    deinit { browser.terminate() }

    /// How many commands sent without waiting have had no reply yet.
    var unansweredCommands: Int { pipe.unansweredCount }

    /// The browser's process id.
    var browserPID: pid_t { browser.pid }

    /// The browser's profile directory (removed by ``close()``).
    var profileDirectory: String { browser.userDataDirectory }

    /// The browser's process-singleton directory outside the profile (also removed by ``close()``).
    var singletonDirectory: String? { browser.singletonDirectory }

    /// Handles the browser's events in order until the browser goes away: sets up every new target and
    /// hands each bridge message, with the origin of the frame that sent it, to `bridge`.
    public func run(bridge: HybridBridge) async {
        for await queued in inbox {
            let message = queued.message
            let body = message.body
            switch message.method {
            case "Target.attachedToTarget":
                guard let child = body["sessionId"]?.string else { continue }
                let type = body["targetInfo"]?["type"]?.string ?? ""
                if type == "page" || type == "iframe" { setUp(session: child) }
                pipe.send("Runtime.runIfWaitingForDebugger", session: child)
            case "Runtime.bindingCalled":
                let payload = body["payload"]?.string ?? ""
                if let id = body["executionContextId"]?.int {
                    let caller = FrameOrigins.Context(session: message.sessionID ?? "", id: id)
                    if body["name"]?.string == Self.callBindingName {
                        await handleCall(payload, origin: queued.origin, caller: caller, bridge: bridge)
                    } else if body["name"]?.string == Self.bindingName {
                        if HybridBridge.isAppInfoRequest(payload) {
                            pushAppInfo(to: caller, askedBy: queued.origin, bridge: bridge)  // scheme 2, message handler
                        } else {
                            await bridge.receive(payload, origin: queued.origin, channel: .messageHandler)
                        }
                    }
                }
                queue.release(Self.queuedBytes(message) ?? 0)
                bridge.refuseOverloaded(queue.takeDropped())
            case "Page.frameStoppedLoading":
                queue.release(Self.loadEventBytes)
                if let frame = body["frameId"]?.string { frameLoaded(frame, bridge: bridge) }
            case Self.foreignRefusedEvent:
                bridge.refuseForeign(queue.takeForeign())
            case DevToolsPipe.frameTooLargeEvent:
                let bytes = body["bytes"]?.int ?? 0
                guard body["method"]?.string == "Runtime.bindingCalled" else {
                    logger.warning(
                        "DevTools frame over the limit skipped unread",
                        metadata: [
                            "tributary.devtools.method": "\(body["method"]?.string ?? "?")",
                            "tributary.devtools.bytes": "\(bytes)",
                        ])
                    continue
                }
                bridge.refuseUnread(byteCount: bytes, origin: queued.origin, channel: .messageHandler)
            case "Page.frameRequestedNavigation":
                // Only sensorsanalytics: navigations are queued (queuedBytes), and counted until handled here.
                defer {
                    queue.release(Self.queuedBytes(message) ?? 0)
                    bridge.refuseOverloaded(queue.takeDropped())
                }
                guard let url = body["url"]?.string, let frame = body["frameId"]?.string else { continue }
                if url.hasPrefix(Self.legacyAppInfoPrefix) {
                    legacyAppInfo(frame: frame, origin: queued.origin, bridge: bridge)  // scheme 2, legacy channel (origin trusted: the reader checked)
                } else if await bridge.receiveNavigation(url, origin: queued.origin) == nil {
                    logger.debug("navigation to another sensorsanalytics:// action ignored")
                }
            default:
                continue
            }
        }
        bridge.refuseOverloaded(queue.takeDropped())  // dropped after the last message handled
    }

    private func setUp(session: String) {
        pipe.send("Runtime.enable", session: session)
        pipe.send("Page.enable", session: session)
        pipe.send("Runtime.addBinding", ["name": .string(Self.bindingName)], session: session)
        pipe.send("Runtime.addBinding", ["name": .string(Self.callBindingName)], session: session)
        pipe.send("Page.addScriptToEvaluateOnNewDocument", ["source": .string(userScript)], session: session)
        // Chromium does not always hold a new tab's first document until the target is set up: a
        // document that exists already gets the script now (the binding reaches existing contexts).
        // A target held before its first document (every cross-site iframe) has no context to run it
        // in, and says so: the script above covers that document, so the failure is not a warning.
        pipe.send("Runtime.evaluate", ["expression": .string(userScript)], session: session, failureLevel: .debug)
        pipe.send("Emulation.setUserAgentOverride", ["userAgent": .string(userAgentOverride.get())], session: session)
        pipe.send(
            "Target.setAutoAttach",
            ["autoAttach": .bool(true), "waitForDebuggerOnStart": .bool(true), "flatten": .bool(true)], session: session
        )
    }

    /// The origin a `sensorsanalytics://` navigation of `frame` is credited with.
    ///
    /// A frame navigating itself has a document; a fresh iframe (the legacy SDK's way) has none yet,
    /// and speaks for the document that created it. Only a frame with no origin recorded is taken for
    /// a fresh one: a document with an opaque origin (`null`: a sandboxed iframe, `srcdoc` or not, a
    /// `data:` document) speaks for itself, and is refused, as opaque origins always are; skipping it
    /// would credit its navigation to its parent. But a frame may also navigate its child frames,
    /// and Chromium reports such a navigation with the child's frame id, not the initiator's: a foreign
    /// frame could embed a whitelisted page and navigate it to `sensorsanalytics://`. So every frame
    /// above must be whitelisted too: the navigation is credited with the first origin up the chain that
    /// is not (and the bridge refuses it), else with the frame's own.
    static func navigationOrigin(
        frame: String, origins: [String: String], parents: [String: String], trusted: Set<String>
    ) -> String {
        var chain: [String] = []
        if let own = origins[frame] { chain.append(own) }
        var parent = parents[frame]
        while let id = parent, chain.count <= parents.count {
            chain.append(origins[id] ?? "null")
            parent = parents[id]
        }
        guard let credited = chain.first else { return "null" }
        return chain.first { !trusted.contains($0) } ?? credited
    }
}
