import Foundation
import Testing

@testable import Tributary

@Suite("Sensors validation rules")
struct ValidationTests {
    @Test("valid event names", arguments: ["BuyProduct", "_x", "a1", "$AppClick", "$AppStart", "x_$y", String(repeating: "a", count: 100)])
    func validEventNames(name: String) throws {
        try EventRules.validateEventName(name)
    }

    @Test("invalid event names", arguments: [
        ("", TrackingError.Code.invalidName),
        ("1abc", .invalidName),
        ("has space", .invalidName),
        ("dash-ed", .invalidName),
        ("ünïcode", .invalidName),
        (String(repeating: "a", count: 101), .nameTooLong),
        ("time", .reservedName),
        ("DISTINCT_ID", .reservedName),
        ("Event", .reservedName),
        ("user_group_x", .reservedName),
        ("user_tagged", .reservedName),
        ("$MyEvent", .reservedName),
    ])
    func invalidEventNames(name: String, code: TrackingError.Code) {
        let error = #expect(throws: TrackingError.self) { try EventRules.validateEventName(name) }
        #expect(error?.code == code)
        #expect(error?.message.isEmpty == false)
    }

    @Test("property values", arguments: [
        ("s", PropertyValue.string(String(repeating: "x", count: 8192)), nil as TrackingError.Code?),
        ("s", .string(String(repeating: "x", count: 8193)), .valueTooLong),
        ("s", .string(String(repeating: "é", count: 4097)), .valueTooLong),
        ("l", .list(["a", String(repeating: "x", count: 8193)]), .valueTooLong),
        ("n", .double(.nan), .nonFiniteNumber),
        ("n", .double(.infinity), .nonFiniteNumber),
        ("n", .double(-.infinity), .nonFiniteNumber),
        ("n", .double(1.5), nil),
        ("i", .int(.max), nil),
        ("b", .bool(false), nil),
        ("d", .date(Date(timeIntervalSince1970: 253_402_214_399)), nil),
        ("d", .date(Date(timeIntervalSince1970: -62_135_510_400)), nil),
        ("$screen_name", .string("Home"), nil),
        ("time", .int(1), .reservedName),
        ("bad key", .int(1), .invalidName),
    ])
    func propertyValues(key: String, value: PropertyValue, code: TrackingError.Code?) throws {
        if let code {
            let error = #expect(throws: TrackingError.self) { try EventRules.validateProperty(key, value) }
            #expect(error?.code == code)
            #expect(error?.field == key)
        } else {
            try EventRules.validateProperty(key, value)
        }
    }

