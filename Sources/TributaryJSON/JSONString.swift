/// JSON string literals, written the one way every Tributary component writes them: the producer
/// library's event bodies, the drain's `_tributary` member, the sorted JSON of enriched extension
/// events, and the hybrid bridge's messages.
///
/// RFC 8259 §7: `"` and `\` are escaped, and so is every control character below U+0020, as `\b`,
/// `\t`, `\n`, `\f`, `\r` or `\u00XX`. Everything else is copied as it is (UTF-8, `/` unescaped).
/// With `escapingLineSeparators`, U+2028 and U+2029 become `\u2028` and `\u2029` too: valid in
/// JSON, but line terminators in JavaScript before ES2019, so text meant for a script is safe in
/// every engine.
public enum JSONString {
    /// Appends `utf8` (valid UTF-8) to `out` as a JSON string literal, quotes included.
    ///
    /// Runs of bytes that need no escape are copied whole, so text without special characters costs
    /// one scan, eight bytes at a time, and one copy.
    public static func append(
        _ utf8: UnsafeRawBufferPointer, to out: inout [UInt8], escapingLineSeparators: Bool = false
    ) {
        out.append(quote)
        var runStart = 0
        var i = 0
        while i < utf8.count {
            // Eight bytes at a time while none needs a look; in the word that has one, straight to it.
            if utf8.count - i >= 8 {
                let word = utf8.loadUnaligned(fromByteOffset: i, as: UInt64.self)
                let attention = JSONBytes.attention(word, lineSeparators: escapingLineSeparators)
                guard attention != 0 else {
                    i += 8
                    continue
                }
                i += attention.trailingZeroBitCount >> 3
            }
            let byte = utf8[i]
            let escape: Escape
            if byte < 0x20 || byte == quote || byte == backslash {
                escape = .byte(byte)
            } else if escapingLineSeparators, byte == 0xE2, i + 2 < utf8.count, utf8[i + 1] == 0x80,
                utf8[i + 2] == 0xA8 || utf8[i + 2] == 0xA9
            {
                escape = .lineSeparator(utf8[i + 2])
            } else {
                i += 1
                continue
            }
            out.append(contentsOf: UnsafeRawBufferPointer(rebasing: utf8[runStart..<i]))
            switch escape {
            case .byte(let byte):
                append(escaping: byte, to: &out)
                i += 1
            case .lineSeparator(let last):
                out.append(contentsOf: last == 0xA8 ? #"\u2028"#.utf8 : #"\u2029"#.utf8)
                i += 3
            }
            runStart = i
        }
        out.append(contentsOf: UnsafeRawBufferPointer(rebasing: utf8[runStart...]))
        out.append(quote)
    }

    /// Appends `string` to `out` as a JSON string literal, quotes included.
    public static func append(_ string: String, to out: inout [UInt8], escapingLineSeparators: Bool = false) {
        var string = string
        string.withUTF8 { append(UnsafeRawBufferPointer($0), to: &out, escapingLineSeparators: escapingLineSeparators) }
    }

    /// `string` as a JSON string literal, quotes included.
    public static func quoted(_ string: String, escapingLineSeparators: Bool = false) -> String {
        var out: [UInt8] = []
        out.reserveCapacity(string.utf8.count + 2)
        append(string, to: &out, escapingLineSeparators: escapingLineSeparators)
        return String(decoding: out, as: UTF8.self)
    }

    private enum Escape {
        case byte(UInt8)
        /// The last byte of U+2028 (`E2 80 A8`) or U+2029 (`E2 80 A9`).
        case lineSeparator(UInt8)
    }

    private static let quote = UInt8(ascii: "\"")
    private static let backslash = UInt8(ascii: "\\")
    private static let hexDigits: [UInt8] = Array("0123456789abcdef".utf8)

    private static func append(escaping byte: UInt8, to out: inout [UInt8]) {
        out.append(backslash)
        switch byte {
        case quote, backslash: out.append(byte)
        case 0x08: out.append(UInt8(ascii: "b"))
        case 0x09: out.append(UInt8(ascii: "t"))
        case 0x0A: out.append(UInt8(ascii: "n"))
        case 0x0C: out.append(UInt8(ascii: "f"))
        case 0x0D: out.append(UInt8(ascii: "r"))
        default: out.append(contentsOf: [UInt8(ascii: "u"), 0x30, 0x30, hexDigits[Int(byte >> 4)], hexDigits[Int(byte & 0xF)]])
        }
    }
}
