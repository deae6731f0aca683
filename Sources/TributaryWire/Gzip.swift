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
    /// Inflates straight into the output array, grown as needed (never past `limit + 1` bytes), rather
    /// than through a chunk buffer copied out after each call.
    public static func decompress(_ input: [UInt8], limit: Int = 64 << 20) throws(WireError) -> [UInt8] {
        var stream = z_stream()
        guard tributary_inflate_init_auto(&stream) == Z_OK else {
            throw WireError(.compression, "zlib could not start an inflate stream.")
        }
        defer { inflateEnd(&stream) }
        var output = [UInt8](repeating: 0, count: min(limit + 1, max(input.count * 5, 1024)))
        var produced = 0
        var rc: Int32 = Z_OK
        try input.withUnsafeBufferPointer { inBuf throws(WireError) in
            stream.next_in = UnsafeMutablePointer(mutating: inBuf.baseAddress)
            stream.avail_in = uInt(inBuf.count)
            repeat {
                if produced == output.count {
                    output.append(contentsOf: repeatElement(0, count: min(limit + 1 - output.count, output.count)))
                }
                let before = produced
                rc = output.withUnsafeMutableBufferPointer { outBuf in
                    stream.next_out = outBuf.baseAddress! + produced
                    stream.avail_out = uInt(outBuf.count - produced)
                    let rc = inflate(&stream, Z_NO_FLUSH)
                    produced = outBuf.count - Int(stream.avail_out)
                    return rc
                }
                guard rc == Z_OK || rc == Z_STREAM_END else {
                    throw WireError(.malformedBody, "The body is not valid gzip (zlib \(rc)).")
                }
                guard produced <= limit else {
                    throw WireError(.tooLarge, "The decompressed body exceeds \(limit) bytes.")
                }
                if rc == Z_OK && produced == before && stream.avail_in == 0 {
                    throw WireError(.malformedBody, "The gzip body is truncated.")
                }
            } while rc != Z_STREAM_END
        }
        output.removeLast(output.count - produced)
        return output
    }
}
