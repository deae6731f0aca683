import Foundation
import Logging
import Metrics
import Synchronization
import Tributary
import TributaryStore

/// The native side of the App↔H5 bridge: verifies each message a page sends and records the
/// accepted ones through the app's ``Tracker`` (producer kind `hybrid`).
///
/// Protocol compatible with the Sensors JavaScript SDK's iOS bridge: a message is a JSON string
/// `{"callType":"app_h5_track","data":{…event…,"server_url":"…"}}` from
/// `window.webkit.messageHandlers.sensorsdataNativeTracker.postMessage`, or, on the legacy channel, a
/// navigation to `sensorsanalytics://trackEvent?event=<url-encoded event JSON>`. Every rejection is
/// logged and counted by reason (``rejections``, and the `tributary_bridge_messages_total` counter).
/// `docs/hybrid-bridge.md` documents the rules and the enrichment mapping.
public final class HybridBridge: Sendable {
    /// Where a message came from.
    public enum Channel: String, Sendable {
        /// `window.webkit.messageHandlers.sensorsdataNativeTracker.postMessage`.
        case messageHandler = "message_handler"
        /// An intercepted `sensorsanalytics://trackEvent` navigation (the user-agent marked, older bridge).
        case legacyNavigation = "legacy_navigation"
    }

    /// What the bridge has seen so far.
    public struct Counts: Sendable, Equatable {
        /// Messages received, by origin (accepted and rejected), counted when their handling starts:
        /// a message still being verified or committed is here, not yet in ``accepted`` or ``rejected``.
        /// Past ``HybridBridge/maxCountedOrigins`` origins, the messages of origins not yet counted and
        /// not trusted go under ``HybridBridge/otherOrigins``: a page making frames on random
        /// subdomains grew this for the life of the app.
        public var received: [String: Int] = [:]
        /// Events accepted and durably recorded.
        public var accepted = 0
        /// Rejections by reason.
        public var rejected: [BridgeRejection.Reason: Int] = [:]
        /// Page messages answered: calls (with data or an error) and `getAppInfo` requests.
        public var answered = 0
        /// App info pushed into trusted frames after their load (scheme 1). Not page messages: not in ``handled``.
        public var pushed = 0

        /// Messages whose handling has finished: accepted (durably recorded), answered or rejected. Wait
        /// for this to reach the number of messages sent, not ``received``, before reading ``accepted``.
        public var handled: Int { accepted + answered + rejected.values.reduce(0, +) }
    }

    /// How many origins ``Counts/received`` counts by name, beyond the trusted ones.
    public static let maxCountedOrigins = 256
    /// The key of ``Counts/received`` for the messages of the origins past ``maxCountedOrigins``.
    public static let otherOrigins = "other"

    /// The call type of an event message.
    public static let trackCallType = "app_h5_track"
    /// The call type of a page asking for the app's info (scheme 2 on the message handler).
    public static let appInfoCallType = "getAppInfo"

    /// Whether `message` is a page asking for the app's info: `{"callType":"getAppInfo"}` (small; read
    /// only when it is).
    static func isAppInfoRequest(_ message: String) -> Bool {
        guard message.utf8.count <= 256, message.contains(appInfoCallType) else { return false }
        return JSON.parse(message.utf8)?["callType"]?.string == appInfoCallType
    }

    /// The legacy channel's navigation prefix.
    public static let legacyTrackPrefix = "sensorsanalytics://trackEvent?"

    /// The app's tracker the accepted events are written through.
    public let tracker: Tracker
    /// The trust rules.
    public let configuration: BridgeConfiguration
    private let appServer: ServerProject?
    private let allowedServers: Set<ServerProject>
    private let logger: Logger
    private let counts = Mutex(Counts())
    /// Made once: every accepted message increments it (rejections, rare, make theirs per reason).
    private let acceptedCounter = Counter(label: "tributary_bridge_messages_total", dimensions: [("outcome", "accepted")])
    private let onAccepted: @Sendable (TrackReceipt) -> Void

    /// A bridge writing through `tracker` (open it with producer kind `.hybrid`).
    ///
    /// `onAccepted` is called with each recorded event's receipt, once it is durable, in order.
    public init(
        tracker: Tracker, configuration: BridgeConfiguration, logger: Logger = Logger(label: "tributary.bridge"),
        onAccepted: @escaping @Sendable (TrackReceipt) -> Void = { _ in }
    ) {
        self.tracker = tracker
        self.configuration = configuration
        self.logger = logger
        self.onAccepted = onAccepted
        appServer = ServerProject(url: configuration.serverURL)
        allowedServers = Set(
            ([configuration.serverURL] + configuration.allowedServerURLs).compactMap(ServerProject.init(url:)))
        for problem in configuration.problems { logger.error("bridge configuration: \(problem)") }
    }

