import CDeflate

/// The kind of process that produced an event.
public struct ProducerKind: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    public let rawValue: UInt8
    public init(rawValue: UInt8) { self.rawValue = rawValue }

    /// The main app.
    public static let app = ProducerKind(rawValue: 0)
    /// A short-lived app extension (share sheet, widget, notification service).
    public static let `extension` = ProducerKind(rawValue: 1)
    /// A hybrid web page whose JavaScript SDK handed the event to the native side.
    public static let hybrid = ProducerKind(rawValue: 2)

    /// The kinds with a name, for parsing and help text.
    public static let named: [(String, ProducerKind)] = [("app", .app), ("extension", .extension), ("hybrid", .hybrid)]

    /// Parses `app`, `extension` or `hybrid`.
    public init?(name: String) {
        guard let kind = Self.named.first(where: { $0.0 == name })?.1 else { return nil }
        self = kind
    }

    public var description: String { Self.named.first(where: { $0.1 == self })?.0 ?? "kind(\(rawValue))" }
}

/// One event as stored in the shared store: a fixed header and the event JSON.
///
/// The byte layout is specified in `docs/store-format.md` (record format version 2). All integers are
/// big-endian. The CRC-32 (IEEE 802.3 polynomial, as zlib's) covers every byte but the CRC field itself (version,
/// producer kind, header length, the rest of the header and the whole body), so a torn or flipped
/// byte anywhere is detected. Version 1 records, whose CRC left out the first four bytes, are still read.
public struct EventRecord: Sendable, Equatable {
    /// The record format this code writes.
    public static let formatVersion: UInt8 = 2
    /// The first format, still read: its CRC covers bytes 8 … end only.
    static let legacyFormatVersion: UInt8 = 1
    /// Size of the header before the producer id.
    static let fixedHeaderSize = 54
    /// Longest producer id, in UTF-8 bytes.
    public static let maxProducerIDBytes = 255

    /// Which kind of process produced the event.
    public var producerKind: ProducerKind
    /// The producer's id (for example `app`, `share-extension`).
    public var producerID: String
    /// The producer's process id at the time of the event.
    public var pid: Int32
    /// The producer's own sequence number (1, 2, 3, … per producer id, gap-free).
    public var producerSeq: UInt64
    /// Wall-clock time when the event was triggered, in ms since the Unix epoch.
    public var wallTimeMillis: Int64
    /// `CLOCK_BOOTTIME` when the event was triggered, in ns.
    public var bootTimeNanos: UInt64
    /// The boot the `bootTimeNanos` reading belongs to (`/proc/sys/kernel/random/boot_id`).
    public var bootID: BootID
    /// The event JSON (UTF-8).
    public var body: [UInt8]

    /// Creates a record.
    public init(
        producerKind: ProducerKind, producerID: String, pid: Int32, producerSeq: UInt64, wallTimeMillis: Int64,
        bootTimeNanos: UInt64, bootID: BootID, body: [UInt8]
    ) {
        self.producerKind = producerKind
        self.producerID = producerID
        self.pid = pid
        self.producerSeq = producerSeq
        self.wallTimeMillis = wallTimeMillis
        self.bootTimeNanos = bootTimeNanos
        self.bootID = bootID
        self.body = body
    }

    /// Size of the encoded record in bytes.
    public var encodedSize: Int { Self.fixedHeaderSize + producerID.utf8.count + body.count }

    /// Writes the encoded record into `out`, which must be exactly ``encodedSize`` bytes.
    public func encode(into out: UnsafeMutableRawBufferPointer) {
        precondition(out.count == encodedSize, "record buffer has the wrong size")
        let idBytes = producerID.utf8
        var w = ByteWriter(out)
        w.u8(Self.formatVersion)
        w.u8(producerKind.rawValue)
        w.u16(UInt16(Self.fixedHeaderSize + idBytes.count))
        w.u32(0)  // CRC, filled in below
        w.u32(UInt32(bitPattern: pid))
        w.u64(producerSeq)
        w.u64(UInt64(bitPattern: wallTimeMillis))
        w.u64(bootTimeNanos)
        w.bytes(bootID.bytes)
        w.u16(UInt16(idBytes.count))
        w.bytes(idBytes)
        w.bytes(body)
        let crc = Self.crc(of: UnsafeRawBufferPointer(out), version: Self.formatVersion)
        withUnsafeBytes(of: crc.bigEndian) { out.baseAddress!.advanced(by: 4).copyMemory(from: $0.baseAddress!, byteCount: 4) }
    }

