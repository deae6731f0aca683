import Foundation
import Logging

/// The app to page direction, in the browser: app info pushed into each trusted frame after it loads
/// (the Sensors iOS SDK's scheme 1), asked for with `getAppInfo` (scheme 2) through the message handler
/// or the legacy `sensorsanalytics://getAppInfo` navigation, and KKJSBridge-style calls answered through
/// their callback id. Everything goes to one execution context, the asking frame's (`Runtime.evaluate`
/// with its `contextId`, on its own session): another frame never sees an answer.
extension WebViewHost {
    /// The binding the injected `TributaryJSBridge.call` posts calls to.
    public static let callBindingName = "__tributaryNativeCall"
    /// The legacy channel's app-info request (scheme 2 on the older bridge).
    public static let legacyAppInfoPrefix = "sensorsanalytics://getAppInfo"
    /// The queue bytes a trusted frame's end of loading takes while it waits to be handled.
    static let loadEventBytes = 64
    /// The page side's default time-out of a call, in ms.
    public static let defaultCallTimeoutMillis = 10_000

    /// The injected script's page side of calls: `TributaryJSBridge.call(module, method, params,
    /// callback, {timeout: ms})` (also `KKJSBridge.call`) issues callback ids 1, 2, 3… per document,
    /// calls `callback({data})` or `callback({error: {code, message}})` once, and `callback({error:
    /// {code: 'timeout'}})` when the app has not answered in time.
    static let callScript = """
        (function () {
          if (window.TributaryJSBridge) { return; }
          var pending = {}, last = 0;
          function call(module, method, params, callback, options) {
            var id = ++last, ms = (options && options.timeout) || \(defaultCallTimeoutMillis);
            if (typeof callback === 'function') {
              pending[id] = { callback: callback, timer: setTimeout(function () {
                if (!pending[id]) { return; }
                delete pending[id];
                callback({ error: { code: 'timeout', message: 'The app did not answer within ' + ms + ' ms.' } });
              }, ms) };
            }
            window.\(callBindingName)(JSON.stringify({ module: module, method: method, data: params || {}, callbackId: id }));
            return id;
          }
          Object.defineProperty(window, '__tributaryReply', { value: function (reply) {
            var entry = pending[reply.callbackId];
            if (!entry) { return; }
            delete pending[reply.callbackId];
            clearTimeout(entry.timer);
            entry.callback(reply.error ? { error: reply.error } : { data: reply.data });
          } });
          window.TributaryJSBridge = { call: call };
          window.KKJSBridge = window.KKJSBridge || { call: call };
        })();
        """

    /// Evaluates `expression` in context `id` of `session` (one frame's document), without waiting.
    func evaluate(_ expression: String, context id: Int, session: String) {
        pipe.send(
            "Runtime.evaluate", ["expression": .string(expression), "contextId": .number(Double(id))], session: session,
            failureLevel: .debug)
    }

    /// Answers a call in the calling frame's context.
    func handleCall(_ payload: String, origin: String, caller: FrameOrigins.Context, bridge: HybridBridge) async {
        let key = caller.key
        let outcome = await bridge.call(payload, origin: origin, lastCallbackID: callbackIDs.get()[key])
        guard case .answer(let callbackID, var reply) = outcome else {
            // A call refused for its callback id does not move the frame's last id.
            return
        }
        callbackIDs.update { ids in
            if ids.count >= 1024 {
                let live = origins.get().contexts
                ids = ids.filter { live[$0.key] != nil }
            }
            ids[key] = callbackID
        }
        if case .object(var members) = reply {
            members["callbackId"] = .number(Double(callbackID))
            reply = .object(members)
        }
        evaluate("window.__tributaryReply && window.__tributaryReply(\(reply.text));", context: caller.id, session: caller.session)
    }

    /// Hands the app's info to one frame's context (the page SDK's ``HybridBridge/appInfoFunction``).
    func pushAppInfo(to context: FrameOrigins.Context, askedBy origin: String? = nil, bridge: HybridBridge) {
        do {
            evaluate(try bridge.appInfoScript(), context: context.id, session: context.session)
            bridge.countAppInfo(askedBy: origin)
        } catch {
            logger.warning("app info not handed to the page: the identity cannot be read: \(error)")
        }
    }

    /// A trusted frame finished loading (scheme 1): its document gets the app's info.
    func frameLoaded(_ frame: String, bridge: HybridBridge) {
        let origins = origins.get()
        guard let context = origins.defaultContexts[frame], let origin = origins.frames[frame],
            configuration.allowedOrigins.contains(origin)
        else { return }
        pushAppInfo(to: context, bridge: bridge)
    }

    /// A `sensorsanalytics://getAppInfo` navigation of `frame` (its origin, trusted, checked by the reader):
    /// the answer goes to the document of the frame's parent (the page that made the iframe), or for a
    /// top-level frame, to its own.
    func legacyAppInfo(frame: String, origin: String, bridge: HybridBridge) {
        // The legacy SDK asks from a hidden iframe made for the purpose: its page is the parent's.
        let origins = origins.get()
        guard let context = origins.parents[frame].flatMap({ origins.defaultContexts[$0] }) ?? origins.defaultContexts[frame]
        else { return }
        pushAppInfo(to: context, askedBy: origin, bridge: bridge)
    }
}
