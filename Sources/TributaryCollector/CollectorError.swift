/// An error from the reference collector: a bad configuration, or a database failure.
///
/// Errors are structs with an extensible ``Code`` rather than enums, so that new failure kinds can be
/// added without breaking callers that `switch` over the codes they know. The ``message`` says what
/// went wrong and what to do; it never contains event property values.
public struct CollectorError: Error, CustomStringConvertible, Sendable {
    /// What kind of failure this is.
    public struct Code: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
        public let rawValue: String
        public init(rawValue: String) { self.rawValue = rawValue }
        public var description: String { rawValue }

        /// A ``CollectorConfiguration`` or ``FaultConfiguration`` value is out of range or malformed.
        public static let invalidConfiguration = Code(rawValue: "invalidConfiguration")
        /// The collector's SQLite database could not be opened, read or written.
        public static let database = Code(rawValue: "database")
        /// The HTTP server stopped before it was listening (for example: the port is in use).
        public static let serverNotStarted = Code(rawValue: "serverNotStarted")
    }

    /// What kind of failure this is.
    public var code: Code
    /// A sentence saying what went wrong and what to do about it.
    public var message: String
    /// The underlying error, if any.
    public var cause: (any Error & Sendable)?
    /// Where the error was raised, for bug reports.
    public var location: SourceLocation

    /// Where in Tributary's source an error was raised.
    public struct SourceLocation: Sendable, CustomStringConvertible {
        /// The `#fileID` of the raising code.
        public var file: String
        /// The line of the raising code.
        public var line: Int
        public var description: String { "\(file):\(line)" }
    }

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

    public var description: String {
        var text = "\(code): \(message)"
        if let cause { text += " [cause: \(cause)]" }
        return text
    }
}
