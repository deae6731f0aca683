import Foundation

/// Why a JSON text was refused, and where (a byte offset). Sent to clients in a 400's message: it
/// names the kind of fault and its offset, never the text around it.
package struct JSONSyntaxError: Error, Equatable, CustomStringConvertible {
    /// The byte offset of the problem in the scanned buffer.
    package var offset: Int
    /// What is wrong there.
    package var reason: String

    package var description: String { "\(reason) at byte \(offset)" }
}

/// The kind of a JSON value.
package enum JSONKind: UInt8, Sendable {
    /// The key was not present.
    case absent
    case string, number, object, array, bool, null
}

/// One value the scanner kept: its kind and where its text is.
package struct JSONToken: Sendable, Equatable {
    /// `.absent` when the key was not present.
    package var kind = JSONKind.absent
    /// Strings: the bytes between the quotes. Other values: the value's whole text.
    package var range: Range<Int> = 0..<0
    /// A string whose bytes are its value (no escape, no leading byte-order mark), or a number that is
    /// a plain non-negative integer of at most 18 digits. Other values are decoded the slow, exact way.
    package var isPlain = false
}

/// What the scan of one element of a batch found: where its text is and the fields the collector
/// indexes, taken from the event object's top level (and `_tributary`'s). An indexed key given twice
/// is noted in ``repeatedKey`` (the event is then refused: readers disagree on which value counts,
/// `JSONSerialization` taking the last and others the first); its last value is kept.
package struct ScannedEvent: Sendable {
    /// The element's text (NDJSON: the whole line), as stored.
    package var text: Range<Int>
    /// Whether the element is a JSON object; the fields below are absent when it is not.
    package var isObject = false
    package var eventID = JSONToken()
    package var type = JSONToken()
    package var name = JSONToken()
    package var time = JSONToken()
    package var properties = JSONToken()
    /// `_tributary`.
    package var tributary = JSONToken()
    /// `_hybrid_h5`: the mark of an event a hybrid page sent, at the top level as the Sensors SDKs put it.
    package var hybridH5 = JSONToken()
    /// `_tributary.seq`, `_tributary.producer`, `_tributary.producer_seq` (of the last `_tributary`).
    package var seq = JSONToken()
    package var producer = JSONToken()
    package var producerSeq = JSONToken()
    /// The first indexed key the object gives twice (`event_id`, `_tributary.seq`, …), if any.
    package var repeatedKey: String?
    /// The indexed keys met so far, a bit each (``JSONScanner`` `Field` raw values).
    fileprivate var fieldsMet: UInt16 = 0

    package init(text: Range<Int>) { self.text = text }
}