    /// What the bridge has seen so far.
    public var snapshot: Counts { counts.withLock { $0 } }

    /// Rejections by reason so far.
    public var rejections: [BridgeRejection.Reason: Int] { snapshot.rejected }

    /// Handles one message a frame of `origin` posted. Returns the receipt of the recorded event
    /// (nil for an accepted message that records nothing), or the rejection.
    @discardableResult
    public func receive(_ message: String, origin: String, channel: Channel = .messageHandler) async
        -> Result<TrackReceipt, BridgeRejection>
    {
        let origin = BridgeConfiguration.normalizedOrigin(origin)
        countReceived(origin)
        let result: Result<TrackReceipt, BridgeRejection>
        do {
            let page = try verify(message, origin: origin, channel: channel)
            result = .success(try await record(page, origin: origin))
        } catch let rejection as BridgeRejection {
            result = .failure(rejection)
        } catch {
            result = .failure(BridgeRejection(.storeFailed, origin: origin, "The store refused the event: \(error)."))
        }
        count(result, channel: channel)
        return result
    }

    private func countReceived(_ origin: String, _ messages: Int = 1) {
        counts.withLock { counts in
            let named = counts.received[origin] != nil || configuration.allowedOrigins.contains(origin)
                || counts.received.count < Self.maxCountedOrigins
            counts.received[named ? origin : Self.otherOrigins, default: 0] += messages
        }
    }

    /// Counts the messages of frames not on the whitelist that the host refused unread (``WebViewHost``:
    /// they neither wait for trusted messages' commits nor take their room in its queue), by origin: as
    /// received, and rejected as ``BridgeRejection/Reason/foreignOrigin``, with one warning for them all.
    func refuseForeign(_ byOrigin: [String: Int]) {
        let total = byOrigin.values.reduce(0, +)
        guard total > 0 else { return }
        for (origin, messages) in byOrigin { countReceived(origin, messages) }
        countRejected(.foreignOrigin, total)
        logger.warning(
            "bridge messages rejected: their frames' origins are not on the bridge's whitelist",
            metadata: [
                "tributary.bridge.reason": "\(BridgeRejection.Reason.foreignOrigin)", "tributary.bridge.rejected": "\(total)",
                "tributary.bridge.origins": "\(byOrigin.keys.sorted().prefix(8).joined(separator: " "))",
            ])
    }

    /// Handles a navigation a frame of `origin` requested. Returns nil when `url` is not the legacy
    /// channel's (the navigation is none of the bridge's business), else what ``receive(_:origin:channel:)`` returns.
    public func receiveNavigation(_ url: String, origin: String) async -> Result<TrackReceipt, BridgeRejection>? {
        guard url.hasPrefix(Self.legacyTrackPrefix) else { return nil }
        let query = url.dropFirst(Self.legacyTrackPrefix.count)
        let item = URLComponents(string: "x:?" + query)?.queryItems?.first { $0.name == "event" }
        guard let event = item?.value, !event.isEmpty else {
            // Refused as what it is, not as the message wrapped around nothing ("not a JSON object").
            return refuse(
                origin: origin, channel: .legacyNavigation, .malformedMessage,
                "The navigation has no event query parameter that can be read (\(Self.legacyTrackPrefix)event= and the "
                    + "event's JSON, percent-encoded).")
        }
        // The legacy channel carries the bare event; wrap it as the message-handler protocol does.
        return await receive(
            "{\"callType\":\"app_h5_track\",\"data\":\(event)}", origin: origin, channel: .legacyNavigation)
    }

    /// Counts and returns the refusal of a message from `origin` that was not verified: refused as
    /// ``BridgeRejection/Reason/foreignOrigin`` when the origin is not trusted (the first rule), else
    /// for `reason`.
    private func refuse(
        origin: String, channel: Channel, _ reason: BridgeRejection.Reason, _ message: String
    ) -> Result<TrackReceipt, BridgeRejection> {
        let origin = BridgeConfiguration.normalizedOrigin(origin)
        countReceived(origin)
        let rejection: BridgeRejection
        do throws(BridgeRejection) {
            try checkOrigin(origin)
            rejection = BridgeRejection(reason, origin: origin, message)
        } catch {
            rejection = error
        }
        count(.failure(rejection), channel: channel)
        return .failure(rejection)
    }

