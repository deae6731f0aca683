import Foundation

/// How the hybrid bridge decides which pages it trusts.
public struct BridgeConfiguration: Sendable {
    /// The app's own server URL (`https://host/sa?project=name`). Its host and `project` (default
    /// `default`) are what a page event's `server_url` must have.
    public var serverURL: String
    /// Origins (`scheme://host[:port]`) whose frames may send events. A frame of any other origin,
    /// main frame or iframe, is rejected with ``BridgeRejection/Reason/foreignOrigin``.
    ///
    /// Normalised whenever set (lower case, no trailing slash, no default port). An opaque origin
    /// (`null`) is never trusted and is left out: it is what every sandboxed (`srcdoc` or not) or `data:`
    /// document has, whatever page embeds it, and what the host calls a context it does not know.
    public var allowedOrigins: Set<String> {
        get { trustedOrigins }
        set {
            // Normalised, without the ones no frame can have (``problem(withOrigin:)``), which are kept apart.
            trustedOrigins = []
            ignoredOrigins = []
            for origin in newValue {
                if let why = Self.problem(withOrigin: origin) {
                    ignoredOrigins.append((origin, why))
                } else {
                    trustedOrigins.insert(Self.normalizedOrigin(origin))
                }
            }
            ignoredOrigins.sort { $0.origin < $1.origin }
        }
    }
    private var trustedOrigins: Set<String>
    /// The origins given that are left out of ``allowedOrigins``, with why.
    private var ignoredOrigins: [(origin: String, why: String)] = []
    /// Further server URLs whose host and `project` are accepted too (the JS SDK's
    /// `app_js_bridge.white_list`). Default none.
    public var allowedServerURLs: [String] = []
    /// Largest message, in UTF-8 bytes. Default 64 KiB (a page event is a few KiB at most).
    public var maxMessageBytes: Int = 64 << 10
    /// Most bytes of page messages waiting to be handled (each is verified, then committed durably, one
    /// at a time). A message that would go beyond it is dropped unread and counted as `overloaded`:
    /// a page posting in a loop faster than the store commits would otherwise grow the queue without
    /// bound. Default 16 MiB (thousands of ordinary events; at least one message of the largest size
    /// always fits).
    public var maxQueuedBytes: Int = 16 << 20

    /// A configuration for an app whose server is `serverURL`, trusting frames of `allowedOrigins`.
    public init(serverURL: String, allowedOrigins: Set<String>) {
        self.serverURL = serverURL
        trustedOrigins = []
        self.allowedOrigins = allowedOrigins
    }

    /// What in this configuration can never match a page, one sentence each: an origin left out of
    /// ``allowedOrigins`` (opaque, or not `scheme://host[:port]`), a ``serverURL`` or an
    /// ``allowedServerURLs`` entry without a host. Empty when there is none. ``HybridBridge`` logs each
    /// when it is created: every message such a value was meant for would be refused, and say only
    /// `foreign_origin` or `foreign_project`.
    public var problems: [String] {
        var problems = ignoredOrigins.map { "Allowed origin '\($0.origin)' \($0.why); it is ignored." }
        if ServerProject(url: serverURL) == nil {
            let others = allowedServerURLs.contains { ServerProject(url: $0) != nil }
            problems.append(
                "The server URL '\(serverURL)' is not an absolute URL with a host (like https://host/sa?project=name): "
                    + (others ? "page events naming the app's server" : "every page event") + " is refused as "
                    + "foreign_project, and the legacy channel's user-agent marker names no server.")
        }
        for url in allowedServerURLs where ServerProject(url: url) == nil {
            problems.append("Allowed server URL '\(url)' is not an absolute URL with a host; it is ignored.")
        }
        return problems
    }

    /// Why `origin` can never be trusted, or nil: opaque, or other than `scheme://host[:port]` as a
    /// browser writes a frame's origin (no path, query or fragment, no user, no wildcard, no space, a
    /// numeric port).
    static func problem(withOrigin origin: String) -> String? {
        if isOpaque(origin) {
            return "is opaque or names no scheme and host (an opaque origin, `null`, is never trusted; "
                + "write `http://127.0.0.1:8080`, not `127.0.0.1:8080`)"
        }
        let normalized = normalizedOrigin(origin)
        guard let separator = normalized.range(of: "://") else { return nil }
        let scheme = normalized[..<separator.lowerBound]
        let authority = normalized[separator.upperBound...]
        if authority.contains(where: { "/?#".contains($0) }) {
            return "has a path, query or fragment; a frame's origin is only scheme://host[:port]"
        }
        if !scheme.allSatisfy({ $0.isLetter || $0.isNumber || "+-.".contains($0) })
            || authority.contains(where: { $0.isWhitespace || "@*\\".contains($0) })
        {
            return "is not scheme://host[:port] as a browser writes a frame's origin (no user, no wildcard, no space)"
        }
        // The port: after the host (after the brackets of an IPv6 address), digits only.
        let host =
            authority.hasPrefix("[") ? authority[(authority.firstIndex(of: "]") ?? authority.endIndex)...] : authority
        if let colon = host.lastIndex(of: ":") {
            let port = host[host.index(after: colon)...]
            guard !port.isEmpty, port.allSatisfy(\.isASCII), port.allSatisfy(\.isNumber) else {
                return "has a port that is not a number; a frame's origin is only scheme://host[:port]"
            }
        }
        return nil
    }

    /// Whether `origin` is opaque, or names no host: `null` as the web writes it, `://` as Chromium
    /// reports it, empty, or anything else without a scheme and a host around `://`.
    static func isOpaque(_ origin: String) -> Bool {
        guard let separator = origin.range(of: "://") else { return true }
        return separator.lowerBound == origin.startIndex
            || origin[separator.upperBound...].allSatisfy { $0 == "/" }
    }

    /// The user-agent marker of the legacy channel: ` /sa-sdk-ios/sensors-verify/<host>?<project>`.
    public var userAgentMarker: String {
        " /sa-sdk-ios/sensors-verify/" + (ServerProject(url: serverURL)?.description ?? "")
    }

    /// `scheme://host[:port]` in lower case, without a trailing slash and without the default port.
    static func normalizedOrigin(_ origin: String) -> String {
        var o = origin.lowercased()
        while o.hasSuffix("/") { o.removeLast() }
        if o.hasPrefix("http://"), o.hasSuffix(":80") { o.removeLast(3) }
        if o.hasPrefix("https://"), o.hasSuffix(":443") { o.removeLast(4) }
        return o
    }
}

/// The part of a server URL the bridge compares: host and `project`.
public struct ServerProject: Hashable, Sendable, CustomStringConvertible {
    /// The host, lower case.
    public var host: String
    /// The `project` query parameter, `default` when absent.
    public var project: String

    /// Reads `url`'s host and project; nil when it has no host.
    public init?(url: String) {
        guard let components = URLComponents(string: url), let host = components.host, !host.isEmpty else {
            return nil
        }
        self.host = host.lowercased()
        let project = components.queryItems?.first { $0.name == "project" }?.value
        self.project = project.flatMap { $0.isEmpty ? nil : $0 } ?? "default"
    }

    /// Host and project as given.
    public init(host: String, project: String) {
        self.host = host.lowercased()
        self.project = project
    }

    public var description: String { "\(host)?\(project)" }
}
