/// A call to the automatic tracker that could not be carried out. Nothing was tracked.
public struct AutoTrackError: Error, CustomStringConvertible, Sendable {
    /// What went wrong.
    public struct Code: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
        public let rawValue: String
        public init(rawValue: String) { self.rawValue = rawValue }
        public var description: String { rawValue }

        /// A click or layout update came before any page appeared.
        public static let noPage = Code(rawValue: "noPage")
        /// The clicked element is not in the current page's view tree.
        public static let unknownElement = Code(rawValue: "unknownElement")
        /// The page has no view tree to find elements in.
        public static let noViewTree = Code(rawValue: "noViewTree")
        /// A configuration value is out of range.
        public static let invalidConfiguration = Code(rawValue: "invalidConfiguration")
    }

    /// What went wrong.
    public var code: Code
    /// A sentence saying what and why.
    public var message: String

    /// Creates an error.
    public init(_ code: Code, _ message: String) {
        self.code = code
        self.message = message
    }

    public var description: String { "\(code): \(message)" }
}
