import Foundation
import TributaryJSON
import TributaryErrors

/// An `apple-app-site-association` file's universal links (`applinks`): which URLs of the domain
/// open which app.
///
/// Both forms are supported: the newer `components` (iOS 13+: `/`, `?` as a pattern or a dictionary
/// of query items, `#`, `exclude`, `caseSensitive`, `percentEncoded`, with `defaults` at the
/// `applinks` and the `details` level) and the older `paths` (`NOT ` marks an exclusion).
///
/// Rules (from Apple's `applinks` documentation): `*` matches any run of characters, including none
/// and including `/`; `?` matches exactly one character; every other character matches itself.
/// Patterns are tried in order — the `details` entries in file order, and in each its patterns in
/// order — and the first pattern that matches decides: an exclusion means the URL opens no app, an
/// inclusion opens that entry's apps. Matching is case-sensitive and against the percent-encoded URL
/// unless `caseSensitive` / `percentEncoded` say `false`. Only `https` URLs are universal links.
public struct AppSiteAssociation: Sendable, Equatable {
    /// What a URL does.
    public enum Decision: Sendable, Equatable {
        /// The URL opens an app: the matched entry's app ids, in file order (the first is preferred).
        case opens(appIDs: [String])
        /// The first matching pattern is an exclusion: the URL opens in the browser.
        case excluded
        /// No pattern matches (or the URL is not `https`).
        case noMatch
    }

    /// One pattern, with its settings.
    struct Component: Sendable, Equatable, CustomStringConvertible {
        var path: String?
        var query: Query?
        var fragment: String?
        var exclude = false
        var caseSensitive: Bool?
        var percentEncoded: Bool?

