import TributaryErrors

/// An error that stops the agent. The message says what and what to do.
public struct AgentError: TributaryError {
    /// What kind of failure this is.
    public struct Code: ErrorCode {
        private enum Kind: String {
            case startup, alreadyRunning, configuration, halted, outboxIO, failStop, outboxFull, storeReplaced
        }
        private let kind: Kind
        private init(_ kind: Kind) { self.kind = kind }
        public init?(rawValue: String) {
            guard let kind = Kind(rawValue: rawValue) else { return nil }
            self.kind = kind
        }
        public var rawValue: String { kind.rawValue }

        /// The agent could not start (socket, lock, outbox).
        public static let startup = Code(.startup)
        /// Another agent holds the group.
        public static let alreadyRunning = Code(.alreadyRunning)
        /// A configuration value is invalid (server URL, token file, …).
        public static let configuration = Code(.configuration)
        /// The collector refuses uploads (401/403/404); in `--once` mode this ends the run.
        public static let halted = Code(.halted)
        /// Writing the outbox failed; the agent stops rather than retry a failed fsync.
        public static let outboxIO = Code(.outboxIO)
        /// An I/O error on the outbox or the store (a failed fsync, EIO, corruption): the agent stopped
        /// at once, writing nothing more (see the fail-stop rule in docs/operations.md).
        public static let failStop = Code(.failStop)
        /// Dead letters fill the outbox quota, so nothing more can be drained; in `--once` mode this
        /// ends the run (an operator must replay or discard them).
        public static let outboxFull = Code(.outboxFull)
        /// The group's store file was deleted or created anew while the agent ran; a restart opens it.
        public static let storeReplaced = Code(.storeReplaced)
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
        _ code: Code, _ message: String, cause: (any Error & Sendable)? = nil, file: String = #fileID, line: Int = #line
    ) {
        self.code = code
        self.message = message
        self.cause = cause
        self.location = SourceLocation(file: file, line: line)
    }
}
