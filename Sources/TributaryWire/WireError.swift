/// A request body that could not be encoded or decoded.
public struct WireError: Error, CustomStringConvertible, Sendable {
    /// What kind of failure this is.
    public struct Code: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
        public let rawValue: String
        public init(rawValue: String) { self.rawValue = rawValue }
        public var description: String { rawValue }

        /// Compression failed (an invalid level, or no memory for the compressor).
        public static let compression = Code(rawValue: "compression")
        /// The body is not what its format says (bad gzip, bad base64, bad JSON, missing field).
        public static let malformedBody = Code(rawValue: "malformedBody")
        /// The Sensors `crc` field does not match `data_list`.
        public static let crcMismatch = Code(rawValue: "crcMismatch")
        /// The body, or what it decompresses to, is over the limit.
        public static let tooLarge = Code(rawValue: "tooLarge")
        /// The content type names no format this side speaks.
        public static let unsupportedMediaType = Code(rawValue: "unsupportedMediaType")
    }

    /// What kind of failure this is.
    public var code: Code
    /// What went wrong, without event contents.
    public var message: String

    /// Creates an error.
    public init(_ code: Code, _ message: String) {
        self.code = code
        self.message = message
    }

    public var description: String { "\(code): \(message)" }
}
