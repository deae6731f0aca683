import TributaryErrors

/// A request body that could not be encoded or decoded.
public struct WireError: TributaryError {
    /// What kind of failure this is.
    public struct Code: ErrorCode {
        private enum Kind: String { case compression, malformedBody, crcMismatch, tooLarge, unsupportedMediaType }
        private let kind: Kind
        private init(_ kind: Kind) { self.kind = kind }
        public init?(rawValue: String) {
            guard let kind = Kind(rawValue: rawValue) else { return nil }
            self.kind = kind
        }
        public var rawValue: String { kind.rawValue }

        /// Compression failed (an invalid level, or no memory for the compressor).
        public static let compression = Code(.compression)
        /// The body is not what its format says (bad gzip, bad base64, bad JSON, missing field).
        public static let malformedBody = Code(.malformedBody)
        /// The Sensors `crc` field does not match `data_list`.
        public static let crcMismatch = Code(.crcMismatch)
        /// The body, or what it decompresses to, is over the limit.
        public static let tooLarge = Code(.tooLarge)
        /// The content type names no format this side speaks.
        public static let unsupportedMediaType = Code(.unsupportedMediaType)
    }

    /// What kind of failure this is.
    public var code: Code
    /// What went wrong, without event contents.
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
