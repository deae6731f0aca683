/// An error that stops the agent. The message says what and what to do.
public struct AgentError: Error, CustomStringConvertible, Sendable {
    /// What kind of failure this is.
    public struct Code: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
        public let rawValue: String
        public init(rawValue: String) { self.rawValue = rawValue }
        public var description: String { rawValue }

        /// The agent could not start (socket, lock, outbox).
        public static let startup = Code(rawValue: "startup")
        /// Another agent holds the group.
        public static let alreadyRunning = Code(rawValue: "alreadyRunning")
        /// A configuration value is invalid (server URL, token file, …).
        public static let configuration = Code(rawValue: "configuration")
        /// The collector refuses uploads (401/403/404); in `--once` mode this ends the run.
        public static let halted = Code(rawValue: "halted")
        /// Writing the outbox failed; the agent stops rather than retry a failed fsync.
        public static let outboxIO = Code(rawValue: "outboxIO")
        /// Dead letters fill the outbox quota, so nothing more can be drained; in `--once` mode this
        /// ends the run (an operator must replay or discard them).
        public static let outboxFull = Code(rawValue: "outboxFull")
        /// The group's store file was deleted or created anew while the agent ran; a restart opens it.
        public static let storeReplaced = Code(rawValue: "storeReplaced")
    }

    public var code: Code
    public var message: String
    public var cause: (any Error & Sendable)?

    public init(_ code: Code, _ message: String, cause: (any Error & Sendable)? = nil) {
        self.code = code
        self.message = message
        self.cause = cause
    }

    public var description: String { "\(code): \(message)" + (cause.map { " [cause: \($0)]" } ?? "") }
}
