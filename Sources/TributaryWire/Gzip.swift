import CDeflate
import CZlib
import Synchronization

/// gzip (RFC 1952) through libdeflate, with zlib's streaming inflate for what libdeflate cannot take.
///
/// libdeflate compresses a whole buffer at once, about twice as fast as zlib's `deflate` at the
/// same level on batch bodies, and computes the gzip CRC-32 with carry-less multiplies. It also
/// inflates a gzip member whose size is known (its trailer states it) in one call, twice as fast as
/// zlib's `inflate`. zlib's streaming `inflate` takes everything else: a zlib stream, a body of
/// several gzip members, a body whose trailer does not state its size, and every damaged body, since
/// it reads into a growing buffer and tells a truncated body from a corrupt one.
public enum Gzip {
    /// The default level, 6: zlib's default on the scale zlib and libdeflate share.
    public static let defaultLevel: Int32 = 6

    /// Compresses `input` into a gzip member at `level` (1 fastest … 9 smallest, as zlib's; libdeflate
    /// also takes 10 … 12, slower and smaller; 0 stores).
    public static func compress(_ input: [UInt8], level: Int32 = defaultLevel) throws(WireError) -> [UInt8] {
        guard (0...12).contains(level) else {
            throw WireError(.compression, "There is no gzip compression level \(level); levels are 0 … 12.")
        }
        return try withCompressor(level: level) { compressor throws(WireError) in
            let bound = libdeflate_gzip_compress_bound(compressor, input.count)
            let output = [UInt8](unsafeUninitializedCapacity: bound) { outBuf, written in
                written = input.withUnsafeBytes { inBuf in
                    // libdeflate reads nothing of an empty input, but wants a pointer all the same.
                    libdeflate_gzip_compress(
                        compressor, inBuf.baseAddress ?? UnsafeRawPointer(outBuf.baseAddress!), inBuf.count,
                        outBuf.baseAddress, outBuf.count)
                }
            }
            // The bound is libdeflate's worst case: 0 (no room) cannot happen short of a libdeflate bug.
            guard !output.isEmpty else {
                throw WireError(.compression, "libdeflate could not compress \(input.count) bytes into \(bound).")
            }
            return output
        }
    }

    /// A libdeflate compressor, owned by whoever took it out of ``idleCompressors``.
    private struct Compressor: @unchecked Sendable {
        let pointer: OpaquePointer
    }

    /// Undoes a request's `Content-Encoding` (RFC 9110 §8.4: the codings in the order they were
    /// applied, comma-separated, case-insensitive): `gzip` and `x-gzip` are decompressed (to at most
    /// `limit` bytes), `identity` and an absent or empty header leave the body as it is.
    ///
    /// - Throws: `WireError` `unsupportedMediaType` for any other coding (`br`, `deflate`, `zstd`, …):
    ///   a body this side cannot read must not be taken for malformed events (RFC 9110 §15.5.16: 415);
    ///   the errors of ``decompress(_:limit:)``.
    public static func undoContentEncoding(_ contentEncoding: String?, of body: [UInt8], limit: Int) throws(WireError)
        -> [UInt8]
    {
        let codings = (contentEncoding ?? "").split(separator: ",").map {
            $0.trimmingCharacters(in: .whitespaces).lowercased()
        }
        var body = body
        for coding in codings.reversed() {
            switch coding {
            case "gzip", "x-gzip": body = try decompress(body, limit: limit)
            case "identity", "": continue
            default:
                throw WireError(
                    .unsupportedMediaType,
                    "Content-Encoding \"\(coding)\" is not supported; send the body gzip-compressed or uncompressed.")
            }
        }
        return body
    }

    /// One idle compressor per level. A compressor is a few hundred KiB of tables; allocating and
    /// freeing one per batch churned the agent's one malloc arena (peak anon 17.0 MiB with 100,000
    /// events waiting, 19.8–20.0 with 1,000,000, two runs each; with reuse 17.4–17.6 with 1,000,000).
    /// A caller takes the idle one or allocates its own, and puts it back if the slot is empty
    /// (libdeflate: one compressor, one thread at a time).
    private static let idleCompressors = Mutex<[Int32: Compressor]>([:])

    private static func withCompressor<Result>(
        level: Int32, _ body: (OpaquePointer) throws(WireError) -> Result
    ) throws(WireError) -> Result {
        let idle = idleCompressors.withLock { $0.removeValue(forKey: level) }
        guard let compressor = idle?.pointer ?? libdeflate_alloc_compressor(level) else {
            throw WireError(.compression, "libdeflate could not allocate a compressor (out of memory).")
        }
        defer {
            let kept = idleCompressors.withLock { slots in
                guard slots[level] == nil else { return false }
                slots[level] = Compressor(pointer: compressor)
                return true
            }
            if !kept { libdeflate_free_compressor(compressor) }
        }
        return try body(compressor)
    }

    /// Decompresses a gzip stream, refusing output larger than `limit` bytes.
    ///
    /// A gzip body of several members (RFC 1952 §2.2) inflates to their concatenation, as gunzip's
    /// output; any other bytes after the compressed data are refused. So is a zlib stream (RFC 1950,
    /// the `deflate` content coding): zlib's automatic header detection took one for gzip.
    ///
    /// Inflates straight into the output array, never zero-filled. A gzip member whose trailer states
    /// a size (ISIZE) that DEFLATE can reach from this input, within `limit`, is inflated by libdeflate
    /// into exactly that many bytes, and accepted only if it fills them and its CRC-32 and size check
    /// out. Anything else goes to zlib: its first capacity is that stated size (so a body whose
    /// trailer is right but that libdeflate refused is diagnosed without growing a buffer), or five
    /// times the input when the input is too short to state one; the buffer doubles as needed, never past
    /// `limit + 1` bytes. The trailer is only a hint: the inflated bytes decide.
    public static func decompress(_ input: [UInt8], limit: Int = 64 << 20) throws(WireError) -> [UInt8] {
        // DEFLATE expands at most about 1032:1, so a larger stated size is a lie (or a truncated body's
        // random tail) that must not reserve `limit` bytes.
        let stated = statedSize(ofGzip: input).flatMap { $0 <= input.count * 1_032 ? $0 : nil }
        if let stated, stated <= limit, let output = inflateWhole(input, size: stated) { return output }
        return try inflateStreaming(input, sizeHint: stated.map { $0 + 1 }, limit: limit)
    }

