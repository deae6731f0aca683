import CZlib

/// gzip (RFC 1952) through the system zlib.
public enum Gzip {
    /// zlib's default level (`Z_DEFAULT_COMPRESSION`).
    public static let defaultLevel: Int32 = 6

    /// Compresses `input` into a gzip member at `level` (1 fastest … 9 smallest; 0 stores).
    public static func compress(_ input: [UInt8], level: Int32 = defaultLevel) throws(WireError) -> [UInt8] {
        var stream = z_stream()
        guard tributary_deflate_init_gzip(&stream, level) == Z_OK else {
            throw WireError(.compression, "zlib could not start a gzip stream at level \(level).")
        }
        defer { deflateEnd(&stream) }
        let bound = Int(deflateBound(&stream, uLong(input.count))) + 32
        var rc: Int32 = Z_OK
        // deflate only reads next_in (zlib's z_const): no copy of the input is needed.
        let output = [UInt8](unsafeUninitializedCapacity: bound) { outBuf, written in
            input.withUnsafeBufferPointer { inBuf in
                stream.next_in = UnsafeMutablePointer(mutating: inBuf.baseAddress)
                stream.avail_in = uInt(inBuf.count)
                stream.next_out = outBuf.baseAddress
                stream.avail_out = uInt(outBuf.count)
                rc = deflate(&stream, Z_FINISH)
            }
            written = rc == Z_STREAM_END ? Int(stream.total_out) : 0
        }
        guard rc == Z_STREAM_END else { throw WireError(.compression, "zlib deflate failed (\(rc)).") }
        return output
    }

    /// Decompresses a gzip (or zlib) stream, refusing output larger than `limit` bytes.
    ///
    /// Inflates straight into the output array. Its first capacity is the size a gzip member's trailer
    /// states (ISIZE), so a body sent whole is inflated without growing or zero-filling a buffer;
    /// otherwise (a zlib stream, a trailer that understates) it starts at five times the input and
    /// doubles, never past `limit + 1` bytes. The trailer is only a hint: the inflated bytes decide.
    public static func decompress(_ input: [UInt8], limit: Int = 64 << 20) throws(WireError) -> [UInt8] {
        var stream = z_stream()
        guard tributary_inflate_init_auto(&stream) == Z_OK else {
            throw WireError(.compression, "zlib could not start an inflate stream.")
        }
        defer { inflateEnd(&stream) }
        let hint = statedSize(ofGzip: input).map { $0 + 1 } ?? max(input.count * 5, 1024)
        var capacity = min(limit + 1, max(hint, 64))
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
                capacity = min(limit + 1, capacity * 2)
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
            case Z_STREAM_END: return .success(true)
            case Z_OK where produced == before && stream.avail_in == 0, Z_BUF_ERROR where stream.avail_in == 0:
                return .failure(WireError(.malformedBody, "The gzip body is truncated."))
            case Z_OK: continue
            default: return .failure(WireError(.malformedBody, "The body is not valid gzip (zlib \(rc))."))
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
