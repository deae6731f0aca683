/// The one shape of every public Tributary error (swift-nio's `FileSystemError`, swift-service-lifecycle's
/// `ServiceGroupError`): a ``code`` to `switch` or `catch` on, a ``message`` that says what happened
/// and what to do, the underlying error as its ``cause``, and the ``location`` it was raised at.
///
/// Two errors are equal when their codes are: the message and location say more to a person, but a
/// program decides by the code. Messages never contain event property values.
public protocol TributaryError: Error, CustomStringConvertible, Sendable, Equatable {
    associatedtype Code: ErrorCode
    /// What kind of failure this is.
    var code: Code { get }
    /// A sentence saying what went wrong and what to do about it.
    var message: String { get }
    /// The underlying error, if any.
    var cause: (any Error & Sendable)? { get }
    /// Where in Tributary's source the error was raised, for bug reports.
    var location: SourceLocation { get }
}

extension TributaryError {
    /// Equal when the codes are.
    public static func == (lhs: Self, rhs: Self) -> Bool { lhs.code == rhs.code }

    /// `code: message [cause: …]`.
    public var description: String { "\(code): \(message)" + (cause.map { " [cause: \($0)]" } ?? "") }
}

/// An error's code: a struct with named static values over a private set of cases, so that a new
/// kind of failure can be added without breaking a caller's `switch` (which keeps a `default`).
/// Its ``rawValue`` is the name metrics, logs and status files show.
public protocol ErrorCode: RawRepresentable<String>, Hashable, Sendable, CustomStringConvertible {}

extension ErrorCode {
    public var description: String { rawValue }
}

/// Where in Tributary's source an error was raised.
public struct SourceLocation: Sendable, Hashable, CustomStringConvertible {
    /// The file, as `#fileID` names it (`TributaryStore/Transaction.swift`).
    public var file: String
    public var line: Int

    /// The caller's location, by default.
    public init(file: String = #fileID, line: Int = #line) {
        self.file = file
        self.line = line
    }

    public var description: String { "\(file):\(line)" }
}
