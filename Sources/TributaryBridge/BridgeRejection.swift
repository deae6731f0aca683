import TributaryErrors
/// Why the bridge refused a message from a page. Nothing was written.
///
/// The message names the rule, the field and sizes where relevant; it never contains a property value.
public struct BridgeRejection: TributaryError {
    /// The counted reason for a rejection (the `reason` label of the metric and of the log line).
    public struct Reason: ErrorCode, Comparable {
        public let rawValue: String
        public init(rawValue: String) { self.rawValue = rawValue }
        public static func < (a: Reason, b: Reason) -> Bool { a.rawValue < b.rawValue }

        /// The sending frame's origin is not on the whitelist.
        public static let foreignOrigin = Reason(rawValue: "foreign_origin")
        /// The message is larger than ``BridgeConfiguration/maxMessageBytes``.
        public static let messageTooLarge = Reason(rawValue: "message_too_large")
        /// The message is not a JSON object of the bridge protocol (`{"callType":…,"data":{…}}`).
        public static let malformedMessage = Reason(rawValue: "malformed_message")
        /// The `callType` is not one the bridge records (only `app_h5_track` is).
        public static let unsupportedCallType = Reason(rawValue: "unsupported_call_type")
        /// The event's `server_url` is missing, or has another host or `project` than the app's.
        public static let foreignProject = Reason(rawValue: "foreign_project")
        /// The event claims an identity the app does not have.
        public static let forgedIdentity = Reason(rawValue: "forged_identity")
        /// The record `type` is not `track`, `track_signup` or a profile operation (`profile_set`, …).
        public static let unsupportedType = Reason(rawValue: "unsupported_type")
        /// The event breaks the event rules (name, property types, sizes, missing `time`).
        public static let invalidEvent = Reason(rawValue: "invalid_event")
        /// The shared store refused the event (full, unreadable).
        public static let storeFailed = Reason(rawValue: "store_failed")
        /// A call names a module the app does not have (only `app` and `tracker`); answered with an error.
        public static let unknownModule = Reason(rawValue: "unknown_module")
        /// A call names a method its module does not have; answered with an error.
        public static let unknownMethod = Reason(rawValue: "unknown_method")
        /// A call's `callbackId` is not a positive whole number, as the bridge script issues them; not answered.
        public static let forgedCallbackID = Reason(rawValue: "forged_callback_id")
        /// A call's `callbackId` is not above the last its frame used (a repeat or a replay); not answered.
        public static let repeatedCallbackID = Reason(rawValue: "repeated_callback_id")
        /// More page messages were waiting than ``BridgeConfiguration/maxQueuedBytes`` allows: the
        /// message was dropped unread (its origin is not known either).
        public static let overloaded = Reason(rawValue: "overloaded")
    }

    /// The counted reason.
    public var reason: Reason
    /// The origin of the frame that sent the message.
    public var origin: String
    /// A sentence naming the rule that was broken.
    public var message: String
    /// The underlying error (the store's, when it refused the event).
    public var cause: (any Error & Sendable)?
    /// Where the rejection was raised.
    public var location: SourceLocation

    /// The counted reason, as every Tributary error names its kind.
    public var code: Reason { reason }

    /// Creates a rejection.
    public init(
        _ reason: Reason, origin: String, _ message: String, cause: (any Error & Sendable)? = nil,
        file: String = #fileID, line: Int = #line
    ) {
        self.reason = reason
        self.origin = origin
        self.message = message
        self.cause = cause
        self.location = SourceLocation(file: file, line: line)
    }

    public var description: String { "\(reason) from \(origin): \(message)" }
}
