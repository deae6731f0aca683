import Foundation
import Tributary
import TributaryStore

/// KKJSBridge-style calls from a page to the app: `TributaryJSBridge.call(module, method, params,
/// callback)` (also as `KKJSBridge.call`) posts `{"module":…,"method":…,"data":{…},"callbackId":n}`
/// through the ``WebViewHost/callBindingName`` binding, and the app answers through the callback id, in
/// the calling frame only (`docs/hybrid-bridge.md`, "Calls from the page").
///
/// Modules: `app` (`info`, `identity`) and `tracker` (`track`, `profileSet`, `profileSetOnce`,
/// `profileIncrement`, `profileAppend`, `profileUnset`, `profileDelete`, `flush`).
extension HybridBridge {
    /// The methods of each module a page may call.
    public static let callModules: [String: Set<String>] = [
        "app": ["info", "identity"],
        "tracker": [
            "track", "profileSet", "profileSetOnce", "profileIncrement", "profileAppend", "profileUnset",
            "profileDelete", "flush",
        ],
    ]

    /// What becomes of a call.
    public enum CallOutcome: Sendable, Equatable {
        /// Answer the calling frame: `{"callbackId":n,"data":…}` or `{"callbackId":n,"error":{"code","message"}}`.
        case answer(callbackID: Int, reply: JSON)
        /// Refused without an answer (no callback id to trust, or a message too large to read): the page's
        /// own time-out ends its wait. Counted in ``Counts/rejected``.
        case refused(BridgeRejection)
    }

    /// Handles one call a frame of `origin` posted. `lastCallbackID` is the highest callback id that frame
    /// (its document) used before: ids are issued by the injected script, 1, 2, 3…, so an id not above
    /// it is a repeat (or a replay) and refused, as is one that is not a positive whole number (forged).
    /// An unknown module or method is answered with an error, and counted as a refusal too.
    public func call(_ payload: String, origin: String, lastCallbackID: Int?) async -> CallOutcome {
        let origin = BridgeConfiguration.normalizedOrigin(origin)
        do throws(BridgeRejection) {
            let call = try NativeCall(payload, origin: origin, configuration: configuration, lastCallbackID: lastCallbackID)
            guard let methods = Self.callModules[call.module] else {
                return answerRefused(call, .unknownModule, "There is no module \(call.module.prefix(40)); modules: app, tracker.")
            }
            guard methods.contains(call.method) else {
                return answerRefused(
                    call, .unknownMethod,
                    "Module \(call.module) has no method \(call.method.prefix(40)); it has \(methods.sorted().joined(separator: ", ")).")
            }
            let reply = await perform(call)
            countAnswered(from: origin)
            return .answer(callbackID: call.callbackID, reply: reply)
        } catch {
            countRefusal(error, channel: .messageHandler)
            return .refused(error)
        }
    }

    private func answerRefused(_ call: NativeCall, _ reason: BridgeRejection.Reason, _ message: String) -> CallOutcome {
        countRefusal(BridgeRejection(reason, origin: call.origin, message), channel: .messageHandler)
        return .answer(callbackID: call.callbackID, reply: Self.failure(reason.rawValue, message))
    }

