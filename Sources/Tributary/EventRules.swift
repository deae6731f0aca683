/// The Sensors Analytics validation rules for event names, property keys and values.
public enum EventRules {
    /// Longest event name or property key.
    public static let maxNameLength = 100
    /// Longest string value (and list element), in UTF-8 bytes.
    public static let maxStringBytes = 8192
    /// Longest login or anonymous id, in UTF-8 bytes.
    public static let maxIDBytes = 255
    /// The most one identity field (`distinct_id`, `login_id`, `anonymous_id`) adds to an encoded event:
    /// an id of ``maxIDBytes`` bytes, each escaped in two (`"` and `\`), with its key, quotes and comma.
    /// The identity is written in the store's transaction, after the size check: the check reserves this.
    static let maxEncodedIDFieldBytes = 2 * maxIDBytes + 32
    /// The dates a property can hold, in seconds since 1970: 0001-01-02 through 9999-12-30 (UTC). A
    /// date is written in local time as `yyyy-MM-dd HH:mm:ss.SSS`, and a day's margin at each end
    /// keeps its year within 1 … 9999 in every time zone (UTC−12 … UTC+14). NaN is outside.
    public static let dateRange: ClosedRange<Double> = -62_135_510_400...253_402_214_399.999

    /// Names Sensors reserves for its own columns (compared case-insensitively).
    public static let reservedNames: Set<String> = [
        "distinct_id", "original_id", "time", "properties", "id", "first_id", "second_id", "users", "events",
        "event", "user_id", "date", "datetime",
    ]
    /// Reserved prefixes (case-insensitive).
    public static let reservedPrefixes = ["user_group", "user_tag"]

    /// The `$`-prefixed event names the SDK itself emits; other `$` event names are reserved.
    public static let presetEvents: Set<String> = [
        "$AppStart", "$AppStartPassively", "$AppEnd", "$AppViewScreen", "$AppClick", "$AppCrashed",
        "$AppDeeplinkLaunch", "$AppExposure", "$SignUp", "$WebClick", "$pageview", "$WebStay", "$WebPageLeave",
        "$AppPerformance", "$AppPageLeave", "$Logout", "$Identify",
    ]

    /// Checks an event name.
    public static func validateEventName(_ name: String) throws {
        try validateName(name, what: "event name")
        if name.hasPrefix("$") && !presetEvents.contains(name) {
            throw TrackingError(
                .reservedName, field: name,
                "Event names starting with $ are reserved for preset events (\(presetEvents.sorted().joined(separator: ", "))).")
        }
    }

    /// Checks a property key and its value.
    public static func validateProperty(_ key: String, _ value: PropertyValue) throws {
        try validateName(key, what: "property name")
        switch value {
        case .string(let s):
            try checkLength(s, field: key, what: "value of property \(key)")
        case .list(let items):
            for (i, s) in items.enumerated() {
                try checkLength(s, field: key, what: "element \(i) of list property \(key)")
            }
        case .double(let d):
            guard d.isFinite else {
                throw TrackingError(
                    .nonFiniteNumber, field: key, "Property \(key) is \(d.isNaN ? "NaN" : "infinite"); numbers must be finite.")
            }
        case .date(let date):
            guard dateRange.contains(date.timeIntervalSince1970) else {
                throw TrackingError(
                    .dateOutOfRange, field: key,
                    "Property \(key) is a date outside 0001-01-02 … 9999-12-30 (UTC), the dates an event can hold.")
            }
        case .int, .bool:
            break
        }
    }

    /// Checks every property of an event.
    public static func validateProperties(_ properties: [String: PropertyValue]) throws {
        for (key, value) in properties { try validateProperty(key, value) }
    }

