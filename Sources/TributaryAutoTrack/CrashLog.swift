import CTributaryCrash
import Foundation
import Tributary
import TributaryStore

#if canImport(Glibc)
import Glibc
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
    /// the commit and the clearing of the crash file) gives the same `event_id`, which dedups.
    func eventID(for event: String) -> String {
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
public struct CrashLogError: Error, CustomStringConvertible, Sendable {
    /// The crash file.
    public var path: String
    /// What failed and why.
    public var message: String
    /// `errno`, when a system call failed.
    public var errno: Int32?

    public var description: String { "Crash file \(path): \(message)" }
}

/// The crash file of one producer, `<group>/crash-<producer id>.records`: fixed-size records appended
/// by the signal handler (see docs/autotrack.md, "Crash records"), turned into events at the next start.
public struct CrashLog: Sendable {
    /// The file.
    public let path: String
    /// Size of one record.
    public static let recordSize = MemoryLayout<tributary_crash_record>.size

    /// The crash file of `producerID` in `groupDirectory`.
    public init(groupDirectory: String, producerID: String) {
        path = groupDirectory + "/crash-" + producerID + ".records"
    }

    /// Every complete, intact record in the file. A record torn by a kill or a power cut mid-write
    /// (wrong magic, size or checksum) is skipped, and reading resumes at the next intact record.
    public func read() throws -> [CrashRecord] {
        guard FileManager.default.fileExists(atPath: path) else { return [] }
        guard let data = FileManager.default.contents(atPath: path) else {
            throw CrashLogError(path: path, message: "cannot be read.", errno: Glibc.errno)
        }
        var records: [CrashRecord] = []
        var offset = 0
        while offset + Self.recordSize <= data.count {
            if let record = Self.decode(data.subdata(in: offset..<offset + Self.recordSize)) {
                records.append(record)
                offset += Self.recordSize
            } else {
                offset += 1  // a torn record: resynchronise on the next intact one
            }
        }
        return records
    }

    static func decode(_ chunk: Data) -> CrashRecord? {
        chunk.withUnsafeBytes { raw -> CrashRecord? in
            let r = raw.loadUnaligned(as: tributary_crash_record.self)
            guard r.magic == TRIBUTARY_CRASH_MAGIC, r.version == TRIBUTARY_CRASH_VERSION,
                Int(r.size) == recordSize,
                r.checksum
                    == tributary_crash_checksum(
                        raw.baseAddress, UInt64(MemoryLayout<tributary_crash_record>.offset(of: \.checksum)!))
            else { return nil }
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
                screenName: cString(&r2.screen_name),
                frames: frames)
        }
    }

    /// Empties the file once its records are durably tracked.
    public func clear() throws {
        guard FileManager.default.fileExists(atPath: path) else { return }
        let fd = open(path, O_WRONLY | O_CLOEXEC)
        guard fd >= 0 else {
            throw CrashLogError(path: path, message: "cannot be opened to clear it.", errno: Glibc.errno)
        }
        defer { close(fd) }
        guard ftruncate(fd, 0) == 0, fsync(fd) == 0 else {
            throw CrashLogError(
                path: path, message: "cannot be truncated after its crashes were tracked.", errno: Glibc.errno)
        }
    }

    /// Opens the file for appending and installs the signal handlers that write to it.
    func install(bootID: BootID) throws {
        let fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0o660)
        guard fd >= 0 else {
            throw CrashLogError(
                path: path, message: "cannot be created: \(String(cString: strerror(Glibc.errno))).", errno: Glibc.errno
            )
        }
        // The file's directory entry must survive a power cut too.
        let dir = open((path as NSString).deletingLastPathComponent, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        if dir >= 0 {
            fsync(dir)
            close(dir)
        }
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
