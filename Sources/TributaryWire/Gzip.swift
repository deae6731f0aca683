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
    public static func decompress(_ input: [UInt8], limit: Int = 64 << 20) throws(WireError) -> [UInt8] {
        var stream = z_stream()
        guard tributary_inflate_init_auto(&stream) == Z_OK else {
            throw WireError(.compression, "zlib could not start an inflate stream.")
        }
        defer { inflateEnd(&stream) }
        var output: [UInt8] = []
        output.reserveCapacity(min(limit, max(input.count * 4, 1024)))
        var chunk = [UInt8](repeating: 0, count: 64 << 10)
        var input = input
        var rc: Int32 = Z_OK
        try input.withUnsafeMutableBufferPointer { inBuf throws(WireError) in
            stream.next_in = inBuf.baseAddress
            stream.avail_in = uInt(inBuf.count)
            repeat {
                let produced: Int = chunk.withUnsafeMutableBufferPointer { outBuf in
                    stream.next_out = outBuf.baseAddress
                    stream.avail_out = uInt(outBuf.count)
                    rc = inflate(&stream, Z_NO_FLUSH)
                    return outBuf.count - Int(stream.avail_out)
                }
                guard rc == Z_OK || rc == Z_STREAM_END else {
                    throw WireError(.malformedBody, "The body is not valid gzip (zlib \(rc)).")
                }
                guard output.count + produced <= limit else {
                    throw WireError(.tooLarge, "The decompressed body exceeds \(limit) bytes.")
                }
                output.append(contentsOf: chunk[0..<produced])
                if rc == Z_OK && produced == 0 && stream.avail_in == 0 {
                    throw WireError(.malformedBody, "The gzip body is truncated.")
                }
            } while rc != Z_STREAM_END
        }
        return output
    }
}