    /// Encodes the record into a new array.
    public func encoded() -> [UInt8] {
        [UInt8](unsafeUninitializedCapacity: encodedSize) { buffer, count in
            encode(into: UnsafeMutableRawBufferPointer(buffer))
            count = encodedSize
        }
    }

    /// Why a stored record could not be decoded.
    public struct Corruption: Error, Sendable, Equatable, CustomStringConvertible {
        /// A sentence naming the check that failed.
        public var reason: String
        public var description: String { reason }
    }

    /// Decodes and verifies a stored record. A record whose CRC does not match is never returned.
    public static func decode(_ bytes: UnsafeRawBufferPointer) throws(Corruption) -> EventRecord {
        EventRecord(try view(bytes))
    }

    /// Copies a record read in place.
    public init(_ view: View) {
        self.init(
            producerKind: view.producerKind, producerID: String(decoding: view.producerID, as: UTF8.self), pid: view.pid,
            producerSeq: view.producerSeq, wallTimeMillis: view.wallTimeMillis, bootTimeNanos: view.bootTimeNanos,
            bootID: BootID(bytes: view.bootID), body: Array(view.body))
    }

    /// A verified stored record read in place: its header's fields, and its producer id, boot id and
    /// body as views into the bytes it was read from (valid only as long as those are, e.g. during
    /// the LMDB read transaction).
    public struct View {
        /// Which kind of process produced the event.
        public var producerKind: ProducerKind
        /// The producer id (valid UTF-8).
        public var producerID: UnsafeRawBufferPointer
        /// The producer's process id at the time of the event.
        public var pid: Int32
        /// The producer's own sequence number.
        public var producerSeq: UInt64
        /// Wall-clock time at trigger, in ms since the Unix epoch.
        public var wallTimeMillis: Int64
        /// `CLOCK_BOOTTIME` at trigger, in ns.
        public var bootTimeNanos: UInt64
        /// The 16 bytes of the boot id.
        public var bootID: UnsafeRawBufferPointer
        /// The event JSON (UTF-8).
        public var body: UnsafeRawBufferPointer
    }

    /// Decodes and verifies a stored record without copying it (see ``View``). A record whose CRC does
    /// not match is never returned.
    public static func view(_ bytes: UnsafeRawBufferPointer) throws(Corruption) -> View {
        guard bytes.count >= fixedHeaderSize else {
            throw Corruption(reason: "record is \(bytes.count) bytes, shorter than the \(fixedHeaderSize)-byte header")
        }
        var r = ByteReader(bytes)
        let version = r.u8()
        guard version == formatVersion || version == legacyFormatVersion else {
            throw Corruption(reason: "record format version \(version) is not supported (expected \(formatVersion))")
        }
        let kind = ProducerKind(rawValue: r.u8())
        let headerLength = Int(r.u16())
        let storedCRC = r.u32()
        let actualCRC = crc(of: bytes, version: version)
        guard storedCRC == actualCRC else {
            throw Corruption(
                reason: "CRC mismatch: stored \(hex(storedCRC)), computed \(hex(actualCRC)) over \(bytes.count - 8) bytes")
        }
        let pid = Int32(bitPattern: r.u32())
        let producerSeq = r.u64()
        let wall = Int64(bitPattern: r.u64())
        let boot = r.u64()
        let bootID = r.bytes(16)
        let idLength = Int(r.u16())
        guard (1...Self.maxProducerIDBytes).contains(idLength) else {
            throw Corruption(reason: "producer id length \(idLength) is not 1 … \(Self.maxProducerIDBytes)")
        }
        guard headerLength == fixedHeaderSize + idLength, headerLength <= bytes.count else {
            throw Corruption(reason: "header length \(headerLength) does not match producer id length \(idLength)")
        }
        let idBytes = r.bytes(idLength)
        // ASCII (the usual case) is valid UTF-8 without building a String.
        guard idBytes.allSatisfy({ $0 < 0x80 }) || String(validating: idBytes, as: UTF8.self) != nil else {
            throw Corruption(reason: "producer id is not valid UTF-8")
        }
        return View(
            producerKind: kind, producerID: idBytes, pid: pid, producerSeq: producerSeq, wallTimeMillis: wall,
            bootTimeNanos: boot, bootID: bootID, body: UnsafeRawBufferPointer(rebasing: bytes[headerLength...]))
    }
}

