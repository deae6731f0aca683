/// An error from the shared store.
///
/// Errors are structs with an extensible ``Code`` rather than enums, so that new failure kinds can be
/// added without breaking callers that `switch` over the codes they know. The ``message`` says what
/// happened and what to do; it never contains event property values.
public struct StoreError: Error, CustomStringConvertible, Sendable {
    /// What kind of failure this is.
    public struct Code: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
        public let rawValue: String
        public init(rawValue: String) { self.rawValue = rawValue }
        public var description: String { rawValue }

        /// The store reached its size quota; nothing was written and nothing stored was touched.
        public static let storeFull = Code(rawValue: "storeFull")
        /// A stored record failed its CRC or structure check.
        public static let corruptRecord = Code(rawValue: "corruptRecord")
        /// The group directory is writable by other users.
        public static let insecureDirectory = Code(rawValue: "insecureDirectory")
        /// The group path, or a folder on the way to it, is not a directory.
        public static let notADirectory = Code(rawValue: "notADirectory")
        /// This user may not use the group directory or a file in it (`EACCES`): it is not the owner
        /// and not in the group that owns it.
        public static let permissionDenied = Code(rawValue: "permissionDenied")
        /// The group directory could not be created or read.
        public static let directoryUnavailable = Code(rawValue: "directoryUnavailable")
        /// The store was written by a newer, incompatible version of Tributary.
        public static let unsupportedSchema = Code(rawValue: "unsupportedSchema")
        /// The store's data file or lock file is not an LMDB environment this liblmdb reads (`MDB_INVALID`,
        /// `MDB_VERSION_MISMATCH`): a damaged file, or a lock file made by an LMDB build of another format
        /// (another word size, a process of another architecture sharing the directory) and still in use.
        /// Nothing was opened or written.
        public static let unreadableStore = Code(rawValue: "unreadableStore")
        /// A value is too large to be stored (an LMDB key or record limit).
        public static let valueTooLarge = Code(rawValue: "valueTooLarge")
        /// Any other LMDB failure; ``StoreError/lmdbCode`` holds LMDB's result code.
        public static let lmdb = Code(rawValue: "lmdb")
        /// The store is already open in this process with another durability or quota.
        public static let optionsConflict = Code(rawValue: "optionsConflict")
        /// A `SharedStore.Options` value is out of range (a quota below ``SharedStore/minimumQuota``).
        public static let invalidOptions = Code(rawValue: "invalidOptions")
        /// The store file this process has open was deleted, moved or created anew since it was opened:
        /// nothing was written, since no other process would ever read it. Open the store again (a new
        /// `SharedStore` or `Tracker`; when one of its two files was kept, only once every old one is gone).
        public static let storeReplaced = Code(rawValue: "storeReplaced")
        /// The group's agent settings (``AgentSettings``) are not a JSON object, name an unknown key,
        /// or hold a value of the wrong type or out of range; when writing, nothing was written.
        public static let invalidSettings = Code(rawValue: "invalidSettings")
        /// A read found the store grown by another process past this process's map, and could not adopt
        /// the new size: a transaction of this process kept it from doing so (a write waiting for the
        /// store's writer lock, which another process holds, stopped or slow). Nothing was read; the
        /// same read may be tried again.
        public static let busy = Code(rawValue: "busy")
    }

    /// What kind of failure this is.
    public var code: Code
    /// A sentence saying what went wrong and what to do about it.
    public var message: String
    /// LMDB's (or the system's) result code, when the failure came from a C call.
    public var lmdbCode: Int32?
    /// The underlying error, if any.
    public var cause: (any Error & Sendable)?
    /// Where the error was raised, for bug reports.
    public var location: SourceLocation

    /// Where in Tributary's source an error was raised.
    public struct SourceLocation: Sendable, CustomStringConvertible {
        public var file: String
        public var line: Int
        public var description: String { "\(file):\(line)" }
    }

    /// Creates an error.
    public init(
        _ code: Code, _ message: String, lmdbCode: Int32? = nil, cause: (any Error & Sendable)? = nil,
        file: String = #fileID, line: Int = #line
    ) {
        self.code = code
        self.message = message
        self.lmdbCode = lmdbCode
        self.cause = cause
        self.location = SourceLocation(file: file, line: line)
    }

    public var description: String {
        var text = "\(code): \(message)"
        if let lmdbCode { text += " (LMDB \(lmdbCode): \(LMDBResult(lmdbCode)))" }
        if let cause { text += " [cause: \(cause)]" }
        return text
    }
}

extension StoreError {
    /// The status (sysexits.h) `tributary` and `tributary-sim` end with for this error (the agent maps
    /// a few codes its own way: a service manager restarts on some, not others):
    /// 75 `EX_TEMPFAIL` for a full or replaced store (retry), 77 `EX_NOPERM` for a group directory this
    /// user may not use or that every user may write, 64 `EX_USAGE` for a group path that is no
    /// directory, 66 `EX_NOINPUT` for no group or no store, 65 `EX_DATAERR` for a value refused, and 74
    /// `EX_IOERR` for any other failure.
    package var exitStatus: Int32 {
        switch code {
        case .storeFull, .storeReplaced: 75
        case .insecureDirectory, .permissionDenied: 77
        case .notADirectory: 64
        case .directoryUnavailable: 66
        case .valueTooLarge, .invalidSettings: 65
        default: 74
        }
    }
}