    /// Counts a message the host could not read: its DevTools frame was longer than any message the
    /// bridge takes (``WebViewHost``). Refused as ``BridgeRejection/Reason/messageTooLarge``, or as
    /// ``BridgeRejection/Reason/foreignOrigin`` when the frame's origin is not trusted (the first rule).
    func refuseUnread(byteCount: Int, origin: String, channel: Channel) {
        _ = refuse(
            origin: origin, channel: channel, .messageTooLarge,
            "The message's DevTools frame has \(byteCount) bytes, more than a message of at most "
                + "\(configuration.maxMessageBytes) bytes takes; it was not read.")
    }

    /// Counts `dropped` messages the host dropped unread because too many were waiting
    /// (``BridgeConfiguration/maxQueuedBytes``). They are rejections, not in ``Counts/received``: their
    /// origin was not read.
    func refuseOverloaded(_ dropped: Int) {
        guard dropped > 0 else { return }
        countRejected(.overloaded, dropped)
        logger.warning(
            "bridge messages dropped unread: more than \(configuration.maxQueuedBytes) bytes of page messages were waiting",
            metadata: ["tributary.bridge.reason": "\(BridgeRejection.Reason.overloaded)", "tributary.bridge.dropped": "\(dropped)"])
    }

    /// Counts a page message answered (a call, a `getAppInfo`), received from `origin`; or, for nil,
    /// app info pushed into a frame after its load.
    func countAnswered(from origin: String?) {
        guard let origin else {
            counts.withLock { $0.pushed += 1 }
            return
        }
        countReceived(BridgeConfiguration.normalizedOrigin(origin))
        counts.withLock { $0.answered += 1 }
    }

    /// Counts a refused call or `getAppInfo` (received from `rejection.origin`, and refused), and logs it.
    func countRefusal(_ rejection: BridgeRejection, channel: Channel) {
        countReceived(rejection.origin)
        count(.failure(rejection), channel: channel)
    }

    /// Counts `messages` rejections for `reason`, in ``Counts/rejected`` and the messages metric.
    private func countRejected(_ reason: BridgeRejection.Reason, _ messages: Int = 1) {
        counts.withLock { $0.rejected[reason, default: 0] += messages }
        Counter(label: "tributary_bridge_messages_total", dimensions: [("outcome", reason.rawValue)]).increment(by: messages)
    }

    private func count(_ result: Result<TrackReceipt, BridgeRejection>, channel: Channel) {
        switch result {
        case .success(let receipt):
            onAccepted(receipt)
            counts.withLock { $0.accepted += 1 }
            acceptedCounter.increment()
            logger.debug(
                "bridge event accepted",
                metadata: [
                    "tributary.event.id": "\(receipt.eventID)", "tributary.bridge.channel": "\(channel.rawValue)",
                ])
        case .failure(let rejection):
            countRejected(rejection.reason)
            logger.warning(
                "bridge message rejected: \(rejection.message)",
                metadata: [
                    "tributary.bridge.reason": "\(rejection.reason)", "tributary.bridge.origin": "\(rejection.origin)",
                    "tributary.bridge.channel": "\(channel.rawValue)",
                ])
        }
    }

    // MARK: Verification

    /// Checks a message against every rule and maps it to a ``PageEvent``; throws the first broken rule.
    func verify(_ message: String, origin: String, channel: Channel) throws(BridgeRejection) -> VerifiedMessage {
        try checkOrigin(origin)
        let size = message.utf8.count
        guard size <= configuration.maxMessageBytes else {
            throw BridgeRejection(
                .messageTooLarge, origin: origin,
                "The message has \(size) bytes; the limit is \(configuration.maxMessageBytes).")
        }
        guard let json = JSON.parse(message.utf8), case .object(let envelope) = json else {
            throw BridgeRejection(.malformedMessage, origin: origin, "The message is not a JSON object.")
        }
        guard let callType = envelope["callType"]?.string else {
            throw BridgeRejection(.malformedMessage, origin: origin, "The message has no string callType.")
        }
        guard callType == Self.trackCallType else {
            throw BridgeRejection(
                .unsupportedCallType, origin: origin,
                "callType \(callType.prefix(40)) is not recorded; only \(Self.trackCallType) is.")
        }
        guard let data = envelope["data"]?.object else {
            throw BridgeRejection(
                .malformedMessage, origin: origin,
                "data is \(envelope["data"]?.kindName ?? "missing"); it must be the event object.")
        }
        try checkServer(data["server_url"], origin: origin)
        if let operation = data["type"]?.string.flatMap(ProfileOperation.init(rawValue:)) {
            let profile = try PageProfileMapping.map(data, operation: operation, origin: origin)
            _ = try checkIdentity(data, type: PageEvent.EventType(rawValue: operation.rawValue), origin: origin)
            return .profile(profile)
        }
        let page = try PageEventMapping.map(data, origin: origin)
        let signupID = try checkIdentity(data, type: page.type, origin: origin)
        return .event(page, signupLoginID: signupID)
    }

