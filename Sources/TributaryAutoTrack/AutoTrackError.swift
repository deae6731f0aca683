import TributaryErrors

/// A call to the automatic tracker that could not be carried out. Nothing was tracked.
public struct AutoTrackError: TributaryError {
    /// What went wrong.
    public struct Code: ErrorCode {
        private enum Kind: String { case noPage, unknownElement, noViewTree, invalidConfiguration }
        private let kind: Kind
        private init(_ kind: Kind) { self.kind = kind }
        public init?(rawValue: String) {
            guard let kind = Kind(rawValue: rawValue) else { return nil }
            self.kind = kind
        }
        public var rawValue: String { kind.rawValue }

        /// A click or layout update came before any page appeared.
        public static let noPage = Code(.noPage)
        /// The clicked element is not in the current page's view tree.
        public static let unknownElement = Code(.unknownElement)
        /// The page has no view tree to find elements in.
        public static let noViewTree = Code(.noViewTree)
        /// A configuration value is out of range.
        public static let invalidConfiguration = Code(.invalidConfiguration)
    }

    /// What went wrong.
    public var code: Code
    /// A sentence saying what and why.
    public var message: String
    /// The underlying error, if any.
    public var cause: (any Error & Sendable)?
    /// Where the error was raised, for bug reports.
    public var location: SourceLocation

    /// Creates an error.
    public init(
        _ code: Code, _ message: String, cause: (any Error & Sendable)? = nil, file: String = #fileID, line: Int = #line
    ) {
        self.code = code
        self.message = message
        self.cause = cause
        self.location = SourceLocation(file: file, line: line)
    }
}