extension EventRecord {
    /// The CRC a record of `version` stores: of bytes 0 … 3 and 8 … end (version 2), or of bytes
    /// 8 … end only (version 1, which left the producer kind and header length unprotected).
    static func crc(of record: UnsafeRawBufferPointer, version: UInt8) -> UInt32 {
        let tail = UnsafeRawBufferPointer(rebasing: record[8...])
        guard version != legacyFormatVersion else { return crc32Of(tail) }
        let head = crc32Of(UnsafeRawBufferPointer(rebasing: record[0..<4]))
        return libdeflate_crc32(head, tail.baseAddress, tail.count)
    }
}

/// CRC-32 (the IEEE 802.3 polynomial, as zlib's `crc32`) of `bytes`, through libdeflate, which
/// folds 64 bytes at a time with carry-less multiplies where the CPU has them.
@inline(__always)
func crc32Of(_ bytes: UnsafeRawBufferPointer) -> UInt32 {
    guard let base = bytes.baseAddress, !bytes.isEmpty else { return 0 }
    return libdeflate_crc32(0, base, bytes.count)
}

private func hex(_ value: UInt32) -> String {
    let digits = String(value, radix: 16)
    return "0x" + String(repeating: "0", count: max(0, 8 - digits.count)) + digits
}

struct ByteWriter {
    let out: UnsafeMutableRawBufferPointer
    var offset = 0
    init(_ out: UnsafeMutableRawBufferPointer) { self.out = out }

    mutating func u8(_ v: UInt8) { out[offset] = v; offset += 1 }
    mutating func u16(_ v: UInt16) { store(v.bigEndian) }
    mutating func u32(_ v: UInt32) { store(v.bigEndian) }
    mutating func u64(_ v: UInt64) { store(v.bigEndian) }
    private mutating func store<T: FixedWidthInteger>(_ v: T) {
        out.storeBytes(of: v, toByteOffset: offset, as: T.self)
        offset += MemoryLayout<T>.size
    }
    mutating func bytes<C: Collection>(_ c: C) where C.Element == UInt8 {
        let target = UnsafeMutableRawBufferPointer(rebasing: out[offset..<(offset + c.count)])
        target.copyBytes(from: c)
        offset += c.count
    }
}

struct ByteReader {
    let bytes: UnsafeRawBufferPointer
    var offset = 0
    init(_ bytes: UnsafeRawBufferPointer) { self.bytes = bytes }

    mutating func u8() -> UInt8 { defer { offset += 1 }; return bytes[offset] }
    mutating func u16() -> UInt16 { UInt16(bigEndian: load()) }
    mutating func u32() -> UInt32 { UInt32(bigEndian: load()) }
    mutating func u64() -> UInt64 { UInt64(bigEndian: load()) }
    private mutating func load<T: FixedWidthInteger>() -> T {
        defer { offset += MemoryLayout<T>.size }
        return bytes.loadUnaligned(fromByteOffset: offset, as: T.self)
    }
    mutating func bytes(_ n: Int) -> UnsafeRawBufferPointer {
        precondition(offset + n <= bytes.count, "read past the end of a record")
        defer { offset += n }
        return UnsafeRawBufferPointer(rebasing: bytes[offset..<(offset + n)])
    }
}
