import CTributaryCrash
import Foundation
import Tributary
import TributaryStore

#if canImport(Glibc)
import Glibc
import TributaryErrors
#endif

/// A crash found in a producer's crash file: what the signal handler recorded.
public struct CrashRecord: Sendable, Hashable {
    /// One frame of the backtrace, with the loaded object it falls in.
    public struct Frame: Sendable, Hashable {
        /// The absolute address in the crashed process.
        public var address: UInt64
        /// The object's file name (`tributary-sim`, `libc.so.6`), when known.
        public var module: String?
        /// `address` minus the object's load bias: what `addr2line -e <module>` takes.
        public var offset: UInt64?
    }

    /// The signal number.
    public var signal: Int32
    /// `si_code` (for SIGSEGV: 1 unmapped, 2 no permission; negative: sent by kill/raise/abort).
    public var code: Int32
    /// The crashed process.
    public var pid: Int32
    /// The crashed thread.
    public var tid: Int32
    /// `si_addr`: the faulting address.
    public var faultAddress: UInt64
    /// The program counter at the crash.
    public var instruction: UInt64
    /// Wall-clock time of the crash, ms since the epoch.
    public var wallTimeMillis: Int64
    /// `CLOCK_BOOTTIME` at the crash.
    public var bootTimeNanos: UInt64
    /// The boot the crash happened in.
    public var bootID: BootID
    /// True when the crash interrupted an `$AppStart` that had no `$AppEnd` yet.
    public var foreground: Bool
    /// When that start happened (monotonic, same boot).
    public var activeSince: UInt64
    /// `$session_id` of the crashed process at the crash.
    public var sessionID: String
    /// The page on screen at the crash (empty if none).
    public var screenName: String
    /// The crashed run's `$app_version`; nil in a record written before records carried it (version 1).
    public var appVersion: String?
    /// The backtrace: the program counter, then return addresses.
    public var frames: [Frame]

    /// The signal's name (`SIGSEGV`).
    public var signalName: String {
        switch signal {
        case SIGSEGV: "SIGSEGV"
        case SIGABRT: "SIGABRT"
        case SIGBUS: "SIGBUS"
        case SIGFPE: "SIGFPE"
        case SIGILL: "SIGILL"
        case SIGTRAP: "SIGTRAP"
        default: "signal \(signal)"
        }
    }

    /// `app_crashed_reason`: signal, code, faulting address, then one line per frame, as many frames
    /// as fit in `limit` UTF-8 bytes (the property value limit).
    public func reason(limit: Int = EventRules.maxStringBytes) -> String {
        var text =
            "\(signalName) (signal \(signal), code \(code)) at \(Self.hex(faultAddress)), pc \(Self.hex(instruction))"
        for (i, frame) in frames.enumerated() {
            var line = "\n#\(i) \(Self.hex(frame.address))"
            if let module = frame.module, let offset = frame.offset {
                line += " \(module) + 0x\(String(offset, radix: 16))"
            }
            guard text.utf8.count + line.utf8.count <= limit else { break }
            text += line
        }
        return text
    }

    static func hex(_ value: UInt64) -> String {
        let digits = String(value, radix: 16)
        return "0x" + String(repeating: "0", count: max(0, 16 - digits.count)) + digits
    }

    /// A stable id for one event derived from this crash, so that recording it twice (a crash between
    /// the commit and the clearing of the crash file) gives the same `event_id`, which dedups. The
    /// `$AppEnd` of an open start gets ``appEndEventID(pid:activeSince:bootID:)``, as the live one would.
    func eventID(for event: String) -> String {
        if event == "$AppEnd" { return Self.appEndEventID(pid: pid, activeSince: activeSince, bootID: bootID) }
        return Self.derivedID(pid: pid, wallTimeMillis, bootTimeNanos, bootID: bootID, event: event)
    }

    /// The `event_id` of the `$AppEnd` that closes the `$AppStart` of process `pid` at `activeSince`
    /// (`CLOCK_BOOTTIME` in `bootID`): the one tracked live and the one backfilled after a crash get the
    /// same id. A crash after the live one is stored but before the crash context says so records the
    /// start as still open; the backfill is then the same event again, which the collector dedups.
    public static func appEndEventID(pid: Int32, activeSince: UInt64, bootID: BootID) -> String {
        derivedID(pid: pid, 0, activeSince, bootID: bootID, event: "$AppEnd")
    }

