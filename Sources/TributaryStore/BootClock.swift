import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// The 128-bit id of the current boot (`/proc/sys/kernel/random/boot_id`).
///
/// `CLOCK_BOOTTIME` readings are only comparable between events that carry the same boot id.
public struct BootID: Hashable, Sendable, CustomStringConvertible {
    /// The 16 raw bytes.
    public var bytes: [UInt8]

    /// Wraps 16 raw bytes.
    public init<C: Collection>(bytes: C) where C.Element == UInt8 {
        precondition(bytes.count == 16, "a boot id has 16 bytes")
        self.bytes = Array(bytes)
    }

    /// The all-zero id, used when the kernel does not expose one.
    public static let unknown = BootID(bytes: [UInt8](repeating: 0, count: 16))

    /// Parses the canonical `8-4-4-4-12` hex form.
    public init?(uuidString: String) {
        let hexDigits = uuidString.filter { $0 != "-" && !$0.isWhitespace }
        guard hexDigits.count == 32 else { return nil }
        var out: [UInt8] = []
        var index = hexDigits.startIndex
        for _ in 0..<16 {
            let next = hexDigits.index(index, offsetBy: 2)
            guard let byte = UInt8(hexDigits[index..<next], radix: 16) else { return nil }
            out.append(byte)
            index = next
        }
        bytes = out
    }

    /// The id of the running boot, read once per process.
    public static let current: BootID = {
        guard let text = readSmallFile("/proc/sys/kernel/random/boot_id"), let id = BootID(uuidString: text) else {
            return .unknown
        }
        return id
    }()

    public var description: String {
        let hex = bytes.map { byte in
            let s = String(byte, radix: 16)
            return s.count == 1 ? "0" + s : s
        }.joined()
        let parts = [0..<8, 8..<12, 12..<16, 16..<20, 20..<32].map { range in
            String(hex[hex.index(hex.startIndex, offsetBy: range.lowerBound)..<hex.index(hex.startIndex, offsetBy: range.upperBound)])
        }
        return parts.joined(separator: "-")
    }
}

/// Monotonic time sources. Control (durations, deadlines, backoff) never uses the wall clock.
public enum BootClock {
    /// `CLOCK_BOOTTIME` in nanoseconds: monotonic, and keeps counting while the machine is suspended.
    @inline(__always)
    public static func nowNanos() -> UInt64 {
        var ts = timespec()
        clock_gettime(CLOCK_BOOTTIME, &ts)
        return UInt64(ts.tv_sec) &* 1_000_000_000 &+ UInt64(ts.tv_nsec)
    }

    /// Wall-clock time in milliseconds since the Unix epoch.
    @inline(__always)
    public static func wallMillis() -> Int64 {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        let millis = Int64(ts.tv_sec) * 1000 + Int64(ts.tv_nsec) / 1_000_000
        guard let offsetFile = wallClockOffsetFile else { return millis }
        return millis + (readSmallFile(offsetFile).flatMap { Int64($0.trimmingCharacters(in: .whitespacesAndNewlines)) } ?? 0)
    }

    /// Test seam for wall-clock jumps, which cannot be produced for real here (setting the clock needs
    /// CAP_SYS_TIME, and libfaketime's LD_PRELOAD empties Swift's `CommandLine.arguments`): when
    /// `TRIBUTARY_TEST_WALL_CLOCK_OFFSET_FILE` names a file, its content (milliseconds) is added to
    /// every wall-clock reading. Unset in production: one lookup per process.
    static let wallClockOffsetFile: String? = getenv("TRIBUTARY_TEST_WALL_CLOCK_OFFSET_FILE").map { String(cString: $0) }
}

/// Reads a small text file (under /proc or /sys) with plain syscalls, or returns nil.
public func readSmallFile(_ path: String, limit: Int = 4096) -> String? {
    let fd = open(path, O_RDONLY | O_CLOEXEC)
    guard fd >= 0 else { return nil }
    defer { close(fd) }
    var buffer = [UInt8](repeating: 0, count: limit)
    let n = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, limit) }
    guard n > 0 else { return nil }
    return String(decoding: buffer[0..<n], as: UTF8.self)
}
