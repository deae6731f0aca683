import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// A random (version 4) UUID in canonical lowercase text form.
///
/// On the `track()` hot path: 16 bytes from ``RandomPool`` and a direct hex encoding, no intermediate
/// strings.
public func randomUUIDString() -> String {
    var bytes = RandomPool.shared.next16()
    return withUnsafeMutableBytes(of: &bytes) { raw in
        raw[6] = (raw[6] & 0x0f) | 0x40
        raw[8] = (raw[8] & 0x3f) | 0x80
        return canonicalUUIDString(UnsafeRawBufferPointer(raw))
    }
}

/// A time-ordered (version 7, RFC 9562) UUID in canonical lowercase text form: the Unix time in
/// milliseconds in its first 48 bits, then 74 random bits from ``RandomPool``.
///
/// Event ids use it. Ids made later sort later (to the millisecond), so a database that indexes
/// them (a collector deduplicating on the event id) appends each batch's ids at the end of its
/// index instead of scattering them over every page of it: with random ids, each event of a batch
/// dirties its own index page, and a write-ahead log writes the whole page for it.
///
/// - Parameter unixMillis: the time to encode, in ms since the Unix epoch; the wall clock's by default.
public func timeOrderedUUIDString(unixMillis: Int64 = BootClock.wallMillis()) -> String {
    var bytes = RandomPool.shared.next16()
    return withUnsafeMutableBytes(of: &bytes) { raw in
        let millis = UInt64(clamping: unixMillis)
        for index in 0..<6 { raw[index] = UInt8(truncatingIfNeeded: millis >> (8 * (5 - index))) }
        raw[6] = (raw[6] & 0x0f) | 0x70
        raw[8] = (raw[8] & 0x3f) | 0x80
        return canonicalUUIDString(UnsafeRawBufferPointer(raw))
    }
}

/// The 8-4-4-4-12 lowercase hex form of 16 bytes.
private func canonicalUUIDString(_ raw: UnsafeRawBufferPointer) -> String {
    String(unsafeUninitializedCapacity: 36) { out in
        let hex: StaticString = "0123456789abcdef"
        var i = 0
        for (index, byte) in raw.enumerated() {
            if index == 4 || index == 6 || index == 8 || index == 10 {
                out[i] = UInt8(ascii: "-")
                i += 1
            }
            out[i] = hex.utf8Start[Int(byte >> 4)]
            out[i + 1] = hex.utf8Start[Int(byte & 0x0f)]
            i += 2
        }
        return 36
    }
}

/// A uniformly random integer in `0...bound`, from ``RandomPool``.
public func randomInteger(upTo bound: UInt64) -> UInt64 {
    var generator = RandomPool.Generator()
    return UInt64.random(in: 0...bound, using: &generator)
}

/// The kernel's randomness, drawn 4 KiB at a time and handed out in pieces.
///
/// `SystemRandomNumberGenerator` makes one `getrandom(2)` call per 8 bytes; two draws per event (the
/// event id and `_track_id`) cost a few microseconds of system time on every `track()`. The pool
/// fills 4 KiB with glibc's `arc4random_buf` (the kernel CSPRNG through `getrandom`) once per 256
/// draws and hands each byte out once. A forked child refills before its first draw (a
/// `pthread_atfork` child handler bumps ``forks``, which the pool compares with the count it filled
/// under), so parent and child never hand out the same bytes.
public final class RandomPool: Sendable {
    /// Draws random words from the shared pool.
    public struct Generator: RandomNumberGenerator {
        public init() {}
        public mutating func next() -> UInt64 { RandomPool.shared.next16().0 }
    }

    private struct State {
        var bytes = [UInt8](repeating: 0, count: 4096)
        var used = 4096
        var filledAfterFork = 0
    }

    static let shared = RandomPool()
    private let state = Mutex(State())
    /// How many times this process image was forked into (bumped in the child, async-signal-safe).
    static let forks = Atomic<Int>(0)

    private init() {
        pthread_atfork(nil, nil) { RandomPool.forks.add(1, ordering: .relaxed) }
    }

    /// The next 16 random bytes.
    func next16() -> (UInt64, UInt64) {
        state.withLock { state in
            let forks = Self.forks.load(ordering: .relaxed)
            if state.used + 16 > state.bytes.count || state.filledAfterFork != forks {
                state.bytes.withUnsafeMutableBytes { Self.fill($0) }
                state.used = 0
                state.filledAfterFork = forks
            }
            defer { state.used += 16 }
            return state.bytes.withUnsafeBytes { raw in
                (raw.loadUnaligned(fromByteOffset: state.used, as: UInt64.self),
                 raw.loadUnaligned(fromByteOffset: state.used + 8, as: UInt64.self))
            }
        }
    }

    private static func fill(_ buffer: UnsafeMutableRawBufferPointer) {
        arc4random_buf(buffer.baseAddress!, buffer.count)
    }
}