    /// The `event_id` of the `$AppPageLeave` that ends the page visit process `pid` began at
    /// `visitStart` (`CLOCK_BOOTTIME` in `bootID`): the live one and one backfilled after a crash are the
    /// same event.
    public static func pageLeaveEventID(pid: Int32, visitStart: UInt64, bootID: BootID) -> String {
        derivedID(pid: pid, 0, visitStart, bootID: bootID, event: "$AppPageLeave")
    }

    /// An RFC 9562 version 8 UUID from two FNV-1a-style hashes of the fields.
    private static func derivedID(pid: Int32, _ wallTimeMillis: Int64, _ bootTimeNanos: UInt64, bootID: BootID, event: String) -> String {
        var h1: UInt64 = 0xcbf2_9ce4_8422_2325
        var h2: UInt64 = 0x8422_2325_cbf2_9ce4
        func mix(_ bytes: some Sequence<UInt8>) {
            for b in bytes {
                h1 = (h1 ^ UInt64(b)) &* 0x100_0000_01b3
                h2 = (h2 ^ UInt64(b)) &* 0x100_0000_01b3 &+ 0x9e37_79b9
            }
        }
        withUnsafeBytes(of: pid) { mix($0) }
        withUnsafeBytes(of: wallTimeMillis) { mix($0) }
        withUnsafeBytes(of: bootTimeNanos) { mix($0) }
        mix(bootID.bytes)
        mix(event.utf8)
        var bytes = withUnsafeBytes(of: h1.bigEndian) { Array($0) } + withUnsafeBytes(of: h2.bigEndian) { Array($0) }
        bytes[6] = (bytes[6] & 0x0f) | 0x80  // version 8 ("custom", RFC 9562): derived, not random
        bytes[8] = (bytes[8] & 0x3f) | 0x80  // RFC variant
        var text = ""
        for (i, byte) in bytes.enumerated() {
            if i == 4 || i == 6 || i == 8 || i == 10 { text += "-" }
            text += String(byte >> 4, radix: 16) + String(byte & 0x0f, radix: 16)
        }
        return text
    }
}

/// A crash file could not be opened, read or cleared.
public struct CrashLogError: TributaryError {
    /// What kind of failure this is.
    public struct Code: ErrorCode {
        private enum Kind: String { case crashFile }
        private let kind: Kind
        private init(_ kind: Kind) { self.kind = kind }
        public init?(rawValue: String) {
            guard let kind = Kind(rawValue: rawValue) else { return nil }
            self.kind = kind
        }
        public var rawValue: String { kind.rawValue }

        /// A crash file could not be opened, read, set aside or cleared; ``CrashLogError/errno`` says
        /// why when a system call failed.
        public static let crashFile = Code(.crashFile)
    }

    public var code: Code { .crashFile }
    /// The crash file.
    public var path: String
    /// What failed and why.
    public var message: String
    /// `errno`, when a system call failed.
    public var errno: Int32?
    public var cause: (any Error & Sendable)? { nil }
    public var location: SourceLocation

    /// `path` could not be used: `message` says how, `errno` why.
    public init(path: String, message: String, errno: Int32?, file: String = #fileID, line: Int = #line) {
        self.path = path
        self.message = message
        self.errno = errno
        location = SourceLocation(file: file, line: line)
    }

    public var description: String { "Crash file \(path): \(message)" }
}