    /// `input`, a single gzip member, inflated by libdeflate into exactly `size` bytes; nil if it is
    /// not exactly that long, its CRC-32 or size does not match, it is damaged, or bytes follow it
    /// (a second member, whose trailer the stated size came from, goes to zlib).
    private static func inflateWhole(_ input: [UInt8], size: Int) -> [UInt8]? {
        guard let decompressor = libdeflate_alloc_decompressor() else { return nil }
        defer { libdeflate_free_decompressor(decompressor) }
        var result = LIBDEFLATE_BAD_DATA
        var consumed = 0
        let output = [UInt8](unsafeUninitializedCapacity: size) { outBuf, written in
            result = input.withUnsafeBytes { inBuf in
                // A nil actual size: success only when the member fills the buffer exactly.
                libdeflate_gzip_decompress_ex(
                    decompressor, inBuf.baseAddress, inBuf.count, outBuf.baseAddress, outBuf.count, &consumed, nil)
            }
            written = result == LIBDEFLATE_SUCCESS ? size : 0
        }
        return result == LIBDEFLATE_SUCCESS && consumed == input.count ? output : nil
    }

    /// zlib's streaming inflate, starting at `sizeHint` bytes (five times the input without one).
    private static func inflateStreaming(_ input: [UInt8], sizeHint: Int?, limit: Int) throws(WireError) -> [UInt8] {
        var stream = z_stream()
        guard tributary_inflate_init_gzip(&stream) == Z_OK else {
            throw WireError(.compression, "zlib could not start an inflate stream.")
        }
        defer { inflateEnd(&stream) }
        let hint = sizeHint ?? max(input.count * 5, 1024)
        let ceiling = limit < Int.max ? limit + 1 : limit  // one byte over the limit tells "too large"
        var capacity = min(ceiling, max(hint, 64))
        var output: [UInt8] = []
        var outcome: Result<Bool, WireError> = .success(false)
        try input.withUnsafeBufferPointer { inBuf throws(WireError) in
            stream.next_in = UnsafeMutablePointer(mutating: inBuf.baseAddress)
            stream.avail_in = uInt(inBuf.count)
            while true {
                let previous = output
                output = [UInt8](unsafeUninitializedCapacity: capacity) { outBuf, produced in
                    produced = previous.withUnsafeBufferPointer { outBuf.initialize(fromContentsOf: $0) }
                    outcome = inflate(&stream, into: outBuf, produced: &produced)
                }
                let finished = try outcome.get()
                guard output.count <= limit else {
                    throw WireError(.tooLarge, "The decompressed body exceeds \(limit) bytes.")
                }
                if finished { return }
                capacity = capacity > ceiling / 2 ? ceiling : capacity * 2
            }
        }
        return output
    }

    /// Inflates from `stream` into `buffer` after its first `produced` bytes until the stream ends
    /// (true) or the buffer is full (false).
    private static func inflate(
        _ stream: inout z_stream, into buffer: UnsafeMutableBufferPointer<UInt8>, produced: inout Int
    ) -> Result<Bool, WireError> {
        while produced < buffer.count {
            stream.next_out = buffer.baseAddress! + produced
            stream.avail_out = uInt(buffer.count - produced)
            let rc = CZlib.inflate(&stream, Z_NO_FLUSH)
            let before = produced
            produced = buffer.count - Int(stream.avail_out)
            switch rc {
            case Z_STREAM_END where stream.avail_in == 0:
                return .success(true)
            case Z_STREAM_END:
                // RFC 1952 §2.2: a gzip file is a series of members; as gunzip does, inflate them all.
                guard stream.avail_in >= 2, stream.next_in[0] == 0x1f, stream.next_in[1] == 0x8b else {
                    return .failure(WireError(.malformedBody, "The body has \(stream.avail_in) bytes after its compressed data."))
                }
                guard inflateReset(&stream) == Z_OK else {
                    return .failure(WireError(.compression, "zlib could not start the body's next gzip member."))
                }
            case Z_OK where produced == before && stream.avail_in == 0, Z_BUF_ERROR where stream.avail_in == 0:
                return .failure(WireError(.malformedBody, "The gzip body is truncated."))
            case Z_OK: continue
            default:
                // zlib's own diagnosis ("incorrect data check", "invalid block type", …), when it gives one.
                let why = stream.msg.map { String(cString: $0) } ?? "zlib error \(rc)"
                return .failure(WireError(.malformedBody, "The body is not valid gzip: \(why)."))
            }
        }
        return .success(false)
    }

    /// The uncompressed size a single gzip member states in its trailer (ISIZE, RFC 1952: the size
    /// modulo 2^32), or nil when `bytes` does not start like a gzip member.
    static func statedSize(ofGzip bytes: [UInt8]) -> Int? {
        guard bytes.count >= 18, bytes[0] == 0x1f, bytes[1] == 0x8b else { return nil }
        let end = bytes.count
        return Int(bytes[end - 4]) | Int(bytes[end - 3]) << 8 | Int(bytes[end - 2]) << 16 | Int(bytes[end - 1]) << 24
    }
}
