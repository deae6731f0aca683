import Foundation
import Testing
import TributaryJSON
import TributaryWire

@testable import TributaryCollector

@Suite("JSONScanner: accepts what JSONSerialization accepts but a trailing comma, extracts the indexed fields")
struct JSONScannerTests {
    /// `JSONSerialization` accepts them; the collector does not (each event's text is stored and
    /// served as it came, and must be JSON to any reader).
    @Test("A trailing comma is refused", arguments: [#"{"a":1,}"#, #"{"a":[1,2,]}"#, "[{},]", "{\"a\":{\"b\":1 ,\n}}"])
    func refusesTrailingComma(text: String) throws {
        let bytes = Array(text.utf8)
        #expect((try? JSONSerialization.jsonObject(with: Data(bytes))) != nil, "JSONSerialization's leniency")
        #expect(!Scan.accepts(bytes))
        #expect(Oracle.hasTrailingComma(bytes))
    }

    @Test(
        "Valid documents are accepted",
        arguments: [
            #"{}"#, #"{"a":1}"#, #" {"a" : [ 1 , 2 ] } "#, "\t{\"a\":\n{}}\r\n",
            #"{"a":[]}"#, #"{"a":[{}]}"#, #"{"a":true,"b":false,"c":null}"#, #"{"a":"\u00e9\ud83d\ude00"}"#,
            #"{"a":"\"\\\/\b\f\n\r\t"}"#, #"{"a":"\u0000"}"#, "{\"a\":\"é 😀 \u{7F}\"}", #"{"a":-0.0e+0}"#,
            #"{"a":1E5}"#, #"{"a":1e-400}"#, #"{"a":123456789012345678901234567890}"#, #"{"":1}"#, "[1,\"a\",{}]",
            "\u{FEFF}{\"a\":1}", #"{"a":"\uFEFF"}"#, "{\"a\":\"\u{FEFF}\u{FEFF}x\u{FEFF}\"}",
        ]
    )
    func acceptsValid(text: String) throws {
        let bytes = Array(text.utf8)
        #expect(Oracle.accepts(bytes))
        #expect(Scan.accepts(bytes))
    }

    @Test(
        "Malformed documents are refused",
        arguments: [
            "", " ", "{", "}", "{]", #"{"a"}"#, #"{"a":}"#, #"{"a":1"#, #"{"a":1}}"#, #"{"a":1} x"#, "{,}", "[,]",
            #"{"a":[1,,2]}"#, #"{"a":1,,}"#, #"{a:1}"#, #"{'a':1}"#, #"{"a":01}"#, #"{"a":-01}"#, #"{"a":1.}"#,
            #"{"a":.5}"#, #"{"a":+1}"#, #"{"a":1e}"#, #"{"a":1e+}"#, #"{"a":1e400}"#, #"{"a":-1E400}"#,
            #"{"a":0x10}"#, #"{"a":NaN}"#, #"{"a":Infinity}"#, #"{"a":1.2.3}"#, #"{"a":--1}"#, #"{"a":tru}"#,
            #"{"a":nul}"#, #"{"a":True}"#, #"{"a":"\x"}"#, #"{"a":"\u12"}"#, #"{"a":"\uZZZZ"}"#, #"{"a":"\ud800"}"#,
            #"{"a":"\udc00"}"#, #"{"a":"\ud800\u0041"}"#, #"{"a":"\ud800x"}"#, #"{"a":"\"}"#, "{\"a\":\"\t\"}",
            "{\"a\":\"\n\"}", "{\"a\":\"\u{1F}\"}", "{\"a\":1}\u{0}", "{\"a\":\"x}", #"{"a":1 2}"#, #"{"a" 1}"#,
            "\u{FEFF}\u{FEFF}{}", " \u{FEFF}{}", "{}\u{FEFF}", "1", #""a""#,
        ]
    )
    func refusesMalformed(text: String) throws {
        let bytes = Array(text.utf8)
        #expect(!Oracle.accepts(bytes))
        #expect(!Scan.accepts(bytes))
    }

    @Test(
        "Invalid UTF-8 in a string is refused, valid multi-byte sequences are accepted",
        arguments: [
            ([0xC3, 0xA9], true), ([0xE2, 0x82, 0xAC], true), ([0xF0, 0x9F, 0x98, 0x80], true),
            ([0xF4, 0x8F, 0xBF, 0xBF], true), ([0xEF, 0xBF, 0xBE], true), ([0xC0, 0x80], false), ([0xC1, 0xBF], false),
            ([0xE0, 0x80, 0x80], false), ([0xED, 0xA0, 0x80], false), ([0xF4, 0x90, 0x80, 0x80], false),
            ([0xF5, 0x80, 0x80, 0x80], false), ([0x80], false), ([0xBF], false), ([0xE2, 0x82], false),
            ([0xFF], false), ([0xFE], false), ([0xC3, 0x28], false),
        ] as [([UInt8], Bool)]
    )
    func utf8(sequence: [UInt8], valid: Bool) {
        let bytes = Array(#"{"a":"x"#.utf8) + sequence + Array(#"y"}"#.utf8)
        #expect(Oracle.accepts(bytes) == valid)
        #expect(Scan.accepts(bytes) == valid)
    }

    @Test("Nesting: 512 arrays and objects are accepted, 513 refused, the data_list array counting as one")
    func nesting() throws {
        func nested(_ depth: Int) -> [UInt8] {
            var text = ""
            for level in 0..<depth { text += level % 2 == 0 ? "{\"k\":" : "[" }
            text += "1"
            for level in (0..<depth).reversed() { text += level % 2 == 0 ? "}" : "]" }
            return Array(text.utf8)
        }
        for depth in [1, 2, 100, 511, 512, 513, 600] {
            let document = nested(depth)
            #expect(Scan.accepts(document) == (depth <= 512), "depth \(depth)")
            #expect(Oracle.accepts(document) == (depth <= 512), "depth \(depth)")
            let array = [UInt8(ascii: "[")] + document + [UInt8(ascii: "]")]
            let scanned = array.withUnsafeBufferPointer { try? JSONScanner.scanObjects($0, maxElements: .max) }
            #expect((scanned != nil) == (depth <= 511), "depth \(depth) in an array")
            #expect(Oracle.accepts(array) == (depth <= 511), "depth \(depth) in an array")
        }
    }

    @Test(
        "Numbers: kind, validity and the _tributary.seq they give agree with JSONSerialization",
        arguments: [
            "0", "-0", "7", "42", "1.0", "1.5", "-1", "1e2", "1E2", "1e+2", "100e-2", "-0.0", "123456789012345678",
            "1234567890123456789", "9223372036854775295", "9223372036854775296", "9223372036854775807",
            "9223372036854775808", "18446744073709551615", "18446744073709551616", "123456789012345678.0",
            "1.00000000000000000001", "12345678901234567890123", "1e18", "9.2e18", "1e19", "1e-400", "0.5e1",
            "5e-1", "1e308", "1.7976931348623157e308", "1.8e308", "2e308", "-1e308",
        ]
    )
    func numbers(number: String) throws {
        let text = #"{"event_id":"e","type":"t","_tributary":{"seq":"# + number + #","producer_seq":1}}"#
        #expect(Scan.outcome(Array(text.utf8)) == Oracle.outcome(Array(text.utf8)))
    }

    @Test("Indexed fields: last of repeated keys, escaped and byte-order-marked keys, escaped values")
    func fields() throws {
        let cases = [
            #"{"\u0065vent_id":"a\u0062","t\u0079pe":"tr\u0061ck","event":"\ud83d\ude00","time":1.5,"#
                + #""properties":{"x":[]}}"#,
            "{\"\u{FEFF}event_id\":\"id\",\"type\":\"x\",\"\\n\u{FEFF}event\":1}",
            #"{"event_id":"x","type":"t","_tributary":null}"#,
            #"{"event_id":"x","type":"t","_tributary":{"producer":7}}"#,
            #"{"event_id":"x","type":"t","_tributary":{"seq":-1}}"#,
            #"{"event_id":"x","type":"t","_tributary":{"seq":1.5}}"#,
            #"{"event_id":"x","type":"t","_tributary":{"seq":true}}"#,
            #"{"event_id":"x","type":"t","_tributary":{"producer_seq":null}}"#,
            #"{"event_id":"","type":"t"}"#,
            #"{"event_id":"x","type":"track","event":"E","time":true,"properties":{}}"#,
            #"{"event_id":"x","type":"track","event":"E","time":1,"properties":[]}"#,
            #"{"event_id":"x","type":"track","time":1,"properties":{}}"#,
            #"{"event_id":"x","type":"track","event":null,"time":1,"properties":{}}"#,
            #"{"event_id":1,"type":"t"}"#, #"{"event_id":"x","type":["t"]}"#, #"{"event_id":"x"}"#,
            #"{"event_id":"x","type":"profile_set","event":5}"#,
            #"{"event_id":"a\u0000b","type":"t","event":"\/"}"#,
        ]
        for text in cases {
            #expect(Scan.outcome(Array(text.utf8)) == Oracle.outcome(Array(text.utf8)), "\(text)")
        }
        // An indexed key given twice is refused: JSONSerialization takes the last, other readers the first.
        for (text, key) in [
            (#"{"event_id":"a","type":"track","event":"E","time":1,"properties":{},"event_id":"b"}"#, "event_id"),
            (#"{"\u0065vent_id":"a","type":"t","event_id":"a"}"#, "event_id"),
            (#"{"event_id":"x","type":"t","_tributary":{"seq":1,"producer":"p","producer_seq":2},"_tributary":{"seq":3}}"#, "_tributary"),
            (#"{"event_id":"x","type":"t","_tributary":{"seq":1,"seq":"2"}}"#, "_tributary.seq"),
            (#"{"event_id":"x","type":"t","time":null,"time":1}"#, "time"),
        ] {
            #expect(Scan.outcome(Array(text.utf8)) == "event 0: \"\(key)\" is given twice; readers disagree on which one counts (the first or the last)", "\(text)")
        }
        #expect(!Scan.outcome(Array(#"{"event_id":"x","type":"t","properties":{"event_id":1,"a":1,"a":2}}"#.utf8)).contains("twice"),
                "only the indexed keys of the event and of _tributary")
        // A byte-order mark in an indexed value, which JSONSerialization drops at a string's start and
        // after an escape, is refused: "\u{FEFF}id" and "id" would be one event id.
        for text in [
            "{\"event_id\":\"\u{FEFF}id\",\"type\":\"x\"}", "{\"event_id\":\"\u{FEFF}\",\"type\":\"t\"}",
            "{\"event_id\":\"\\n\u{FEFF}id\",\"type\":\"x\"}", #"{"event_id":"i\uFEFFd","type":"x"}"#,
        ] {
            #expect(Scan.outcome(Array(text.utf8)).contains("\"event_id\" contains U+FEFF"), "\(text)")
        }
        #expect(!Scan.outcome(Array(#"{"event_id":"i\\uFEFFd","type":"x"}"#.utf8)).contains("U+FEFF"), "an escaped backslash")
    }

    @Test("Differential: seeded mutations of real events are accepted, refused and read as by JSONSerialization")
    func differential() throws {
        let seeds = [
            #"{"type":"track","event":"BuyProduct","time":1795298585399,"distinct_id":"user42","#
                + #""event_id":"1dbe6ff6-c1f3","lib":{"$lib":"Linux","$lib_version":"0.1.0"},"#
                + #""properties":{"$os":"Linux","price":9.99,"n":-1.5e-3,"ok":true,"no":false,"nil":null,"#
                + #""list":[1,"x]",[],{"a":"}"}],"text":"a\"b\\c\nd\u0001 é 😀 \/"},"#
                + #""_tributary":{"seq":1,"producer":"app","producer_kind":"app","producer_seq":1},"_flush_time":17}"#,
            #"{"event_id":"e-2","type":"profile_set","properties":{"name":"[,]","\ud83d\ude00":"\u00e9"}}"#,
            #"[{"event_id":"a","type":"t"} , {"event_id":"b","type":"t","_tributary":{"seq":12345678901234567890}},]"#,
        ]
        let alphabet: [UInt8] =
            Array(#""\{}[],:0123456789-+.eEutfnl /"#.utf8) + [
                0x00, 0x09, 0x0A, 0x0D, 0x1F, 0x7F, 0x80, 0xBF, 0xC0, 0xC3, 0xE2, 0xED, 0xEF, 0xF0, 0xF4, 0xFF,
            ]
        var random = XorShift64(seed: 20_261_122)
        var checked = 0
        for round in 0..<4000 {
            var bytes = Array(seeds[round % seeds.count].utf8)
            for _ in 0..<(1 + Int(random.next() % 3)) {
                let position = Int(random.next() % UInt64(bytes.count + 1))
                switch random.next() % 4 {
                case 0 where position < bytes.count: bytes.remove(at: position)
                case 1 where position < bytes.count:
                    bytes[position] = alphabet[Int(random.next() % UInt64(alphabet.count))]
                case 2: bytes.insert(alphabet[Int(random.next() % UInt64(alphabet.count))], at: position)
                default: bytes = Array(bytes[..<position])
                }
            }
            guard Oracle.readsAsUTF8(bytes) else { continue }
            checked += 1
            #expect(Scan.accepts(bytes) == Oracle.accepts(bytes), "\(String(decoding: bytes, as: UTF8.self))")
            #expect(Scan.outcome(bytes) == Oracle.outcome(bytes), "\(String(decoding: bytes, as: UTF8.self))")
        }
        #expect(checked > 3500)
    }

    @Test("Sensors bodies decode to the same events, texts and errors as WireFormat.decodeWithText")
    func bodies() throws {
        let elements = [#"{"a":"],\"}"}"#, #"{ "b" : [1, {"c":"\\"}], "d":{} }"#, #"{}"#]
        let arrays = [
            " [\n " + elements.joined(separator: " ,\n\t") + " ]\n", "[]", "[1]", "{}", "[{}", "",
            "[{\"a\":1e999}]", "\u{FEFF}[{}]",
        ]
        for array in arrays {
            for gzip in [false, true] {
                let json = gzip ? try Gzip.compress(Array(array.utf8)) : Array(array.utf8)
                let base64 = Data(json).base64EncodedString()
                for form in [
                    "crc=\(javaStringHash(base64))&gzip=\(gzip ? 1 : 0)&data_list=" + formURLEncode(base64),
                    "data%5Flist=" + formURLEncode(base64) + (gzip ? "&gzip=1" : "") + "&&crc=1",
                    "gzip=\(gzip ? 1 : 0)&data_list=" + base64 + "&data_list=" + formURLEncode(base64),
                    "data_list=%FF" + base64, "crc=x&data_list=" + base64, "gzip=1", "data_list=" + base64 + "%",
                ] {
                    let body = Array(form.utf8)
                    let old = Result { () throws(WireError) in
                        try WireFormat.sensors.decodeWithText(body, contentEncoding: nil).map {
                            String(decoding: $0.text, as: UTF8.self)
                        }
                    }
                    let new = Result { () throws(WireError) in
                        let decoded = try BodyDecoder.decode(
                            body, format: .sensors, contentEncoding: nil, limit: 1 << 20, maxEvents: .max)
                        return decoded.events.map { String(decoding: decoded.json[$0.text], as: UTF8.self) }
                    }
                    #expect(Scan.describe(new) == Scan.describe(old), "\(form)")
                }
            }
        }
    }

    @Test("NDJSON bodies decode to the same lines and errors as WireFormat.decodeWithText")
    func ndjsonBodies() throws {
        let bodies = [
            "{\"a\":1}\n{\"b\":2}\n", "\n\n{\"a\":1}\r\n\n{}", "{}\n[]\n", "{}\nnot json\n", "{}\n  \n", "",
            "\u{FEFF}{\"a\":1}\n\u{FEFF}{}", "{\"a\":\"\\u0000\"}\n{\"a\":01}", "{}\r\n\r\n \t\r\n[]\r\n",
        ]
        for text in bodies {
            let body = Array(text.utf8)
            let old = Result { () throws(WireError) in
                try WireFormat.ndjson.decodeWithText(body, contentEncoding: nil).map {
                    String(decoding: $0.text, as: UTF8.self)
                }
            }
            let new = Result { () throws(WireError) in
                let decoded = try BodyDecoder.decode(body, format: .ndjson, contentEncoding: nil, limit: 1 << 20, maxEvents: .max)
                return decoded.events.map { String(decoding: decoded.json[$0.text], as: UTF8.self) }
            }
            #expect(Scan.describe(new) == Scan.describe(old), "\(text)")
        }
    }
}

/// The scanner and the validator, as the collector runs them on one document.
private enum Scan {
    /// Whether the scanner accepts `bytes` as an object or an array (`JSONSerialization` refuses other
    /// values at the top level; the collector refuses all but objects).
    static func accepts(_ bytes: [UInt8]) -> Bool {
        bytes.withUnsafeBufferPointer { buffer in
            guard let event = try? JSONScanner.scanDocument(buffer, range: 0..<buffer.count) else { return false }
            let start = bytes.starts(with: [0xEF, 0xBB, 0xBF]) ? 3 : 0
            let first = bytes[start...].first { ![0x20, 0x0A, 0x0D, 0x09].contains($0) }
            return event.isObject || first == UInt8(ascii: "[")
        }
    }

    /// "refused", "not an object", the validation error, or the indexed fields.
    static func outcome(_ bytes: [UInt8]) -> String {
        bytes.withUnsafeBufferPointer { buffer in
            guard let event = try? JSONScanner.scanDocument(buffer, range: 0..<buffer.count) else { return "refused" }
            guard event.isObject else { return "not an object" }
            do throws(InvalidEvent) {
                let valid = try EventValidator.validate(event, in: buffer, at: 0)
                return describe(
                    valid.eventID, valid.type, valid.name, valid.seq, valid.producer, valid.producerSeq)
            } catch {
                return error.message
            }
        }
    }

    static func describe(
        _ eventID: String, _ type: String, _ name: String?, _ seq: Int64?, _ producer: String?, _ producerSeq: Int64?
    ) -> String {
        "\(Array(eventID.unicodeScalars)) \(Array(type.unicodeScalars)) \(name.map { Array($0.unicodeScalars) } ?? []) "
            + "\(seq ?? -1) \(producer ?? "-") \(producerSeq ?? -1)"
    }

    /// The texts, or the error's code and its message up to the detail the scanner adds (after a
    /// colon, or the closing period).
    static func describe(_ result: Result<[String], WireError>) -> String {
        switch result {
        case .success(let texts): "\(texts)"
        case .failure(let error): "\(error.code): \(error.message.prefix { $0 != ":" && $0 != "." })"
        }
    }
}

/// What the collector did before the scanner: `JSONSerialization`, then the checks on the dictionary.
private enum Oracle {
    static func accepts(_ bytes: [UInt8]) -> Bool {
        (try? JSONSerialization.jsonObject(with: Data(bytes))) != nil && !hasTrailingComma(bytes)
    }

    /// Whether a `,` outside strings is followed, after whitespace, by `]` or `}` (which
    /// `JSONSerialization` accepts and the collector refuses).
    static func hasTrailingComma(_ bytes: [UInt8]) -> Bool {
        var inString = false
        var escaped = false
        var comma = false
        for byte in bytes {
            if inString {
                if escaped { escaped = false } else if byte == UInt8(ascii: "\\") { escaped = true } else if byte == UInt8(ascii: "\"") { inString = false }
                continue
            }
            switch byte {
            case UInt8(ascii: "\""): inString = true; comma = false
            case UInt8(ascii: ","): comma = true
            case UInt8(ascii: "]"), UInt8(ascii: "}"): if comma { return true }
            case UInt8(ascii: " "), UInt8(ascii: "\t"), UInt8(ascii: "\n"), UInt8(ascii: "\r"): continue
            default: comma = false
            }
        }
        return false
    }

    /// Whether `JSONSerialization` reads `bytes` as UTF-8 (not UTF-16/32 from a mark or NUL bytes), and
    /// can (it force-unwraps the decoding of what follows a byte-order mark).
    static func readsAsUTF8(_ bytes: [UInt8]) -> Bool {
        if bytes.starts(with: [0xEF, 0xBB, 0xBF]) { return String(validating: bytes, as: UTF8.self) != nil }
        if bytes.starts(with: [0xFF, 0xFE]) || bytes.starts(with: [0xFE, 0xFF])
            || bytes.starts(with: [0, 0, 0xFE, 0xFF])
        {
            return false
        }
        return !bytes.prefix(4).contains(0)
    }

    /// Like ``Scan/outcome(_:)``; a valid value other than an object (a top-level fragment too) is
    /// "not an object".
    static func outcome(_ bytes: [UInt8]) -> String {
        guard let value = try? JSONSerialization.jsonObject(with: Data(bytes), options: .fragmentsAllowed),
            !hasTrailingComma(bytes)
        else {
            return "refused"
        }
        guard let object = value as? [String: Any] else { return "not an object" }
        func invalid(_ field: String, _ problem: String) -> String { "event 0: \"\(field)\" \(problem)" }
        let nul = "contains U+0000 (\\u0000), which the collector cannot index"
        for (key, field) in [("event_id", "event_id"), ("type", "type"), ("event", "event")] {
            if (object[key] as? String)?.utf8.contains(0) == true { return invalid(field, nul) }
            if key == "event_id", (object[key] as? String)?.isEmpty != false {
                return invalid("event_id", "is missing or not a non-empty string")
            }
            if key == "type", !(object[key] is String) { return invalid("type", "is missing or not a string") }
        }
        let eventID = object["event_id"] as! String
        let type = object["type"] as! String
        let name = object["event"] as? String
        if type == "track" {
            guard name != nil else {
                return invalid("event", "is missing or not a string (required for type \"track\")")
            }
            guard SerializedNumber.isNumber(object["time"]) else {
                return invalid("time", "is missing or not a number (required for type \"track\")")
            }
            guard object["properties"] is [String: Any] else {
                return invalid("properties", "is missing or not an object (required for type \"track\")")
            }
        }
        var seq: Int64?
        var producerSeq: Int64?
        var producer: String?
        if let meta = object["_tributary"] {
            guard let meta = meta as? [String: Any] else { return invalid("_tributary", "is not an object") }
            for (key, field) in [("seq", "_tributary.seq"), ("producer_seq", "_tributary.producer_seq")] {
                guard let value = meta[key] else { continue }
                guard let number = SerializedNumber.nonNegativeInteger(value) else {
                    return invalid(field, "is not an integer within 0...\(Int64.max)")
                }
                if key == "seq" { seq = number } else { producerSeq = number }
            }
            if let value = meta["producer"] {
                guard let value = value as? String else { return invalid("_tributary.producer", "is not a string") }
                if value.utf8.contains(0) { return invalid("_tributary.producer", nul) }
                producer = value
            }
        }
        if let mark = object["_hybrid_h5"], !(mark is NSNumber && !SerializedNumber.isNumber(mark)) {
            return invalid("_hybrid_h5", "is not a boolean (true marks an event a hybrid page sent)")
        }
        if type.hasPrefix("profile_"), let problem = profileProblem(object, type: type) { return problem }
        return Scan.describe(eventID, type, name, seq, producer, producerSeq)
    }

    /// What the collector refuses in a profile record (docs/collector.md), read from the dictionary.
    static func profileProblem(_ object: [String: Any], type: String) -> String? {
        func invalid(_ field: String, _ problem: String) -> String { "event 0: \"\(field)\" \(problem)" }
        let operations = [
            "profile_set", "profile_set_once", "profile_increment", "profile_append", "profile_unset", "profile_delete",
        ]
        guard operations.contains(type) else {
            return invalid("type", "is not a profile operation the collector knows (\(operations.joined(separator: ", ")))")
        }
        guard let user = object["distinct_id"] as? String, !user.isEmpty else {
            return invalid("distinct_id", "is missing or not a non-empty string (required for a profile record)")
        }
        if user.unicodeScalars.contains(where: { $0 == "\u{0}" || $0 == "\u{FEFF}" }) {
            return invalid("distinct_id", "contains U+0000 or U+FEFF, which the collector cannot index")
        }
        let given = object["properties"]
        guard let properties = given as? [String: Any] ?? (given == nil && type == "profile_delete" ? [:] : nil) else {
            return invalid("properties", "is missing or not an object (required for type \"\(type)\")")
        }
        for key in properties.keys.sorted() {
            let value = properties[key]
            if type == "profile_increment", !SerializedNumber.isNumber(value) {
                return invalid("properties.\(key)", "is \(kindName(value)); profile_increment takes numbers")
            }
            if type == "profile_append", !((value as? [Any])?.allSatisfy { $0 is String } ?? false) {
                return invalid("properties.\(key)", "is \(kindName(value)); profile_append takes lists of strings")
            }
        }
        return nil
    }

    /// A `JSONSerialization` value's kind, as the collector's messages name it.
    static func kindName(_ value: Any?) -> String {
        switch value {
        case is NSNull: "null"
        case let number as NSNumber: SerializedNumber.isNumber(number) ? "a number" : "a boolean"
        case is String: "a string"
        case is [Any]: "a list"
        default: "an object"
        }
    }
}

/// A small seeded generator (xorshift64), so a failing differential case can be replayed.
private struct XorShift64 {
    var state: UInt64
    init(seed: UInt64) { state = seed | 1 }
    mutating func next() -> UInt64 {
        state ^= state << 13
        state ^= state >> 7
        state ^= state << 17
        return state
    }
}