/// The crash file of one producer, `<group>/crash-<producer id>.records`: fixed-size records appended
/// by the signal handler (see docs/autotrack.md, "Crash records"), turned into events at the next start.
///
/// At a start the records of earlier runs are first set aside in `<file>.pending`, so that this run's
/// handlers write to a file of their own: a crash while those records are tracked is kept, and a
/// failure to track them (a full store) does not leave the run without crash capture. The pending file
/// goes once its records are durable events; until then every start tries again.
public struct CrashLog: Sendable {
    /// The file the signal handler appends to.
    public let path: String
    /// Records of earlier runs, set aside until they are tracked.
    public var pendingPath: String { path + ".pending" }
    /// Size of one record.
    public static let recordSize = MemoryLayout<tributary_crash_record>.size
    /// Where a record's `app_version` begins: where a version 1 record's checksum is.
    static let appVersionOffset = MemoryLayout<tributary_crash_record>.offset(of: \.app_version)!
    static let checksumOffset = MemoryLayout<tributary_crash_record>.offset(of: \.checksum)!
    /// The size of a version 1 record (before records carried the app version).
    static let v1RecordSize = appVersionOffset + MemoryLayout<UInt64>.size

    /// The crash file of `producerID` in `groupDirectory`.
    public init(groupDirectory: String, producerID: String) {
        path = groupDirectory + "/" + Self.fileName(producerID: producerID)
    }

    /// `crash-<producer id>.records`; `%` and `/` in the id are written `%25` and `%2F`, and an id too
    /// long for a file name (255 bytes, with `.pending`) keeps its first 160 bytes and a hash of the rest.
    static func fileName(producerID: String) -> String {
        // By scalar, not by Character: "/" followed by a combining mark is one Character, not "/".
        var safe = ""
        for scalar in producerID.unicodeScalars {
            switch scalar {
            case "%": safe += "%25"
            case "/": safe += "%2F"
            default: safe.unicodeScalars.append(scalar)
            }
        }
        if ("crash-" + safe + ".records.pending").utf8.count > 255 {
            var kept = ""
            for character in safe {
                guard kept.utf8.count + character.utf8.count <= 160 else { break }
                kept.append(character)
            }
            let hash = Array(producerID.utf8).withUnsafeBytes {
                tributary_crash_checksum($0.baseAddress, UInt64($0.count))  // FNV-1a 64, as the records' checksum
            }
            let digits = String(hash, radix: 16)
            safe = kept + "-" + String(repeating: "0", count: 16 - digits.count) + digits
        }
        return "crash-" + safe + ".records"
    }

    /// Every complete, intact record not yet tracked: those set aside, then those in the file. A record
    /// torn by a kill or a power cut mid-write (wrong magic, size or checksum) is skipped, and reading
    /// resumes at the next intact record.
    public func read() throws -> [CrashRecord] {
        try Self.records(in: pendingPath) + Self.records(in: path)
    }

    /// The records set aside by ``setAside()``.
    func readSetAside() throws -> [CrashRecord] { try Self.records(in: pendingPath) }

    static func records(in path: String) throws -> [CrashRecord] {
        guard FileManager.default.fileExists(atPath: path) else { return [] }
        guard let data = FileManager.default.contents(atPath: path) else {
            throw CrashLogError(path: path, message: "cannot be read.", errno: Glibc.errno)
        }
        return data.withUnsafeBytes { raw in
            var records: [CrashRecord] = []
            var offset = 0
            while offset + v1RecordSize <= raw.count {
                let rest = UnsafeRawBufferPointer(rebasing: raw[offset...])
                if let record = decode(rest) {
                    records.append(record)
                    offset += record.appVersion == nil ? v1RecordSize : recordSize
                } else {
                    // A torn record: resynchronise on the next magic number (a record starts with it).
                    offset = nextMagic(in: raw, after: offset) ?? raw.count
                }
            }
            return records
        }
    }

    /// The offset of the next record magic after `offset`, if any.
    private static func nextMagic(in raw: UnsafeRawBufferPointer, after offset: Int) -> Int? {
        let magic = withUnsafeBytes(of: TRIBUTARY_CRASH_MAGIC) { Array($0) }
        var candidate = offset + 1
        while candidate + v1RecordSize <= raw.count {
            guard let hit = raw[candidate...].firstIndex(of: magic[0]) else { return nil }
            if hit + magic.count <= raw.count, raw[hit..<hit + magic.count].elementsEqual(magic) { return hit }
            candidate = hit + 1
        }
        return nil
    }

    static func decode(_ chunk: Data) -> CrashRecord? {
        chunk.withUnsafeBytes { decode($0) }
    }

