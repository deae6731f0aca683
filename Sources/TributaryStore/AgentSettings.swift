import Foundation
import TributaryJSON

/// What the main app tells the group's agent: where to upload and how often (DESIGN, "configuration
/// written by the main app"; the iOS SDK's `serverURL`, `flushBulkSize` and `flushInterval`).
///
/// The app writes them into the shared store (``SharedStore/setAgentSettings(_:)``, or
/// `tributary config set`), under the `config` table's key ``configurationKey``, as a JSON object;
/// the agent reads them at its start and whenever they change, and uses each one neither its command
/// line nor its environment sets, the format only with the app's server URL (docs/operations.md,
/// "Settings written by the app"). Every field is optional: an absent one leaves the agent's own value.
///
/// JSON keys: `server_url`, `format`, `flush_bulk_size`, `flush_interval_seconds`. A key not among
/// them, a value of the wrong type or out of range is ``StoreError/Code/invalidSettings``, both when
/// writing and when reading: a mistyped key must not look like a setting that took effect.
public struct AgentSettings: Sendable, Equatable, Encodable {
    /// The body format of uploads (the agent's `--format`).
    public enum Format: String, Sendable, CaseIterable, Encodable {
        case sensors, ndjson
    }

    /// One setting, by its JSON key.
    public enum Key: String, Sendable, CaseIterable, CodingKey {
        case serverURL = "server_url"
        case format
        case flushBulkSize = "flush_bulk_size"
        case flushIntervalSeconds = "flush_interval_seconds"
    }
    private typealias CodingKeys = Key

    /// The collector URL batches are POSTed to: `http://` or `https://` with a host.
    public var serverURL: String?
    /// The body format.
    public var format: Format?
    /// Upload as soon as this many events are pending (``bulkSizeRange``).
    public var flushBulkSize: Int?
    /// Upload at least this often, in seconds (``intervalRange``).
    public var flushIntervalSeconds: Double?

    /// The `config` table's key the settings are stored under.
    public static let configurationKey = "agent.settings"
    /// The bulk sizes an app may ask for: the iOS SDK's floor (50), up to a million.
    public static let bulkSizeRange = 50...1_000_000
    /// The flush intervals an app may ask for, in seconds: the iOS SDK's floor (5 s), up to a day.
    public static let intervalRange: ClosedRange<Double> = 5...86_400
    /// The longest server URL, in bytes.
    public static let maxServerURLBytes = 2048

    /// Settings with the given values (nil: the agent's own).
    public init(serverURL: String? = nil, format: Format? = nil, flushBulkSize: Int? = nil, flushIntervalSeconds: Double? = nil) {
        self.serverURL = serverURL
        self.format = format
        self.flushBulkSize = flushBulkSize
        self.flushIntervalSeconds = flushIntervalSeconds
    }

    /// Whether no setting is given.
    public var isEmpty: Bool { self == AgentSettings() }

    /// The settings in a JSON object's text, as stored; throws ``StoreError/Code/invalidSettings``
    /// naming the key and the rule it breaks.
    public init(json: String) throws(StoreError) {
        let object: [String: JSONValue]
        do {
            object = try JSONDecoder().decode([String: JSONValue].self, from: Data(json.utf8))
        } catch DecodingError.typeMismatch {
            throw StoreError(.invalidSettings, "The agent settings must be a JSON object, like {\"server_url\":\"https://…\"}.")
        } catch {
            throw StoreError(.invalidSettings, "The agent settings are not valid JSON.")
        }
        self.init()
        for name in object.keys.sorted() {
            guard let key = Key(rawValue: name) else { throw Self.unknownKey(name) }
            switch (key, object[name]!) {
            case (_, .null): continue
            case (.serverURL, .string(let text)), (.format, .string(let text)): try set(key, to: text)
            case (.serverURL, _), (.format, _): throw Self.invalid(key, "must be a string")
            case (.flushBulkSize, .integer(let number)), (.flushIntervalSeconds, .integer(let number)):
                try set(key, to: String(number))
            case (.flushBulkSize, .number(let number)), (.flushIntervalSeconds, .number(let number)):
                try set(key, to: String(number))
            case (.flushBulkSize, _), (.flushIntervalSeconds, _): throw Self.invalid(key, "must be a number")
            }
        }
    }

