import CLMDB

/// The app group's identity, shared by every process through the store (the group's "keychain").
public struct Identity: Sendable, Hashable, Codable {
    /// A random id created once for the group, or set with `identify(anonymousID:)`.
    public var anonymousID: String
    /// The logged-in user's id, if any.
    public var loginID: String?
    /// A random id created once for the group, never reset (like iOS's identifierForVendor).
    public var deviceID: String

    /// The id events are attributed to: the login id when logged in, else the anonymous id.
    public var distinctID: String { loginID ?? anonymousID }

    /// Creates an identity.
    public init(anonymousID: String, loginID: String?, deviceID: String) {
        self.anonymousID = anonymousID
        self.loginID = loginID
        self.deviceID = deviceID
    }
}

enum IdentityKey {
    static let anonymousID = "anonymous_id"
    static let loginID = "login_id"
    static let deviceID = "device_id"
}

// MARK: Identity

extension SharedStore {
    /// Reads the group's identity, creating the anonymous and device ids on first use.
    public func identity() throws -> Identity {
        if let existing = try existingIdentity() { return existing }
        return try producerWrite { txn in try self.identity(in: txn, creating: true)! }
    }

    /// The group's identity, or nil when no producer has created it yet. Read only: it waits for the
    /// writer lock only when every reader slot is taken (the agent reads it to drain).
    public func existingIdentity() throws -> Identity? {
        try environment.read { txn in try self.identity(in: txn, creating: false) }
    }

    /// Binds the group to a login id (shared by every process of the group).
    public func login(_ loginID: String) throws -> Identity {
        try updateIdentity { $0.loginID = loginID }
    }

    /// Clears the login id.
    public func logout() throws -> Identity {
        try updateIdentity { $0.loginID = nil }
    }

    /// Replaces the anonymous id.
    public func identify(anonymousID: String) throws -> Identity {
        try updateIdentity { $0.anonymousID = anonymousID }
    }

    /// Changes the group's identity in one write transaction; returns it as changed.
    package func updateIdentity(_ change: (inout Identity) -> Void) throws -> Identity {
        try producerWrite { txn in
            var identity = try self.identity(in: txn, creating: true)!
            change(&identity)
            try self.store(identity, in: txn)
            return identity
        }
    }

    /// Writes the anonymous and login ids of `identity` (the device id never changes).
    func store(_ identity: Identity, in txn: Transaction) throws {
        let dbi = environment.tables.identity
        for (name, value) in [(IdentityKey.anonymousID, identity.anonymousID), (IdentityKey.loginID, identity.loginID)] {
            try withKey(name) { key in
                if let value {
                    try Array(value.utf8).withUnsafeBytes { try txn.put(dbi, &key, $0) }
                } else {
                    try txn.delete(dbi, &key)
                }
            }
        }
    }

    /// Reads the identity inside a transaction; in a write transaction, creates the missing ids.
    func identity(in txn: Transaction, creating: Bool) throws -> Identity? {
        let dbi = environment.tables.identity
        func read(_ name: String) throws -> String? {
            try withKey(name) { key in try txn.withValue(dbi, &key) { $0.map { String(decoding: $0, as: UTF8.self) } } }
        }
        var anonymous = try read(IdentityKey.anonymousID)
        var device = try read(IdentityKey.deviceID)
        if anonymous == nil || device == nil {
            guard creating else { return nil }
            for (name, current) in [(IdentityKey.anonymousID, anonymous), (IdentityKey.deviceID, device)] where current == nil {
                let fresh = randomUUIDString()
                try withKey(name) { key in try Array(fresh.utf8).withUnsafeBytes { try txn.put(dbi, &key, $0) } }
                if name == IdentityKey.anonymousID { anonymous = fresh } else { device = fresh }
            }
        }
        return Identity(anonymousID: anonymous!, loginID: try read(IdentityKey.loginID), deviceID: device!)
    }
}