    /// Decodes the record at the start of `raw` (it may go on past the record), version 2 or 1.
    static func decode(_ raw: UnsafeRawBufferPointer) -> CrashRecord? {
        guard raw.count >= v1RecordSize, raw.loadUnaligned(as: UInt32.self) == TRIBUTARY_CRASH_MAGIC else { return nil }
        let version = raw.loadUnaligned(fromByteOffset: 4, as: UInt32.self)
        let size = Int(raw.loadUnaligned(fromByteOffset: 8, as: UInt32.self))
        var r = tributary_crash_record()
        switch (version, size) {
        case (TRIBUTARY_CRASH_VERSION, recordSize) where raw.count >= recordSize:
            r = raw.loadUnaligned(as: tributary_crash_record.self)
            guard r.checksum == tributary_crash_checksum(raw.baseAddress, UInt64(checksumOffset)) else { return nil }
        case (1, v1RecordSize):
            // The same fields up to app_version, which a version 1 record does not have: its checksum is there.
            let checksum = raw.loadUnaligned(fromByteOffset: appVersionOffset, as: UInt64.self)
            guard checksum == tributary_crash_checksum(raw.baseAddress, UInt64(appVersionOffset)) else { return nil }
            withUnsafeMutableBytes(of: &r) { $0.copyMemory(from: UnsafeRawBufferPointer(rebasing: raw[..<appVersionOffset])) }
        default:
            return nil
        }
        var r2 = r
        let modules: [(bias: UInt64, start: UInt64, end: UInt64, name: String)] = withUnsafeBytes(of: &r2.modules) {
            m in
            let all = m.bindMemory(to: tributary_crash_module.self)
            return all.prefix(Int(min(r.module_count, UInt32(TRIBUTARY_CRASH_MAX_MODULES)))).map { module in
                var copy = module
                return (module.bias, module.start, module.end, cString(&copy.name))
            }
        }
        let addresses: [UInt64] = withUnsafeBytes(of: &r2.frames) { f in
            Array(f.bindMemory(to: UInt64.self).prefix(Int(min(r.frame_count, UInt32(TRIBUTARY_CRASH_MAX_FRAMES)))))
        }
        let frames = addresses.map { address in
            let module = modules.first { address >= $0.start && address < $0.end }
            return CrashRecord.Frame(
                address: address, module: module?.name, offset: module.map { address &- $0.bias })
        }
        return CrashRecord(
            signal: r.signal, code: r.code, pid: r.pid, tid: r.tid, faultAddress: r.fault_address,
            instruction: r.instruction, wallTimeMillis: r.wall_ms, bootTimeNanos: r.boot_ns,
            bootID: withUnsafeBytes(of: &r2.boot_id) { BootID(bytes: $0) }, foreground: r.foreground != 0,
            activeSince: r.active_since_ns, sessionID: cString(&r2.session_id),
            screenName: cString(&r2.screen_name), appVersion: version == 1 ? nil : cString(&r2.app_version),
            frames: frames)
    }

