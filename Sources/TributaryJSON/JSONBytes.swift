/// The bytes of a JSON string's text that need a look, found eight at a time: what the producers'
/// writer escapes (``JSONString``) and what the collector's scanner must check.
package enum JSONBytes {
    /// Whether `byte` is JSON whitespace (RFC 8259 §2: space, horizontal tab, line feed, carriage return).
    @inlinable
    package static func isWhitespace(_ byte: UInt8) -> Bool {
        byte == 0x20 || byte == 0x09 || byte == 0x0A || byte == 0x0D
    }

    /// The high bit of each of the eight bytes of `word` (little-endian: the first byte lowest) that is
    /// below 0x20, a quote or a backslash; with `nonASCII`, also every byte from 0x80 up; with
    /// `lineSeparators`, also 0xE2 (the first byte of U+2028 and U+2029). 0 when none is. Bytes after
    /// a flagged one may be flagged falsely (a borrow runs upwards), never the first: its position,
    /// `trailingZeroBitCount / 8`, is exact.
    @inlinable @inline(__always)
    package static func attention(_ word: UInt64, nonASCII: Bool = false, lineSeparators: Bool = false) -> UInt64 {
        let ones: UInt64 = 0x0101_0101_0101_0101
        let highs: UInt64 = 0x8080_8080_8080_8080
        func hasZero(_ x: UInt64) -> UInt64 { (x &- ones) & ~x & highs }
        // Below 0x20: (b - 0x20) borrows into the high bit; `& ~word` leaves out bytes from 0x80 up.
        var attention = (word &- ones &* 0x20) & ~word & highs
        attention |= hasZero(word ^ (ones &* 0x22)) | hasZero(word ^ (ones &* 0x5C))
        if nonASCII { attention |= word & highs }
        if lineSeparators { attention |= hasZero(word ^ (ones &* 0xE2)) }
        return attention
    }
}