    /// Runs a call of a known method; its answer (`{"data":…}` or `{"error":…}`).
    private func perform(_ call: NativeCall) async -> JSON {
        do {
            switch (call.module, call.method) {
            case ("app", "info"): return .object(["data": try appInfo()])
            case ("app", "identity"): return .object(["data": try appIdentity()])
            case ("tracker", "flush"): return .object(["data": .object(["requested": .bool(tracker.flush())])])
            case ("tracker", "track"):
                guard let event = call.data["event"]?.string else {
                    return Self.failure("invalid_params", "tracker.track needs a string event.")
                }
                let properties = try Self.properties(call.data["properties"], origin: call.origin)
                let page = PageEvent(
                    type: .track, event: event, timeMillis: tracker.configuration.wallMillis(),
                    lib: ["$lib": "js", "$lib_method": "code"], properties: properties)
                return Self.receipt(try await tracker.trackFromPage(page))
            default:
                let operation = Self.profileOperations[call.method]!
                var properties = try Self.properties(call.data["properties"], origin: call.origin)
                if operation == .unset, case .array(let names)? = call.data["names"] {
                    for name in names.compactMap(\.string) { properties[name] = .bool(true) }
                }
                let profile = PageProfile(
                    operation: operation, timeMillis: tracker.configuration.wallMillis(),
                    lib: ["$lib": "js", "$lib_method": "code"], properties: properties)
                return Self.receipt(try await tracker.profileFromPage(profile))
            }
        } catch let rejection as BridgeRejection {
            return Self.failure("invalid_params", rejection.message)
        } catch let error as TrackingError {
            return Self.failure("rejected", error.message)
        } catch {
            return Self.failure("store_failed", "The app could not store it: \(error).")
        }
    }

    static let profileOperations: [String: ProfileOperation] = [
        "profileSet": .set, "profileSetOnce": .setOnce, "profileIncrement": .increment, "profileAppend": .append,
        "profileUnset": .unset, "profileDelete": .delete,
    ]

    private static func properties(_ value: JSON?, origin: String) throws(BridgeRejection) -> [String: PropertyValue] {
        guard let value, value != .null else { return [:] }
        guard case .object(let members) = value else {
            throw BridgeRejection(.invalidEvent, origin: origin, "properties is \(value.kindName), not an object.")
        }
        var properties: [String: PropertyValue] = [:]
        for (key, member) in members {
            if let converted = try PageEventMapping.propertyValue(member, key: key, origin: origin) { properties[key] = converted }
        }
        return properties
    }

    private static func receipt(_ receipt: TrackReceipt) -> JSON {
        .object(["data": .object(["event_id": .string(receipt.eventID), "distinct_id": .string(receipt.distinctID)])])
    }

    static func failure(_ code: String, _ message: String) -> JSON {
        .object(["error": .object(["code": .string(code), "message": .string(message)])])
    }
}

/// A call message that passed the checks before its module is looked up.
struct NativeCall: Sendable {
    var module: String
    var method: String
    var data: [String: JSON]
    var callbackID: Int
    var origin: String

    init(_ payload: String, origin: String, configuration: BridgeConfiguration, lastCallbackID: Int?)
        throws(BridgeRejection)
    {
        self.origin = origin
        guard configuration.allowedOrigins.contains(origin), !BridgeConfiguration.isOpaque(origin) else {
            throw BridgeRejection(.foreignOrigin, origin: origin, "The frame's origin is not on the bridge's whitelist.")
        }
        let size = payload.utf8.count
        guard size <= configuration.maxMessageBytes else {
            throw BridgeRejection(
                .messageTooLarge, origin: origin, "The call has \(size) bytes; the limit is \(configuration.maxMessageBytes).")
        }
        guard case .object(let call)? = JSON.parse(payload.utf8), let module = call["module"]?.string,
            let method = call["method"]?.string
        else {
            throw BridgeRejection(.malformedMessage, origin: origin, "The call is not a JSON object with string module and method.")
        }
        guard let id = call["callbackId"], case .integer(let value) = id, value > 0, let callbackID = Int(exactly: value) else {
            throw BridgeRejection(
                .forgedCallbackID, origin: origin, "The callbackId is not a positive whole number the bridge script issued.")
        }
        guard callbackID > lastCallbackID ?? 0 else {
            throw BridgeRejection(
                .repeatedCallbackID, origin: origin,
                "The callbackId \(callbackID) is not above the last this frame used (\(lastCallbackID ?? 0)); each call has a new one.")
        }
        self.module = module
        self.method = method
        self.callbackID = callbackID
        switch call["data"] {
        case nil, .null?: data = [:]
        case .object(let members)?: data = members
        case let other?: throw BridgeRejection(.malformedMessage, origin: origin, "The call's data is \(other.kindName), not an object.")
        }
    }
}