    /// Moves the records of earlier runs out of the handler's file into ``pendingPath`` (appending them
    /// to records set aside before and not yet tracked), durably, so that this run's handlers start on
    /// an empty file.
    ///
    /// Not while another live process of this producer id writes to the file (two instances of an app,
    /// both `app`): each holds a shared `flock` on it while its handlers are installed. Taken from under
    /// it, the file would be removed once its records were tracked, and that process's own crash, still
    /// to come, written to a file no longer there. Its records, and those of processes that died
    /// meanwhile, are set aside by a start when none holds it.
    func setAside() throws {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return }  // no crash file yet
        defer { close(fd) }  // and with it the lock taken below
        var file = stat()
        guard fstat(fd, &file) == 0, file.st_size > 0 else { return }
        if !Self.isInstalled(file), flock(fd, LOCK_EX | LOCK_NB) != 0 { return }
        // Locked, but is the path still that file? Another start may have set it aside meanwhile, and
        // the path now names the file a live process's handlers write to.
        guard Self.sameFile(file, as: path) else { return }
        if !FileManager.default.fileExists(atPath: pendingPath) {
            guard rename(path, pendingPath) == 0 else {
                throw CrashLogError(
                    path: path, message: "cannot be set aside as \(pendingPath): \(String(cString: strerror(Glibc.errno))).",
                    errno: Glibc.errno)
            }
        } else {
            // Appended twice if a kill comes before the unlink: the same records, the same event ids (dedup).
            do {
                let records = try Data(contentsOf: URL(fileURLWithPath: path))
                let pending = try FileHandle(forWritingTo: URL(fileURLWithPath: pendingPath))
                defer { try? pending.close() }
                try pending.seekToEnd()
                try pending.write(contentsOf: records)
                try pending.synchronize()
            } catch {
                throw CrashLogError(path: pendingPath, message: "cannot take the records of \(path): \(error).", errno: nil)
            }
            guard unlink(path) == 0 else {
                throw CrashLogError(path: path, message: "cannot be removed once set aside.", errno: Glibc.errno)
            }
        }
        syncDirectory()
    }

    /// Removes the records set aside, once they are durably tracked.
    func discardSetAside() throws {
        guard unlink(pendingPath) == 0 || Glibc.errno == ENOENT else {
            throw CrashLogError(
                path: pendingPath, message: "cannot be removed after its crashes were tracked.", errno: Glibc.errno)
        }
        syncDirectory()
    }

    /// Makes the renames and removals in the group directory durable (best effort: a directory that
    /// cannot be opened was just written to, so this does not fail in practice).
    private func syncDirectory() {
        let dir = open((path as NSString).deletingLastPathComponent, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        if dir >= 0 {
            fsync(dir)
            close(dir)
        }
    }

    /// Whether the file `held` describes (an open descriptor's `fstat`) is the one `path` names (the path
    /// was not set aside meanwhile).
    private static func sameFile(_ held: stat, as path: String) -> Bool {
        var named = stat()
        return stat(path, &named) == 0 && held.st_dev == named.st_dev && held.st_ino == named.st_ino
    }

    /// Whether `file` is the crash file this process's handlers write to (a second start in one process
    /// sets aside its own file: its shared lock is no other writer's).
    private static func isInstalled(_ file: stat) -> Bool {
        let fd = tributary_crash_current_fd()
        var installed = stat()
        return fd >= 0 && fstat(fd, &installed) == 0 && installed.st_dev == file.st_dev && installed.st_ino == file.st_ino
    }

    /// Opens the file for appending, holding a shared `flock` on it (see ``setAside()``), and installs the
    /// signal handlers that write to it.
    func install(bootID: BootID, appVersion: String) throws {
        // Another start setting the file aside holds it exclusively for a moment; the file at the path is
        // then a new one. Up to 2 s (a start stopped midway must not hold this one for ever), then the
        // handlers are installed on the file without the lock.
        var fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0o660)
        for _ in 0..<200 where fd >= 0 {
            var held = stat()
            if flock(fd, LOCK_SH | LOCK_NB) == 0, fstat(fd, &held) == 0, Self.sameFile(held, as: path) { break }
            close(fd)
            usleep(10_000)
            fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0o660)
        }
        guard fd >= 0 else {
            throw CrashLogError(
                path: path, message: "cannot be created: \(String(cString: strerror(Glibc.errno))).", errno: Glibc.errno
            )
        }
        syncDirectory()  // the file's directory entry must survive a power cut too
        tributary_crash_set_app_version(clipped(appVersion, toBytes: Int(TRIBUTARY_CRASH_APP_VERSION) - 1))
        let rc = bootID.bytes.withUnsafeBufferPointer { tributary_crash_install(fd, $0.baseAddress) }
        guard rc == 0 else {
            close(fd)
            throw CrashLogError(
                path: path, message: "signal handlers could not be installed: \(String(cString: strerror(rc))).",
                errno: rc)
        }
    }
}

/// A NUL-terminated C string stored in a fixed-size char tuple.
private func cString<T>(_ tuple: inout T) -> String {
    withUnsafeBytes(of: &tuple) { raw in
        String(decoding: raw.prefix { $0 != 0 }, as: UTF8.self)
    }
}