        /// `NOT ` for an exclusion, the path pattern (`*` when absent), `?` and the query, `#` and the fragment.
        var description: String {
            var text = (exclude ? "NOT " : "") + (path ?? "*")
            switch query {
            case nil: break
            case .pattern(let pattern)?: text += "?" + pattern
            case .items(let items)?:
                text += "?" + items.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: "&")
            }
            if let fragment { text += "#" + fragment }
            return text
        }
    }

    enum Query: Sendable, Equatable {
        case pattern(String)
        case items([String: String])
    }

    struct Settings: Sendable, Equatable {
        var caseSensitive = true
        var percentEncoded = true
    }

    struct Entry: Sendable, Equatable {
        var appIDs: [String]
        var components: [Component]
        var settings: Settings
    }

    let entries: [Entry]

    /// Parses the file's JSON text (the whole file, or just its `applinks` object).
    ///
    /// - Throws: ``AppSiteAssociationError`` naming the key that is missing, has the wrong type, or is
    ///   not supported (`substitutionVariables`).
    public init(json text: String) throws {
        let root: JSONValue
        do {
            root = try JSONDecoder().decode(JSONValue.self, from: Data(text.utf8))
        } catch {
            throw AppSiteAssociationError("The file is not valid JSON.")
        }
        guard case .object(let top) = root else { throw AppSiteAssociationError("The file is not a JSON object.") }
        let applinks: [String: JSONValue]
        if case .object(let inner)? = top["applinks"] { applinks = inner } else { applinks = top }
        if applinks["substitutionVariables"] != nil {
            throw AppSiteAssociationError("applinks.substitutionVariables is not supported.")
        }
        guard case .array(let details)? = applinks["details"] else {
            throw AppSiteAssociationError("applinks.details is missing or not an array.")
        }
        let domain = try Self.settings(applinks["defaults"], base: Settings(), at: "applinks.defaults")
        var entries: [Entry] = []
        for (i, detail) in details.enumerated() {
            let at = "applinks.details[\(i)]"
            guard case .object(let d) = detail else { throw AppSiteAssociationError("\(at) is not an object.") }
            var appIDs: [String] = []
            if case .string(let id)? = d["appID"] { appIDs.append(id) }
            if case .array(let ids)? = d["appIDs"] {
                for id in ids {
                    guard case .string(let s) = id else {
                        throw AppSiteAssociationError("\(at).appIDs holds a non-string.")
                    }
                    appIDs.append(s)
                }
            }
            guard !appIDs.isEmpty else { throw AppSiteAssociationError("\(at) has neither appID nor appIDs.") }
            let settings = try Self.settings(d["defaults"], base: domain, at: "\(at).defaults")
            var components: [Component] = []
            if case .array(let list)? = d["components"] {
                for (j, c) in list.enumerated() {
                    components.append(try Self.component(c, at: "\(at).components[\(j)]"))
                }
            } else if case .array(let paths)? = d["paths"] {
                for (j, p) in paths.enumerated() {
                    guard case .string(var pattern) = p else {
                        throw AppSiteAssociationError("\(at).paths[\(j)] is not a string.")
                    }
                    let exclude = pattern.hasPrefix("NOT ")
                    if exclude { pattern.removeFirst(4) }
                    components.append(Component(path: pattern, exclude: exclude))
                }
            } else {
                throw AppSiteAssociationError("\(at) has neither a components nor a paths array.")
            }
            entries.append(Entry(appIDs: appIDs, components: components, settings: settings))
        }
        self.entries = entries
    }

    private static func settings(_ value: JSONValue?, base: Settings, at: String) throws -> Settings {
        guard let value else { return base }
        guard case .object(let o) = value else { throw AppSiteAssociationError("\(at) is not an object.") }
        var settings = base
        if let v = o["caseSensitive"] { settings.caseSensitive = try bool(v, at: "\(at).caseSensitive") }
        if let v = o["percentEncoded"] { settings.percentEncoded = try bool(v, at: "\(at).percentEncoded") }
        return settings
    }

    private static func bool(_ value: JSONValue, at: String) throws -> Bool {
        guard case .bool(let b) = value else {
            throw AppSiteAssociationError("\(at) is \(value.kindName), not a boolean.")
        }
        return b
    }

    private static func string(_ value: JSONValue?, at: String) throws -> String? {
        guard let value else { return nil }
        guard case .string(let s) = value else {
            throw AppSiteAssociationError("\(at) is \(value.kindName), not a string.")
        }
        return s
    }

    private static func component(_ value: JSONValue, at: String) throws -> Component {
        guard case .object(let o) = value else { throw AppSiteAssociationError("\(at) is not an object.") }
        var c = Component()
        c.path = try string(o["/"], at: "\(at)./")
        c.fragment = try string(o["#"], at: "\(at).#")
        switch o["?"] {
        case nil: break
        case .string(let s)?: c.query = .pattern(s)
        case .object(let items)?:
            var patterns: [String: String] = [:]
            for (name, pattern) in items { patterns[name] = try string(pattern, at: "\(at).?.\(name)") }
            c.query = .items(patterns)
        case let other?: throw AppSiteAssociationError("\(at).? is \(other.kindName), not a string or an object.")
        }
        if let v = o["exclude"] { c.exclude = try bool(v, at: "\(at).exclude") }
        if let v = o["caseSensitive"] { c.caseSensitive = try bool(v, at: "\(at).caseSensitive") }
        if let v = o["percentEncoded"] { c.percentEncoded = try bool(v, at: "\(at).percentEncoded") }
        return c
    }

    /// Decides what `url` does. Only `https` URLs with a host are universal links.
    public func decision(for url: String) -> Decision { match(for: url).decision }

    /// Decides what `url` does, and names the pattern that decided (nil for ``Decision/noMatch``): a
    /// `paths` entry as written (`NOT /old/*`), a component as `/path?query#fragment`, with `NOT ` for an
    /// exclusion.
    public func match(for url: String) -> (decision: Decision, pattern: String?) {
        guard let parts = URLComponents(string: url), parts.scheme?.lowercased() == "https",
            parts.host?.isEmpty == false
        else { return (.noMatch, nil) }
        for entry in entries {
            for component in entry.components {
                let settings = Settings(
                    caseSensitive: component.caseSensitive ?? entry.settings.caseSensitive,
                    percentEncoded: component.percentEncoded ?? entry.settings.percentEncoded)
                if Self.matches(component, parts, settings) {
                    return (component.exclude ? .excluded : .opens(appIDs: entry.appIDs), component.description)
                }
            }
        }
        return (.noMatch, nil)
    }

    /// The app `url` opens, if any: the first app id of the deciding entry.
    public func appID(for url: String) -> String? {
        if case .opens(let ids) = decision(for: url) { return ids.first }
        return nil
    }

    private static func matches(_ c: Component, _ url: URLComponents, _ s: Settings) -> Bool {
        let rawPath = s.percentEncoded ? url.percentEncodedPath : url.path
        let path = rawPath.isEmpty ? "/" : rawPath
        if !glob(c.path ?? "*", path, s) { return false }
        switch c.query {
        case nil: break
        case .pattern(let pattern)?:
            let query = (s.percentEncoded ? url.percentEncodedQuery : url.query) ?? ""
            if !glob(pattern, query, s) { return false }
        case .items(let patterns)?:
            let items = (s.percentEncoded ? url.percentEncodedQueryItems : url.queryItems) ?? []
            for (name, pattern) in patterns {
                let found = items.first {
                    s.caseSensitive ? $0.name == name : $0.name.lowercased() == name.lowercased()
                }
                guard let found, glob(pattern, found.value ?? "", s) else { return false }
            }
        }
        let fragment = (s.percentEncoded ? url.percentEncodedFragment : url.fragment) ?? ""
        return glob(c.fragment ?? "*", fragment, s)
    }

    /// `*` any run (also empty), `?` one character, the rest literal.
    static func glob(_ pattern: String, _ text: String, _ s: Settings) -> Bool {
        let p = Array(s.caseSensitive ? pattern : pattern.lowercased())
        let t = Array(s.caseSensitive ? text : text.lowercased())
        var (pi, ti) = (0, 0)
        var star: Int?
        var mark = 0
        while ti < t.count {
            // A `*` in the pattern is always the wildcard, also where the text has a literal `*`.
            if pi < p.count && p[pi] == "*" {
                star = pi
                mark = ti
                pi += 1
            } else if pi < p.count && (p[pi] == "?" || p[pi] == t[ti]) {
                pi += 1
                ti += 1
            } else if let star {
                pi = star + 1
                mark += 1
                ti = mark
            } else {
                return false
            }
        }
        while pi < p.count && p[pi] == "*" { pi += 1 }
        return pi == p.count
    }
}

/// An `apple-app-site-association` file the matcher cannot read; the message names the key.
public struct AppSiteAssociationError: TributaryError {
    /// What kind of failure this is.
    public struct Code: ErrorCode {
        private enum Kind: String { case invalidFile }
        private let kind: Kind
        private init(_ kind: Kind) { self.kind = kind }
        public init?(rawValue: String) {
            guard let kind = Kind(rawValue: rawValue) else { return nil }
            self.kind = kind
        }
        public var rawValue: String { kind.rawValue }

        /// The file is not JSON, not an object, or a key holds what the format does not allow.
        public static let invalidFile = Code(.invalidFile)
    }

    public var code: Code { .invalidFile }
    /// A sentence naming the key and what is wrong with it.
    public var message: String
    public var cause: (any Error & Sendable)? { nil }
    public var location: SourceLocation

    init(_ message: String, file: String = #fileID, line: Int = #line) {
        self.message = message
        location = SourceLocation(file: file, line: line)
    }

    public var description: String { "apple-app-site-association: \(message)" }
}