    /// The settings as stored: a JSON object with the given keys, sorted.
    public var json: String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        // Encoding these four fields cannot fail.
        return String(decoding: (try? encoder.encode(self)) ?? Data("{}".utf8), as: UTF8.self)
    }

    /// Sets one setting from its text (`tributary config set KEY=VALUE`): a URL, `sensors` or
    /// `ndjson`, an integer, a number of seconds. Throws ``StoreError/Code/invalidSettings``.
    public mutating func set(_ key: Key, to text: String) throws(StoreError) {
        switch key {
        case .serverURL:
            try Self.validateServerURL(text)
            serverURL = text
        case .format:
            guard let format = Format(rawValue: text) else {
                throw Self.invalid(key, "must be \(Format.allCases.map(\.rawValue).joined(separator: " or ")), not \(Self.quoted(text))")
            }
            self.format = format
        case .flushBulkSize:
            guard let size = Int(text), Self.bulkSizeRange.contains(size) else {
                throw Self.invalid(
                    key, "must be a whole number of events from \(Self.bulkSizeRange.lowerBound) to \(Self.bulkSizeRange.upperBound), not \(Self.quoted(text))")
            }
            flushBulkSize = size
        case .flushIntervalSeconds:
            guard let seconds = Double(text), Self.intervalRange.contains(seconds) else {
                throw Self.invalid(
                    key, "must be a number of seconds from \(Int(Self.intervalRange.lowerBound)) to \(Int(Self.intervalRange.upperBound)), not \(Self.quoted(text))")
            }
            flushIntervalSeconds = seconds
        }
    }

    /// Takes one setting's value from `other` (nil there removes it here).
    public mutating func merge(_ key: Key, from other: AgentSettings) {
        switch key {
        case .serverURL: serverURL = other.serverURL
        case .format: format = other.format
        case .flushBulkSize: flushBulkSize = other.flushBulkSize
        case .flushIntervalSeconds: flushIntervalSeconds = other.flushIntervalSeconds
        }
    }

    /// Removes one setting (the agent's own value applies again).
    public mutating func remove(_ key: Key) { merge(key, from: AgentSettings()) }

    /// Checks every given setting (a value built in code bypasses ``set(_:to:)``) by the same rules,
    /// through its text (a NaN or infinite interval is `nan` or `inf`, out of range).
    public func validate() throws(StoreError) {
        var copy = AgentSettings()
        if let serverURL { try copy.set(.serverURL, to: serverURL) }
        if let flushBulkSize { try copy.set(.flushBulkSize, to: String(flushBulkSize)) }
        if let flushIntervalSeconds { try copy.set(.flushIntervalSeconds, to: String(flushIntervalSeconds)) }
    }

    /// Checks a collector URL: `http://` or `https://` with a host, a port (if any) of 1 … 65535, at
    /// most ``maxServerURLBytes``, no spaces or control characters. Throws ``StoreError/Code/invalidSettings`` naming it.
    public static func validateServerURL(_ text: String) throws(StoreError) {
        guard text.utf8.count <= maxServerURLBytes else {
            throw invalid(.serverURL, "must be at most \(maxServerURLBytes) bytes; it has \(text.utf8.count)")
        }
        guard !text.unicodeScalars.contains(where: { $0.properties.isWhitespace || $0.properties.generalCategory == .control }),
            let url = URL(string: text), let scheme = url.scheme?.lowercased(), scheme == "http" || scheme == "https",
            let host = url.host, !host.isEmpty
        else {
            throw invalid(.serverURL, "must be an http:// or https:// URL with a host, not \(quoted(text))")
        }
        // A port past 65535 traps the HTTP client (an IP address) or wraps to another port (a host name).
        if let port = url.port, !(1...65535).contains(port) {
            throw invalid(.serverURL, "has port \(port), not one of 1 … 65535: \(quoted(text))")
        }
    }

    private static func quoted(_ text: String) -> String {
        text.count > 80 ? "\"\(text.prefix(80))…\"" : "\"\(text)\""
    }

    private static func unknownKey(_ name: String) -> StoreError {
        StoreError(
            .invalidSettings,
            "The agent settings have an unknown key \(quoted(name)); the known ones are "
                + Key.allCases.map(\.rawValue).joined(separator: ", ") + ".")
    }

    private static func invalid(_ key: Key, _ rule: String) -> StoreError {
        StoreError(.invalidSettings, "The agent setting \(key.rawValue) \(rule).")
    }
}

extension SharedStore {
    /// The group's agent settings, as the main app wrote them (empty when it wrote none). Throws
    /// ``StoreError/Code/invalidSettings`` when what is stored is not valid settings (written by
    /// something other than ``setAgentSettings(_:)``, or by a newer version that knows more keys).
    public func agentSettings() throws -> AgentSettings {
        try Self.agentSettings(stored: configurationValue(AgentSettings.configurationKey))
    }

    /// Replaces the group's agent settings, after checking them (``StoreError/Code/invalidSettings``,
    /// nothing written); empty settings remove them. A running agent applies them at its next turn:
    /// within a poll interval (200 ms), or once the request it is waiting for ends.
    public func setAgentSettings(_ settings: AgentSettings) throws {
        try settings.validate()
        try updateConfiguration(AgentSettings.configurationKey) { _ in settings.isEmpty ? nil : settings.json }
    }

    /// Changes the group's agent settings in one write transaction (another process's change between
    /// reading and writing them is not lost): `change` gets the stored ones, and what it leaves is
    /// checked and written (empty: removed). Throws ``StoreError/Code/invalidSettings``, writing
    /// nothing, when the stored settings or the changed ones are not valid. `change` runs inside the
    /// transaction: it must not read the store, and it may be called again when the transaction must
    /// begin again (the map grown), giving the same result each time.
    public func updateAgentSettings(_ change: (inout AgentSettings) throws -> Void) throws {
        try updateConfiguration(AgentSettings.configurationKey) { stored in
            var settings = try Self.agentSettings(stored: stored)
            try change(&settings)
            try settings.validate()
            return settings.isEmpty ? nil : settings.json
        }
    }

    private static func agentSettings(stored: String?) throws(StoreError) -> AgentSettings {
        guard let stored else { return AgentSettings() }
        do {
            return try AgentSettings(json: stored)
        } catch {
            throw StoreError(
                .invalidSettings,
                "The group's stored agent settings are not valid: \(error.message) SharedStore.setAgentSettings "
                    + "replaces them; `tributary config unset --all` removes them.")
        }
    }
}