    /// Checks a login or anonymous id.
    public static func validateID(_ id: String, what: String) throws {
        let bytes = id.utf8.count
        guard bytes > 0, bytes <= maxIDBytes, !id.allSatisfy(\.isWhitespace) else {
            throw TrackingError(
                .invalidID, field: what,
                "The \(what) must be 1 to \(maxIDBytes) UTF-8 bytes and not blank; it has \(bytes).")
        }
        // U+0000 ends SQLite text and U+FEFF is dropped by JSON decoders at a string's start: a
        // collector indexing the id could not tell two apart (the reference collector refuses them).
        if let bad = id.unicodeScalars.first(where: { $0.properties.generalCategory == .control || $0 == "\u{FEFF}" }) {
            throw TrackingError(
                .invalidID, field: what,
                "The \(what) contains U+\(String(bad.value, radix: 16, uppercase: true).leftPadded(to: 4)), a control "
                    + "character or byte-order mark; ids are printable text.")
        }
    }

    private static func validateName(_ name: String, what: String) throws {
        // Fast path, on every property of every event: a valid name is ASCII, so its bytes are its
        // characters. Anything else takes the general path, which finds and words the problem.
        var name = name
        let valid: Bool? = name.withUTF8 { utf8 in
            guard (1...maxNameLength).contains(utf8.count) else { return nil }
            for (i, b) in utf8.enumerated() {
                let ok = b == 0x5F || b == 0x24 || (0x41...0x5A).contains(b) || (0x61...0x7A).contains(b)
                    || (i > 0 && (0x30...0x39).contains(b))
                if !ok { return nil }
            }
            return !isReserved(utf8)
        }
        if valid == true { return }
        try explainInvalidName(name, what: what)
    }

    /// Whether an ASCII name is reserved (compared case-insensitively, byte by byte).
    private static func isReserved(_ utf8: UnsafeBufferPointer<UInt8>) -> Bool {
        func matches(_ reserved: [UInt8], wholeName: Bool) -> Bool {
            guard wholeName ? utf8.count == reserved.count : utf8.count >= reserved.count else { return false }
            for (b, r) in zip(utf8, reserved) where ((0x41...0x5A).contains(b) ? b | 0x20 : b) != r { return false }
            return true
        }
        return reservedNameBytes.contains { matches($0, wholeName: true) }
            || reservedPrefixBytes.contains { matches($0, wholeName: false) }
    }

    private static let reservedNameBytes = reservedNames.map { Array($0.utf8) }
    private static let reservedPrefixBytes = reservedPrefixes.map { Array($0.utf8) }

    /// Throws the error describing what is wrong with `name`.
    private static func explainInvalidName(_ name: String, what: String) throws {
        let scalars = name.unicodeScalars
        guard !scalars.isEmpty else {
            throw TrackingError(.invalidName, field: name, "The \(what) is empty.")
        }
        guard scalars.count <= maxNameLength else {
            throw TrackingError(
                .nameTooLong, field: String(name.prefix(32)) + "…",
                "The \(what) has \(scalars.count) characters; the limit is \(maxNameLength).")
        }
        for (i, s) in scalars.enumerated() {
            let v = s.value
            let ok = v == 0x5F || v == 0x24 || (0x41...0x5A).contains(v) || (0x61...0x7A).contains(v)
                || (i > 0 && (0x30...0x39).contains(v))
            guard ok else {
                throw TrackingError(
                    .invalidName, field: name,
                    "The \(what) \(name) has character \(i + 1) not allowed: names match ^[a-zA-Z_$][a-zA-Z0-9_$]{0,99}$.")
            }
        }
        throw TrackingError(.reservedName, field: name, "The \(what) \(name) is reserved by Sensors Analytics.")
    }

    /// `what` names the value in the error message; it is built only when the check fails.
    private static func checkLength(_ s: String, field: String, what: @autoclosure () -> String) throws {
        let bytes = s.utf8.count
        guard bytes <= maxStringBytes else {
            throw TrackingError(
                .valueTooLong, field: field, "The \(what()) has \(bytes) UTF-8 bytes; the limit is \(maxStringBytes).")
        }
    }
}

extension String {
    fileprivate func leftPadded(to width: Int) -> String {
        String(repeating: "0", count: max(0, width - count)) + self
    }
}
