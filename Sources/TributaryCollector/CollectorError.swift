import TributaryErrors

/// An error from the reference collector: a bad configuration, or a database failure.
///
/// Errors are structs with an extensible ``Code`` rather than enums, so that new failure kinds can be
/// added without breaking callers that `switch` over the codes they know. The ``message`` says what
/// went wrong and what to do; it never contains event property values.
public struct CollectorError: TributaryError {
    /// What kind of failure this is.
    public struct Code: ErrorCode {
        private enum Kind: String { case invalidConfiguration, database, serverNotStarted }
        private let kind: Kind
        private init(_ kind: Kind) { self.kind = kind }
        public init?(rawValue: String) {
            guard let kind = Kind(rawValue: rawValue) else { return nil }
            self.kind = kind
        }
        public var rawValue: String { kind.rawValue }

        /// A ``CollectorConfiguration`` or ``FaultConfiguration`` value is out of range or malformed.
        public static let invalidConfiguration = Code(.invalidConfiguration)
        /// The collector's SQLite database could not be opened, read or written.
        public static let database = Code(.database)
        /// The HTTP server stopped before it was listening (for example: the port is in use).
        public static let serverNotStarted = Code(.serverNotStarted)
    }

    /// What kind of failure this is.
    public var code: Code
    /// A sentence saying what went wrong and what to do about it.
    public var message: String
    /// The underlying error, if any.
    public var cause: (any Error & Sendable)?
    /// Where the error was raised, for bug reports.
    public var location: SourceLocation

    /// Creates an error.
    public init(
        _ code: Code,
        _ message: String,
        cause: (any Error & Sendable)? = nil,
        file: String = #fileID,
        line: Int = #line
    ) {
        self.code = code
        self.message = message
        self.cause = cause
        self.location = SourceLocation(file: file, line: line)
    }
}
