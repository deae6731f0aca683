import CLMDB

/// An LMDB result code, usable in `switch` and comparisons.
public struct LMDBResult: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    public let rawValue: Int32
    public init(rawValue: Int32) { self.rawValue = rawValue }
    /// Wraps a raw result code.
    public init(_ rawValue: Int32) { self.rawValue = rawValue }

    public static let success = LMDBResult(MDB_SUCCESS)
    public static let notFound = LMDBResult(MDB_NOTFOUND)
    public static let mapFull = LMDBResult(MDB_MAP_FULL)
    public static let mapResized = LMDBResult(MDB_MAP_RESIZED)
    public static let readersFull = LMDBResult(MDB_READERS_FULL)
    public static let badValueSize = LMDBResult(MDB_BAD_VALSIZE)
    public static let keyExists = LMDBResult(MDB_KEYEXIST)

    /// LMDB's own text for the code (`mdb_strerror`), which also covers errno values.
    public var description: String { String(cString: MDB.strerror(rawValue)) }
}
