import Foundation

/// How the hybrid bridge decides which pages it trusts.
public struct BridgeConfiguration: Sendable {
    /// The app's own server URL (`https://host/sa?project=name`). Its host and `project` (default
    /// `default`) are what a page event's `server_url` must have.
    public var serverURL: String
    /// Origins (`scheme://host[:port]`) whose frames may send events. A frame of any other origin,
    /// main frame or iframe, is rejected with ``BridgeRejection/Reason/foreignOrigin``.
    public var allowedOrigins: Set<String>
    /// Further server URLs whose host and `project` are accepted too (the JS SDK's
    /// `app_js_bridge.white_list`). Default none.
    public var allowedServerURLs: [String] = []
    /// Largest message, in UTF-8 bytes. Default 64 KiB (a page event is a few KiB at most).
    public var maxMessageBytes: Int = 64 << 10

    /// A configuration for an app whose server is `serverURL`, trusting frames of `allowedOrigins`.
    public init(serverURL: String, allowedOrigins: Set<String>) {
        self.serverURL = serverURL
        self.allowedOrigins = Set(allowedOrigins.map(Self.normalizedOrigin))
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