    /// Not test arguments: Foundation's `Date.description`, which describes them, traps on them too.
    @Test("a date past year 9999, before year 1, or NaN is refused, not a trap writing yyyy-MM-dd HH:mm:ss.SSS")
    func datesOutOfRange() {
        // A day inside years 1 and 9999 too: in some time zone those dates are in year 0 or 10000.
        for seconds in [1e17, 253_402_214_400, 253_402_300_799, -1e17, -62_135_510_401, -62_135_596_800, .nan] {
            let error = #expect(throws: TrackingError.self) {
                try EventRules.validateProperty("d", .date(Date(timeIntervalSince1970: seconds)))
            }
            #expect(error?.code == .dateOutOfRange, "\(seconds) s")
            // STYLE: a message never holds a property's value (it held the seconds since 1970).
            #expect(error.map { !$0.message.contains("\(seconds)") && !$0.message.contains("since 1970") } == true, "\(error?.message ?? "")")
        }
    }

    /// In this process's time zone (changing `TZ` here would race the suites running beside it).
    @Test("dates are written in local time as DateFormatter writes them, before 1970 too, four-digit years at the range's ends")
    func sensorsDates() throws {
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.calendar = Calendar(identifier: .gregorian)
        formatter.timeZone = TimeZone.current
        formatter.dateFormat = "yyyy-MM-dd HH:mm:ss.SSS"
        for seconds in [-1.5, -0.5, -86_400.25, 0, 1.5, 1_700_000_000.125] {
            let date = Date(timeIntervalSince1970: seconds)
            #expect(JSONWriter.sensorsDate(date) == formatter.string(from: date), "\(seconds) s")
        }
        for seconds in [EventRules.dateRange.lowerBound, EventRules.dateRange.upperBound] {
            let written = JSONWriter.sensorsDate(Date(timeIntervalSince1970: seconds))
            #expect(written.count == 23 && !written.hasPrefix("0000") && !written.hasPrefix("10000"), "\(written)")
        }
    }

    @Test("error messages never contain the property value")
    func privacy() {
        let secret = "SECRET-" + String(repeating: "z", count: 9000)
        let error = #expect(throws: TrackingError.self) { try EventRules.validateProperty("card", .string(secret)) }
        #expect(error?.message.contains("SECRET") == false)
        #expect(error?.message.contains("9007") == true)
        #expect(error?.message.contains("8192") == true)
    }

    @Test("properties from JSON", arguments: [
        (#"{"a": 1, "b": 1.5, "c": "x", "d": true, "e": ["x", "y"]}"#, nil as TrackingError.Code?),
        (#"{"a": null}"#, .invalidValueType),
        (#"{"a": {"b": 1}}"#, .invalidValueType),
        (#"{"a": [1, 2]}"#, .invalidValueType),
        (#"[1]"#, .malformedProperties),
        (#"{"a": "#, .malformedProperties),
        // JSONDecoder reads these as JSON; they are not.
        (#"{"a": 1,}"#, .malformedProperties),
        (#"{"a": ["x",]}"#, .malformedProperties),
        (#"{"a": 01}"#, .malformedProperties),
        (#"{"n": 18446744073709551615}"#, .inexactNumber),
        (#"{"n": -9223372036854775809}"#, .inexactNumber),
        // One key twice, as written or escaped: JSONDecoder would keep one value and drop the other.
        (#"{"a": 1, "b": "a", "a": 2}"#, .malformedProperties),
        (#"{"a\"b": 1, "a\u0022b": 2}"#, .malformedProperties),
    ])
    func propertiesFromJSON(text: String, code: TrackingError.Code?) throws {
        if let code {
            let error = #expect(throws: TrackingError.self) { try PropertyValue.properties(fromJSON: text) }
            #expect(error?.code == code, "\(String(describing: error))")
        } else {
            let parsed = try PropertyValue.properties(fromJSON: text)
            #expect(parsed == ["a": .int(1), "b": .double(1.5), "c": .string("x"), "d": .bool(true), "e": .list(["x", "y"])])
        }
    }

    @Test("numbers beyond Int64 are doubles when the double is that number, and kept exactly in Int64's range")
    func wholeNumbersFromJSON() throws {
        let parsed = try PropertyValue.properties(
            fromJSON: #"{"max": 9223372036854775807, "min": -9223372036854775808, "e": 1e23, "big": 100000000000000000000, "f": 12.5}"#)
        #expect(parsed["max"] == .int(.max) && parsed["min"] == .int(.min))
        #expect(parsed["e"] == .double(1e23) && parsed["big"] == .double(1e20) && parsed["f"] == .double(12.5))
        let error = #expect(throws: TrackingError.self) { try PropertyValue.properties(fromJSON: #"{"id": 12345678901234567890123}"#) }
        #expect(error?.field == "id" && error?.message.contains("as a string") == true)
        #expect(error?.message.contains("12345678901234567890123") == false, "never the value")
    }

    @Test("ids", arguments: [
        ("", false), ("  ", false), ("user-1", true), (String(repeating: "u", count: 256), false), ("用户 é", true),
        ("a\u{0}b", false), ("\u{FEFF}user", false), ("line\nbreak", false), ("tab\t", false), ("del\u{7F}", false),
    ])
    func ids(id: String, valid: Bool) {
        if valid {
            #expect(throws: Never.self) { try EventRules.validateID(id, what: "login id") }
        } else {
            #expect(throws: TrackingError.self) { try EventRules.validateID(id, what: "login id") }
        }
    }
}