    private func checkOrigin(_ origin: String) throws(BridgeRejection) {
        guard !BridgeConfiguration.isOpaque(origin) else {
            throw BridgeRejection(
                .foreignOrigin, origin: origin,
                "The frame's origin is opaque (a sandboxed or data: document, or an unknown context); "
                    + "opaque origins are never trusted.")
        }
        guard configuration.allowedOrigins.contains(origin) else {
            throw BridgeRejection(
                .foreignOrigin, origin: origin, "The frame's origin is not on the bridge's whitelist.")
        }
    }

    private func checkServer(_ value: JSON?, origin: String) throws(BridgeRejection) {
        guard let url = value?.string, let server = ServerProject(url: url) else {
            throw BridgeRejection(
                .foreignProject, origin: origin,
                "The event's server_url is \(value?.kindName ?? "missing") or has no host; it must name the app's server."
            )
        }
        guard allowedServers.contains(server) else {
            throw BridgeRejection(
                .foreignProject, origin: origin,
                "The event is for \(server), not the app's \(appServer?.description ?? "server") or a whitelisted one.")
        }
    }

    /// A page may identify itself only with its own anonymous id or the app's ids; a `login_id` must be
    /// the app's. A `track_signup`'s `distinct_id` is the new login id. Returns that id for a signup.
    private func checkIdentity(_ data: [String: JSON], type: PageEvent.EventType, origin: String)
        throws(BridgeRejection)
        -> String?
    {
        let app: Identity
        do {
            app = try tracker.identity()
        } catch {
            throw BridgeRejection(.storeFailed, origin: origin, "The app's identity could not be read: \(error).")
        }
        guard let distinct = data["distinct_id"]?.string, !distinct.isEmpty else {
            throw BridgeRejection(.invalidEvent, origin: origin, "The event has no string distinct_id.")
        }
        if type == .signup {
            do {
                try EventRules.validateID(distinct, what: "login id")
            } catch {
                throw BridgeRejection(.invalidEvent, origin: origin, "track_signup: \(error)")
            }
            return distinct
        }
        let ownAnonymous = data["anonymous_id"]?.string
        let known = [app.anonymousID, app.loginID, ownAnonymous].compactMap { $0 }
        guard known.contains(distinct) else {
            throw BridgeRejection(
                .forgedIdentity, origin: origin,
                "distinct_id is neither the page's own anonymous_id nor one of the app's ids.")
        }
        // `"login_id": null` claims no login (the JavaScript SDK's logged-out state), as a missing one.
        if let login = data["login_id"], login != .null {
            guard let claimed = login.string, claimed == app.loginID else {
                throw BridgeRejection(
                    .forgedIdentity, origin: origin,
                    app.loginID == nil
                        ? "The page claims a login_id but the app is not logged in."
                        : "The page's login_id is not the app's.")
            }
        }
        return nil
    }

    // MARK: Recording

    /// Stores the page event; a `track_signup` logs the group in and stores its event (which carries
    /// the new login id) in one transaction: nothing is written for a rejected message.
    private func record(_ verified: VerifiedMessage, origin: String) async throws -> TrackReceipt {
        do {
            switch verified {
            case .event(let page, let loginID?): return try tracker.signUpFromPage(page, loginID: loginID)
            case .event(let page, nil): return try await tracker.trackFromPage(page)
            case .profile(let profile): return try await tracker.profileFromPage(profile)
            }
        } catch let error as TrackingError {
            throw BridgeRejection(.invalidEvent, origin: origin, error.description)
        }
    }
}

/// A message that passed every check.
enum VerifiedMessage: Sendable {
    /// A page event; a `track_signup` also logs the app in with `signupLoginID`.
    case event(PageEvent, signupLoginID: String?)
    /// A page's profile operation.
    case profile(PageProfile)
}
