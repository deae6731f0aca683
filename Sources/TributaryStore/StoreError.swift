import TributaryErrors

/// An error from the shared store.
///
/// Errors are structs with an extensible ``Code`` rather than enums, so that new failure kinds can be
/// added without breaking callers that `switch` over the codes they know. The ``message`` says what
/// happened and what to do; it never contains event property values.
public struct StoreError: TributaryError {
    /// What kind of failure this is.
    public struct Code: ErrorCode {
        private enum Kind: String {
            case storeFull, corruptRecord, insecureDirectory, notADirectory, permissionDenied, directoryUnavailable
            case unsupportedSchema, unreadableStore, valueTooLarge, lmdb, optionsConflict, invalidOptions
            case storeReplaced, invalidSettings, busy
        }
        private let kind: Kind
        private init(_ kind: Kind) { self.kind = kind }
        public init?(rawValue: String) {
            guard let kind = Kind(rawValue: rawValue) else { return nil }
            self.kind = kind
        }
        public var rawValue: String { kind.rawValue }

        /// The store reached its size quota; nothing was written and nothing stored was touched.
        public static let storeFull = Code(.storeFull)
        /// A stored record failed its CRC or structure check.
        public static let corruptRecord = Code(.corruptRecord)
        /// The group directory is writable by other users.
        public static let insecureDirectory = Code(.insecureDirectory)
        /// The group path, or a folder on the way to it, is not a directory.
        public static let notADirectory = Code(.notADirectory)
        /// This user may not use the group directory or a file in it (`EACCES`): it is not the owner
        /// and not in the group that owns it.
        public static let permissionDenied = Code(.permissionDenied)
        /// The group directory could not be created or read.
        public static let directoryUnavailable = Code(.directoryUnavailable)
        /// The store was written by a newer, incompatible version of Tributary.
        public static let unsupportedSchema = Code(.unsupportedSchema)
        /// The store's data file or lock file is not an LMDB environment this liblmdb reads (`MDB_INVALID`,
        /// `MDB_VERSION_MISMATCH`): a damaged file, or a lock file made by an LMDB build of another format
        /// (another word size, a process of another architecture sharing the directory) and still in use.
        /// Nothing was opened or written.
        public static let unreadableStore = Code(.unreadableStore)
        /// A value is too large to be stored (an LMDB key or record limit).
        public static let valueTooLarge = Code(.valueTooLarge)
        /// Any other LMDB failure; ``StoreError/lmdbCode`` holds LMDB's result code.
        public static let lmdb = Code(.lmdb)
        /// The store is already open in this process with another durability or quota.
        public static let optionsConflict = Code(.optionsConflict)
        /// A `SharedStore.Options` value is out of range (a quota below ``SharedStore/minimumQuota``).
        public static let invalidOptions = Code(.invalidOptions)
        /// The store file this process has open was deleted, moved or created anew since it was opened:
        /// nothing was written, since no other process would ever read it. Open the store again (a new
        /// `SharedStore` or `Tracker`; when one of its two files was kept, only once every old one is gone).
        public static let storeReplaced = Code(.storeReplaced)
        /// The group's agent settings (``AgentSettings``) are not a JSON object, name an unknown key,
        /// or hold a value of the wrong type or out of range; when writing, nothing was written.
        public static let invalidSettings = Code(.invalidSettings)
        /// A read found the store grown by another process past this process's map, and could not adopt
        /// the new size: a transaction of this process kept it from doing so (a write waiting for the
        /// store's writer lock, which another process holds, stopped or slow). Nothing was read; the
        /// same read may be tried again.
        public static let busy = Code(.busy)
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