/// A strict, allocation-free JSON scanner that accepts what Foundation's `JSONSerialization`
/// (swift-corelibs-foundation's parser) accepts from UTF-8 text, except a trailing comma, and builds
/// nothing but the few tokens the collector indexes.
///
/// Written because `JSONSerialization` building a dictionary of bridged values for every event was
/// the largest part of the collector's CPU per event. What it checks, as `JSONSerialization` does:
/// the whole grammar (RFC 8259) plus one leniency of that parser (one UTF-8 byte-order mark before
/// the text; its other one, a trailing comma before `]` or `}`, is refused, so that every stored
/// event is JSON to any reader), strict UTF-8 in strings (no overlong
/// forms, surrogates or code points above U+10FFFF), no unescaped control character, only the JSON
/// escapes, `\u` surrogates only in high-low pairs, at most 512 nested arrays and objects, and
/// numbers that are finite as a `Double`. Text `JSONSerialization` reads as UTF-16 or UTF-32 (from a
/// byte-order mark or NUL bytes) is refused: it is not UTF-8, and was never stored correctly.
package struct JSONScanner {
    /// The nesting limit of `JSONSerialization` (arrays and objects together).
    package static let maximumDepth = 512

    private let bytes: UnsafeBufferPointer<UInt8>
    private var index: Int
    private let end: Int
    private var depth = 0

    private init(_ bytes: UnsafeBufferPointer<UInt8>, range: Range<Int>) {
        self.bytes = bytes
        self.index = range.lowerBound
        self.end = range.upperBound
    }

    // MARK: Documents

    /// Why ``scanObjects(_:maxElements:)`` refused an array.
    package enum ArrayRefusal: Error, Equatable {
        /// The text is not valid JSON, or not an array.
        case syntax(JSONSyntaxError)
        /// Element `element` (from 0) is valid JSON but not an object.
        case notAnObject(element: Int)
        /// The array has more than `limit` elements.
        case tooManyElements(limit: Int)
    }

    /// Scans `bytes`, which must be one JSON array of objects (a Sensors `data_list`), and returns its
    /// elements.
    ///
    /// A non-object element and the element after the first `maxElements` are refused as soon as they
    /// are met: each element's scan takes a few hundred bytes, so a small request whose `data_list`
    /// inflates to millions of `0,` would otherwise cost gigabytes before anything was checked.
    ///
    /// - Throws: ``ArrayRefusal``.
    package static func scanObjects(
        _ bytes: UnsafeBufferPointer<UInt8>,
        maxElements: Int
    ) throws(ArrayRefusal) -> [ScannedEvent] {
        var scanner = JSONScanner(bytes, range: 0..<bytes.count)
        scanner.skipByteOrderMark()
        scanner.skipWhitespace()
        guard scanner.peek() == UInt8(ascii: "[") else { throw .syntax(scanner.error("the text is not an array")) }
        var elements: [ScannedEvent] = []
        var refusal: ArrayRefusal?
        do throws(JSONSyntaxError) {
            try scanner.enterContainer()
            scanner.index += 1
            scanner.skipWhitespace()
            if scanner.peek() == UInt8(ascii: "]") {
                scanner.index += 1
            } else {
                while refusal == nil {
                    guard elements.count < maxElements else {
                        refusal = .tooManyElements(limit: maxElements)
                        break
                    }
                    let element = try scanner.element()
                    guard element.isObject else {
                        refusal = .notAnObject(element: elements.count)
                        break
                    }
                    elements.append(element)
                    if try scanner.separator(closing: UInt8(ascii: "]")) { break }
                }
            }
            if refusal == nil {
                scanner.depth -= 1
                try scanner.expectEnd()
            }
        } catch {
            throw .syntax(error)
        }
        if let refusal { throw refusal }
        return elements
    }

    /// Scans `range` of `bytes` as one whole JSON document (an NDJSON line); its text is the range
    /// after a byte-order mark, if the line starts with one (a BOM inside the array `/events` joins
    /// the stored texts into would not be JSON).
    ///
    /// - Throws: ``JSONSyntaxError`` when it is not valid JSON (a valid non-object is returned with
    ///   `isObject` false).
    package static func scanDocument(
        _ bytes: UnsafeBufferPointer<UInt8>,
        range: Range<Int>
    ) throws(JSONSyntaxError) -> ScannedEvent {
        var scanner = JSONScanner(bytes, range: range)
        scanner.skipByteOrderMark()
        let start = scanner.index
        scanner.skipWhitespace()
        var event = try scanner.element()
        event.text = start..<range.upperBound
        try scanner.expectEnd()
        return event
    }

    /// `JSONSerialization` skips one UTF-8 byte-order mark before the text.
    private mutating func skipByteOrderMark() {
        if hasByteOrderMark(at: index) { index += 3 }
    }

    private mutating func expectEnd() throws(JSONSyntaxError) {
        skipWhitespace()
        guard index == end else { throw error("text after the end of the value") }
    }

    /// One element: an object (whose indexed fields are kept) or any other value.
    private mutating func element() throws(JSONSyntaxError) -> ScannedEvent {
        let start = index
        var event = ScannedEvent(text: start..<start)
        if peek() == UInt8(ascii: "{") {
            try object(.event, into: &event)
            event.isObject = true
        } else {
            _ = try value()
        }
        event.text = start..<index
        return event
    }

    // MARK: Values

    /// Which keys of an object are kept.
    private enum Level {
        case plain, event, tributary
    }

    /// Scans the value at `index` (no whitespace before it).
    private mutating func value() throws(JSONSyntaxError) -> JSONToken {
        guard index < end else { throw error("unexpected end of the text") }
        let start = index
        switch bytes[index] {
        case UInt8(ascii: "\""):
            let (range, plain) = try string()
            return JSONToken(kind: .string, range: range, isPlain: plain)
        case UInt8(ascii: "{"):
            var ignored = ScannedEvent(text: 0..<0)
            try object(.plain, into: &ignored)
            return JSONToken(kind: .object, range: start..<index)
        case UInt8(ascii: "["):
            try array()
            return JSONToken(kind: .array, range: start..<index)
        case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"):
            let plain = try number()
            return JSONToken(kind: .number, range: start..<index, isPlain: plain)
        case UInt8(ascii: "t"):
            try literal("true")
            return JSONToken(kind: .bool, range: start..<index)
        case UInt8(ascii: "f"):
            try literal("false")
            return JSONToken(kind: .bool, range: start..<index)
        case UInt8(ascii: "n"):
            try literal("null")
            return JSONToken(kind: .null, range: start..<index)
        default:
            throw error("not the start of a value")
        }
    }

    private mutating func enterContainer() throws(JSONSyntaxError) {
        guard depth < Self.maximumDepth else { throw error("more than \(Self.maximumDepth) nested containers") }
        depth += 1
    }

    /// After a value in a container: `,` or the closing byte. Whether the container ended. A `,` right
    /// before the closing byte is refused, though `JSONSerialization` allows it: the collector stores
    /// each event's text as it came, and `GET /events` must stay JSON for strict readers.
    private mutating func separator(closing: UInt8) throws(JSONSyntaxError) -> Bool {
        skipWhitespace()
        guard index < end else { throw error("unexpected end of the text") }
        let byte = bytes[index]
        index += 1
        if byte == closing { return true }
        guard byte == UInt8(ascii: ",") else {
            index -= 1
            throw error("expected ',' or the end of the container")
        }
        skipWhitespace()
        if peek() == closing { throw error("a ',' before the end of the container") }
        return false
    }

    private mutating func array() throws(JSONSyntaxError) {
        try enterContainer()
        index += 1
        skipWhitespace()
        if peek() == UInt8(ascii: "]") {
            index += 1
        } else {
            repeat {
                _ = try value()
            } while try !separator(closing: UInt8(ascii: "]"))
        }
        depth -= 1
    }

    /// Scans an object; at `.event` and `.tributary` level, keeps the values of the indexed keys.
    private mutating func object(_ level: Level, into event: inout ScannedEvent) throws(JSONSyntaxError) {
        try enterContainer()
        index += 1
        skipWhitespace()
        if peek() == UInt8(ascii: "}") {
            index += 1
            depth -= 1
            return
        }
        repeat {
            guard peek() == UInt8(ascii: "\"") else { throw error("expected a key") }
            let (key, plain) = try string()
            skipWhitespace()
            guard peek() == UInt8(ascii: ":") else { throw error("expected ':'") }
            index += 1
            skipWhitespace()
            let field = level == .plain ? .other : Self.field(key, plain: plain, level: level, in: bytes)
            if field != .other {
                let bit: UInt16 = 1 << field.rawValue
                if event.fieldsMet & bit != 0, event.repeatedKey == nil {
                    event.repeatedKey = (level == .tributary ? "_tributary." : "") + field.name
                }
                event.fieldsMet |= bit
            }
            switch field {
            case .eventID: event.eventID = try value()
            case .type: event.type = try value()
            case .name: event.name = try value()
            case .time: event.time = try value()
            case .properties: event.properties = try value()
            case .hybridH5: event.hybridH5 = try value()
            case .seq: event.seq = try value()
            case .producer: event.producer = try value()
            case .producerSeq: event.producerSeq = try value()
            case .tributary:
                // A repeated `_tributary` replaces the earlier one whole.
                event.seq = JSONToken()
                event.producer = JSONToken()
                event.producerSeq = JSONToken()
                if peek() == UInt8(ascii: "{") {
                    let start = index
                    try object(.tributary, into: &event)
                    event.tributary = JSONToken(kind: .object, range: start..<index)
                } else {
                    event.tributary = try value()
                }
            case .other:
                _ = try value()
            }
        } while try !separator(closing: UInt8(ascii: "}"))
        depth -= 1
    }

    /// Scans a string at `index` (its opening quote): the range of its content and whether it is plain.
    private mutating func string() throws(JSONSyntaxError) -> (Range<Int>, plain: Bool) {
        index += 1
        let start = index
        var plain = !hasByteOrderMark(at: index)
        while true {
            // Eight ASCII bytes that need no attention at a time (no quote, backslash, control or
            // non-ASCII byte): most of an event's text. In the word that has one, straight to it.
            while end - index >= 8 {
                let word = UnsafeRawPointer(bytes.baseAddress! + index).loadUnaligned(as: UInt64.self)
                let attention = JSONBytes.attention(word, nonASCII: true)
                guard attention == 0 else {
                    index += attention.trailingZeroBitCount >> 3
                    break
                }
                index += 8
            }
            guard index < end else { throw error("unterminated string") }
            let byte = bytes[index]
            switch byte {
            case UInt8(ascii: "\""):
                index += 1
                return (start..<index - 1, plain)
            case UInt8(ascii: "\\"):
                plain = false
                try escape()
            case 0..<0x20:
                throw error("unescaped control character in a string")
            case 0x20..<0x80:
                index += 1
            default:
                try utf8Sequence()
            }
        }
    }

    /// An escape at `index` (its backslash), as `JSONSerialization` reads them.
    private mutating func escape() throws(JSONSyntaxError) {
        guard index + 1 < end else { throw error("unterminated escape") }
        switch bytes[index + 1] {
        case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"), UInt8(ascii: "b"), UInt8(ascii: "f"),
            UInt8(ascii: "n"), UInt8(ascii: "r"), UInt8(ascii: "t"):
            index += 2
        case UInt8(ascii: "u"):
            index += 2
            let unit = try hexQuad()
            switch unit & 0xFC00 {
            case 0xD800:
                guard index + 1 < end, bytes[index] == UInt8(ascii: "\\"), bytes[index + 1] == UInt8(ascii: "u") else {
                    throw error("a high surrogate escape not followed by a low one")
                }
                index += 2
                guard try hexQuad() & 0xFC00 == 0xDC00 else {
                    throw error("a high surrogate escape not followed by a low one")
                }
            case 0xDC00:
                throw error("a low surrogate escape without a high one")
            default:
                break
            }
        default:
            throw error("invalid escape")
        }
    }

    private mutating func hexQuad() throws(JSONSyntaxError) -> UInt16 {
        guard end - index >= 4 else { throw error("unterminated \\u escape") }
        var value: UInt16 = 0
        for _ in 0..<4 {
            let byte = bytes[index]
            let digit: UInt8
            switch byte {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): digit = byte - UInt8(ascii: "0")
            case UInt8(ascii: "a")...UInt8(ascii: "f"): digit = byte - UInt8(ascii: "a") + 10
            case UInt8(ascii: "A")...UInt8(ascii: "F"): digit = byte - UInt8(ascii: "A") + 10
            default: throw error("invalid hex digit in a \\u escape")
            }
            value = value << 4 | UInt16(digit)
            index += 1
        }
        return value
    }

    /// One multi-byte UTF-8 sequence at `index`, strictly (Unicode 15, table 3-7).
    private mutating func utf8Sequence() throws(JSONSyntaxError) {
        let lead = bytes[index]
        let count: Int
        var secondRange: ClosedRange<UInt8> = 0x80...0xBF
        switch lead {
        case 0xC2...0xDF: count = 2
        case 0xE0:
            count = 3
            secondRange = 0xA0...0xBF
        case 0xE1...0xEC, 0xEE...0xEF: count = 3
        case 0xED:
            count = 3
            secondRange = 0x80...0x9F
        case 0xF0:
            count = 4
            secondRange = 0x90...0xBF
        case 0xF1...0xF3: count = 4
        case 0xF4:
            count = 4
            secondRange = 0x80...0x8F
        default: throw error("invalid UTF-8")
        }
        guard end - index >= count, secondRange.contains(bytes[index + 1]) else { throw error("invalid UTF-8") }
        for offset in 2..<count where bytes[index + offset] & 0xC0 != 0x80 {
            throw error("invalid UTF-8")
        }
        index += count
    }

    /// A number at `index`: RFC 8259's grammar, finite as a `Double`. Whether it is a plain integer.
    private mutating func number() throws(JSONSyntaxError) -> Bool {
        let start = index
        var plain = true
        if bytes[index] == UInt8(ascii: "-") {
            plain = false
            index += 1
        }
        let integerStart = index
        guard index < end, Self.isDigit(bytes[index]) else { throw error("a number without digits") }
        if bytes[index] == UInt8(ascii: "0") {
            index += 1
        } else {
            skipDigits()
        }
        let integerDigits = index - integerStart
        if index < end, bytes[index] == UInt8(ascii: ".") {
            plain = false
            index += 1
            guard index < end, Self.isDigit(bytes[index]) else { throw error("a fraction without digits") }
            skipDigits()
        }
        var hasExponent = false
        if index < end, bytes[index] | 0x20 == UInt8(ascii: "e") {
            plain = false
            hasExponent = true
            index += 1
            if index < end, bytes[index] == UInt8(ascii: "+") || bytes[index] == UInt8(ascii: "-") { index += 1 }
            guard index < end, Self.isDigit(bytes[index]) else { throw error("an exponent without digits") }
            skipDigits()
        }
        if integerDigits > 18 { plain = false }
        // Without an exponent, fewer than 309 integer digits is below Double.greatestFiniteMagnitude.
        if hasExponent || integerDigits > 308 {
            let text = String(decoding: UnsafeBufferPointer(rebasing: bytes[start..<index]), as: UTF8.self)
            guard let value = Double(text), value.isFinite else {
                throw error("a number that is not finite as a Double")
            }
        }
        return plain
    }

    @inline(__always)
    private static func isDigit(_ byte: UInt8) -> Bool { byte &- UInt8(ascii: "0") < 10 }

    private mutating func skipDigits() {
        while index < end, Self.isDigit(bytes[index]) { index += 1 }
    }

    private mutating func literal(_ word: StaticString) throws(JSONSyntaxError) {
        let count = word.utf8CodeUnitCount
        guard end - index >= count, memcmp(bytes.baseAddress! + index, word.utf8Start, count) == 0 else {
            throw error("not the start of a value")
        }
        index += count
    }

    // MARK: Keys

    /// The keys kept: at the top level of an event, and in its `_tributary` object.
    fileprivate enum Field: UInt16 {
        case eventID, type, name, time, properties, tributary, seq, producer, producerSeq, hybridH5, other

        /// The key's name in the event (within `_tributary` for the last three).
        var name: String {
            switch self {
            case .eventID: "event_id"
            case .type: "type"
            case .name: "event"
            case .time: "time"
            case .properties: "properties"
            case .tributary: "_tributary"
            case .seq: "seq"
            case .producer: "producer"
            case .producerSeq: "producer_seq"
            case .hybridH5: "_hybrid_h5"
            case .other: ""
            }
        }
    }

    /// Which kept key the key whose content is `key` is at `level`: by its bytes when plain, else by its
    /// decoded value (an escaped or byte-order-marked key is the same dictionary key to
    /// `JSONSerialization`; no other spelling is canonically equivalent to these ASCII names).
    private static func field(_ key: Range<Int>, plain: Bool, level: Level, in bytes: UnsafeBufferPointer<UInt8>)
        -> Field
    {
        guard plain else {
            guard let decoded = decodeString(key, in: bytes) else { return .other }
            return Array(decoded.utf8).withUnsafeBufferPointer { field(named: $0, level: level) }
        }
        return field(named: UnsafeBufferPointer(rebasing: bytes[key]), level: level)
    }

    private static func field(named name: UnsafeBufferPointer<UInt8>, level: Level) -> Field {
        guard let at = name.baseAddress else { return .other }
        switch (level, name.count) {
        case (.event, 8): return matches(at, "event_id") ? .eventID : .other
        case (.event, 4): return matches(at, "type") ? .type : matches(at, "time") ? .time : .other
        case (.event, 5): return matches(at, "event") ? .name : .other
        case (.event, 10):
            return matches(at, "properties")
                ? .properties : matches(at, "_tributary") ? .tributary : matches(at, "_hybrid_h5") ? .hybridH5 : .other
        case (.tributary, 3): return matches(at, "seq") ? .seq : .other
        case (.tributary, 8): return matches(at, "producer") ? .producer : .other
        case (.tributary, 12): return matches(at, "producer_seq") ? .producerSeq : .other
        default: return .other
        }
    }

    /// Whether the bytes at `pointer` are `name` (whose length the caller has checked).
    @inline(__always)
    private static func matches(_ pointer: UnsafePointer<UInt8>, _ name: StaticString) -> Bool {
        memcmp(pointer, name.utf8Start, name.utf8CodeUnitCount) == 0
    }

    // MARK: Helpers

    /// The value of the already scanned string whose content is `range`, exactly as `JSONSerialization`
    /// decodes it (escapes, and the byte-order mark its UTF-8 decoding drops after each escape).
    package static func decodeString(_ range: Range<Int>, in bytes: UnsafeBufferPointer<UInt8>) -> String? {
        let token = UnsafeBufferPointer(rebasing: bytes[(range.lowerBound - 1)..<(range.upperBound + 1)])
        var document: [UInt8] = [UInt8(ascii: "[")]
        document.append(contentsOf: token)
        document.append(UInt8(ascii: "]"))
        return ((try? JSONSerialization.jsonObject(with: Data(document))) as? [Any])?.first as? String
    }

    @inline(__always)
    private func peek() -> UInt8? { index < end ? bytes[index] : nil }

    @inline(__always)
    private func hasByteOrderMark(at position: Int) -> Bool {
        end - position >= 3 && bytes[position] == 0xEF && bytes[position + 1] == 0xBB && bytes[position + 2] == 0xBF
    }

    private mutating func skipWhitespace() {
        while index < end {
            switch bytes[index] {
            case UInt8(ascii: " "), UInt8(ascii: "\n"), UInt8(ascii: "\r"), UInt8(ascii: "\t"): index += 1
            default: return
            }
        }
    }

    private func error(_ reason: String) -> JSONSyntaxError {
        JSONSyntaxError(offset: index, reason: reason)
    }
}
