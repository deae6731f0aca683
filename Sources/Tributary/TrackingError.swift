/// An event or call the producer library rejected. Nothing was written.
///
/// The message names the field and the rule (and sizes where relevant), never the property's value.
public struct TrackingError: Error, CustomStringConvertible, Sendable {
    /// What rule was broken.
    public struct Code: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
        public let rawValue: String
        public init(rawValue: String) { self.rawValue = rawValue }
        public var description: String { rawValue }

        /// An event or property name does not match `^[a-zA-Z_$][a-zA-Z0-9_$]{0,99}$`.
        public static let invalidName = Code(rawValue: "invalidName")
        /// The name is reserved by Sensors Analytics (`time`, `distinct_id`, `$`-names not preset, …).
        public static let reservedName = Code(rawValue: "reservedName")
        /// A name is longer than 100 characters.
        public static let nameTooLong = Code(rawValue: "nameTooLong")
        /// A string value is longer than 8,192 UTF-8 bytes.
        public static let valueTooLong = Code(rawValue: "valueTooLong")
        /// A value has a type events cannot carry.
        public static let invalidValueType = Code(rawValue: "invalidValueType")
        /// A number is NaN or infinite.
        public static let nonFiniteNumber = Code(rawValue: "nonFiniteNumber")
        /// A whole number in JSON properties (`--properties`) beyond the 64-bit integers that is not the
        /// shortest decimal of a double: stored as a double, it would be written with other digits.
        public static let inexactNumber = Code(rawValue: "inexactNumber")
        /// A date is NaN or outside 0001-01-02 … 9999-12-30 UTC (what `yyyy-MM-dd HH:mm:ss.SSS` can
        /// write in local time, in every zone).
        public static let dateOutOfRange = Code(rawValue: "dateOutOfRange")
        /// A page event's time is outside ``PageEvent/timeRange`` (1 ms through 9999-12-30 UTC).
        public static let timeOutOfRange = Code(rawValue: "timeOutOfRange")
        /// The encoded event is larger than the configured limit.
        public static let eventTooLarge = Code(rawValue: "eventTooLarge")
        /// The `--properties` text is not a JSON object.
        public static let malformedProperties = Code(rawValue: "malformedProperties")
        /// An id (login id, anonymous id, producer id) is empty or too long.
        public static let invalidID = Code(rawValue: "invalidID")
        /// A timer was ended or paused that was never started.
        public static let unknownTimer = Code(rawValue: "unknownTimer")
        /// A `Tracker.Configuration` value is out of range.
        public static let invalidConfiguration = Code(rawValue: "invalidConfiguration")
    }

    /// What rule was broken.
    public var code: Code
    /// The event name, property key or argument at fault.
    public var field: String
    /// A sentence naming the field, the rule and sizes.
    public var message: String

    /// Creates an error.
    public init(_ code: Code, field: String, _ message: String) {
        self.code = code
        self.field = field
        self.message = message
    }

    public var description: String { "\(code) (\(field)): \(message)" }
}
