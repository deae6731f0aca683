import Foundation
import Testing
import TributaryTestSupport

@testable import TributaryStore

@Suite("Agent settings written by the app")
struct AgentSettingsTests {
    @Test("valid settings parse, and their stored form parses to the same", arguments: [
        (#"{}"#, AgentSettings()),
        (#"{"server_url":"https://c.example.com/sa?project=p"}"#, AgentSettings(serverURL: "https://c.example.com/sa?project=p")),
        (#"{"format":"ndjson","flush_bulk_size":50,"flush_interval_seconds":5}"#,
         AgentSettings(format: .ndjson, flushBulkSize: 50, flushIntervalSeconds: 5)),
        (#"{"flush_interval_seconds":7.5,"flush_bulk_size":1000000}"#, AgentSettings(flushBulkSize: 1_000_000, flushIntervalSeconds: 7.5)),
        (#"{"server_url":null,"format":"sensors"}"#, AgentSettings(format: .sensors)),
        (#"{"flush_bulk_size":50.0}"#, AgentSettings(flushBulkSize: 50)),
    ])
    func parses(json: String, expected: AgentSettings) throws {
        let settings = try AgentSettings(json: json)
        #expect(settings == expected)
        #expect(try AgentSettings(json: settings.json) == settings)
    }

    @Test("invalid settings are invalidSettings, naming the key and the rule", arguments: [
        (#"[]"#, "must be a JSON object"),
        (#"{"#, "not valid JSON"),
        (#""https://c.example.com""#, "must be a JSON object"),
        (#"{"server":"https://c.example.com"}"#, #"unknown key "server"; the known ones are server_url, format"#),
        (#"{"server_url":1}"#, "server_url must be a string"),
        (#"{"server_url":"ftp://c.example.com"}"#, "server_url must be an http:// or https:// URL"),
        (#"{"server_url":"https://"}"#, "with a host"),
        (#"{"server_url":"https://c.example.com/a b"}"#, "server_url must be an http"),
        (#"{"server_url":"http://127.0.0.1:65536/sa"}"#, "has port 65536, not one of 1 … 65535"),
        (#"{"server_url":"http://[::1]:99999999999/sa"}"#, "not one of 1 … 65535"),
        (#"{"server_url":"http://c.example.com:0/sa"}"#, "has port 0"),
        (#"{"format":"xml"}"#, "format must be sensors or ndjson"),
        (#"{"flush_bulk_size":true}"#, "flush_bulk_size must be a number"),
        (#"{"flush_bulk_size":"100"}"#, "flush_bulk_size must be a number"),
        (#"{"flush_bulk_size":49}"#, "from 50 to 1000000"),
        (#"{"flush_bulk_size":50.5}"#, "flush_bulk_size must be a whole number"),
        (#"{"flush_interval_seconds":4.9}"#, "from 5 to 86400"),
        (#"{"flush_interval_seconds":86401}"#, "from 5 to 86400"),
    ])
    func refuses(json: String, message: String) {
        #expect {
            _ = try AgentSettings(json: json)
        } throws: { error in
            guard let error = error as? StoreError, error.code == .invalidSettings else { return false }
            return error.message.contains(message)
        }
    }

    @Test("a server URL longer than 2,048 bytes is refused, saying so")
    func longURL() {
        let url = "https://c.example.com/" + String(repeating: "a", count: 2048)
        #expect(throws: StoreError.self) { try AgentSettings.validateServerURL(url) }
        var settings = AgentSettings()
        #expect(performing: { try settings.set(.serverURL, to: url) }, throws: { error in
            (error as? StoreError)?.message.contains("at most 2048 bytes") == true
        })
    }

    @Test("the store keeps the settings; refused ones write nothing and leave the stored ones; empty ones remove them")
    func storeRoundTrip() throws {
        try withTemporaryGroup { group in
            let store = try SharedStore(groupDirectory: group)
            #expect(try store.agentSettings() == AgentSettings())
            let settings = AgentSettings(serverURL: "http://127.0.0.1:9/sa", flushBulkSize: 200)
            try store.setAgentSettings(settings)
            #expect(try store.agentSettings() == settings)
            #expect(try store.configuration()[AgentSettings.configurationKey] == #"{"flush_bulk_size":200,"server_url":"http://127.0.0.1:9/sa"}"#)

            let before = store.lastTransactionID
            for refused in [AgentSettings(flushBulkSize: 10), AgentSettings(flushIntervalSeconds: .nan),
                            AgentSettings(serverURL: "collector.example.com")] {
                #expect(throws: StoreError.self) { try store.setAgentSettings(refused) }
            }
            #expect(store.lastTransactionID == before, "a refused write committed a transaction")
            #expect(try store.agentSettings() == settings)

            try store.setAgentSettings(AgentSettings())
            #expect(try store.configuration()[AgentSettings.configurationKey] == nil)
        }
    }

    @Test("settings stored by something else that are not valid are reported when read, not taken")
    func invalidStored() throws {
        try withTemporaryGroup { group in
            let store = try SharedStore(groupDirectory: group)
            try store.setConfiguration(AgentSettings.configurationKey, json: #"{"server_url":"http://127.0.0.1:9/sa","retries":3}"#)
            #expect(performing: { try store.agentSettings() }, throws: { error in
                (error as? StoreError)?.code == .invalidSettings && (error as? StoreError)?.message.contains("\"retries\"") == true
            })
        }
    }
}
