import Testing

@testable import TributaryAgentCore

@Suite("Top-level JSON fields")
struct JSONFieldsTests {
    @Test("finds top-level keys only", arguments: [
        (#"{"event_id":"a"}"#, "a"),
        (#"{"properties":{"event_id":"inner"},"event_id":"outer"}"#, "outer"),
        (#"{"s":"\"event_id\":\"fake\"","event_id":"real"}"#, "real"),
        (#"{"list":["event_id",{"event_id":"x"}], "event_id" : "spaced" }"#, "spaced"),
        (#"{"event_id":"esc\"aped\u00e9"}"#, "esc\"apedé"),
        // A quote after an even run of backslashes ends the string; after an odd one it is escaped.
        (#"{"s":"ends in a backslash\\","event_id":"after"}"#, "after"),
        (#"{"s":"\\\",\"event_id\":\"inside\\\\","event_id":"outside"}"#, "outside"),
        (#"{"":"empty key","event_id":"x\\"}"#, "x\\"),
    ])
    func string(json: String, expected: String) {
        #expect(JSONFields.string("event_id", in: Array(json.utf8)) == expected)
    }

    @Test("absent, non-string or malformed gives nil", arguments: [
        #"{}"#, #"{"event_id":5}"#, #"[1]"#, #"{"event_id":"unterminated}"#, "", #"{"properties":{"event_id":"x"}}"#,
    ])
    func missing(json: String) {
        #expect(JSONFields.string("event_id", in: Array(json.utf8)) == nil)
    }

    @Test("integers")
    func ints() {
        #expect(JSONFields.int("time", in: Array(#"{"a":{"time":1},"time":1700000000123}"#.utf8)) == 1_700_000_000_123)
    }

    @Test("appending a field", arguments: [
        (#"{"a":1}"#, #"{"a":1,"_f":7}"#),
        (#"{}"#, #"{"_f":7}"#),
        ("{\"a\":1} \n", "{\"a\":1,\"_f\":7} \n"),
    ])
    func appending(json: String, expected: String) throws {
        let out = try #require(JSONFields.appending("_f", rawValue: Array("7".utf8), to: Array(json.utf8)))
        #expect(String(decoding: out, as: UTF8.self) == expected)
    }
}
