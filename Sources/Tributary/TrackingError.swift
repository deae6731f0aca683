import TributaryErrors

/// An event or call the producer library rejected. Nothing was written.
///
/// The message names the field and the rule (and sizes where relevant), never the property's value.
public struct TrackingError: TributaryError {
    /// What rule was broken.
    public struct Code: ErrorCode {
        private enum Kind: String {
            case invalidName, reservedName, nameTooLong, valueTooLong, invalidValueType, nonFiniteNumber, inexactNumber
            case dateOutOfRange, timeOutOfRange, eventTooLarge, malformedProperties, invalidID, unknownTimer
            case invalidConfiguration, invalidURL, invalidProfileUpdate
        }
        private let kind: Kind
        private init(_ kind: Kind) { self.kind = kind }
        public init?(rawValue: String) {
            guard let kind = Kind(rawValue: rawValue) else { return nil }
            self.kind = kind
        }
        public var rawValue: String { kind.rawValue }

        /// An event or property name does not match `^[a-zA-Z_$][a-zA-Z0-9_$]{0,99}$`.
        public static let invalidName = Code(.invalidName)
        /// The name is reserved by Sensors Analytics (`time`, `distinct_id`, `$`-names not preset, …).
        public static let reservedName = Code(.reservedName)
        /// A name is longer than 100 characters.
        public static let nameTooLong = Code(.nameTooLong)
        /// A string value is longer than 8,192 UTF-8 bytes.
        public static let valueTooLong = Code(.valueTooLong)
        /// A value has a type events cannot carry.
        public static let invalidValueType = Code(.invalidValueType)
        /// A number is NaN or infinite.
        public static let nonFiniteNumber = Code(.nonFiniteNumber)
        /// A whole number in JSON properties (`--properties`) beyond the 64-bit integers that is not the
        /// shortest decimal of a double: stored as a double, it would be written with other digits.
        public static let inexactNumber = Code(.inexactNumber)
        /// A date is NaN or outside 0001-01-02 … 9999-12-30 UTC (what `yyyy-MM-dd HH:mm:ss.SSS` can
        /// write in local time, in every zone).
        public static let dateOutOfRange = Code(.dateOutOfRange)
        /// A page event's time is outside ``PageEvent/timeRange`` (1 ms through 9999-12-30 UTC).
        public static let timeOutOfRange = Code(.timeOutOfRange)
        /// The encoded event is larger than the configured limit.
        public static let eventTooLarge = Code(.eventTooLarge)
        /// The `--properties` text is not a JSON object.
        public static let malformedProperties = Code(.malformedProperties)
        /// An id (login id, anonymous id, producer id) is empty or too long.
        public static let invalidID = Code(.invalidID)
        /// A timer was ended or paused that was never started.
        public static let unknownTimer = Code(.unknownTimer)
        /// A `Tracker.Configuration` value is out of range.
        public static let invalidConfiguration = Code(.invalidConfiguration)
        /// A launch URL is not an absolute URL.
        public static let invalidURL = Code(.invalidURL)
        /// A profile operation's properties break its rule (``ProfileRules``): `profile_increment` takes
        /// numbers, `profile_append` lists of strings, `profile_unset` `true`, `profile_delete` nothing,
        /// and every other operation at least one property.
        public static let invalidProfileUpdate = Code(.invalidProfileUpdate)
    }

    /// What rule was broken.
    public var code: Code
    /// The event name, property key or argument at fault.
    public var field: String
    /// A sentence naming the field, the rule and sizes.
    public var message: String

    /// Creates an error.
    /// The underlying error, if any.
    public var cause: (any Error & Sendable)?
    /// Where the error was raised, for bug reports.
    public var location: SourceLocation

    /// Creates an error about `field`.
    public init(
        _ code: Code, field: String, _ message: String, cause: (any Error & Sendable)? = nil, file: String = #fileID,
        line: Int = #line
    ) {
        self.code = code
        self.field = field
        self.message = message
        self.cause = cause
        self.location = SourceLocation(file: file, line: line)
    }

    public var description: String { "\(code) (\(field)): \(message)" }
}
