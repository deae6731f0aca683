import CLMDB

/// Keys of the `config` table that Tributary itself reads and writes.
public enum ConfigurationKey {
    /// The main app's preset properties (a JSON object), published by the app's `Tracker` so the agent
    /// can give extension events the app's presets at drain time.
    public static let appPresets = "app.preset_properties"
}

// MARK: Configuration written by the main app

extension SharedStore {
    /// Stores a configuration value (JSON text) under `key`.
    public func setConfiguration(_ key: String, json: String) throws {
        try updateConfiguration(key) { _ in json }
    }

    /// Removes a configuration value; returns whether it was there.
    @discardableResult
    public func removeConfiguration(_ key: String) throws -> Bool {
        var existed = false
        try updateConfiguration(key) { old in
            existed = old != nil
            return nil
        }
        return existed
    }

    /// One configuration value (JSON text), or nil.
    public func configurationValue(_ key: String) throws -> String? {
        let dbi = environment.tables.config
        return try environment.read { txn in try Self.configurationValue(key, dbi: dbi, in: txn) }
    }

    private static func configurationValue(_ key: String, dbi: MDB_dbi, in txn: Transaction) throws -> String? {
        try withKey(key) { k in try txn.withValue(dbi, &k) { $0.map { String(decoding: $0, as: UTF8.self) } } }
    }

    /// Reads a configuration value and writes what `change` makes of it (nil: removes it) in one write
    /// transaction, so that no other process's change between the two is lost.
    package func updateConfiguration(_ key: String, _ change: (String?) throws -> String?) throws {
        let dbi = environment.tables.config
        try producerWrite { txn in
            let old = try Self.configurationValue(key, dbi: dbi, in: txn)
            let new = try change(old)
            guard new != old else { return }
            if let new {
                try withKey(key) { k in try Array(new.utf8).withUnsafeBytes { try txn.put(dbi, &k, $0) } }
            } else {
                _ = try withKey(key) { k in try txn.delete(dbi, &k) }
            }
        }
    }

    /// Every configuration value (key → JSON text).
    public func configuration() throws -> [String: String] {
        let dbi = environment.tables.config
        return try environment.read { txn in
            var out: [String: String] = [:]
            try txn.scan(dbi) { key, value in
                let name = String(decoding: UnsafeRawBufferPointer(start: key.mv_data, count: key.mv_size), as: UTF8.self)
                out[name] = String(decoding: value, as: UTF8.self)
                return true
            }
            return out
        }
    }
}
