import Foundation

/// Which HTTP proxy, if any, a request to the collector goes through: `--proxy`, else the
/// environment's `https_proxy`/`HTTPS_PROXY` (for `https://` collectors) and `http_proxy`/`HTTP_PROXY`
/// (for `http://` ones), unless `no_proxy`/`NO_PROXY` names the collector's host. The collector is
/// reached through the proxy with `CONNECT` (async-http-client tunnels `http://` too): of an
/// `https://` collector the proxy sees the host name, never the batches; TLS (and its pins) are end
/// to end.
public struct ProxySettings: Sendable, Equatable {
    /// The proxy for `http://` collectors: `http://[user:password@]host:port`.
    public var http: String?
    /// The proxy for `https://` collectors (`CONNECT`).
    public var https: String?
    /// `NO_PROXY`: comma-separated hosts (`collector.internal`), domains (`.internal` or `internal`:
    /// the domain and every host under it), IP addresses, each with an optional `:port`; `*`: none.
    public var noProxy: String?

    /// No proxy.
    public init() {}

    /// The same proxy for both schemes (`--proxy`), with `noProxy`.
    public init(proxy: String, noProxy: String?) {
        (http, https, self.noProxy) = (proxy, proxy, noProxy)
    }

    /// The proxies an environment names, the lower-case name first (as curl reads them); an empty
    /// value counts as unset (systemd's `VAR=`), and the other case's then applies.
    public init(environment: [String: String]) {
        func value(_ name: String) -> String? {
            [name.lowercased(), name.uppercased()].lazy.compactMap { environment[$0] }.first { !$0.isEmpty }
        }
        (http, https, noProxy) = (value("http_proxy"), value("https_proxy"), value("no_proxy"))
    }

    /// A proxy as the HTTP client takes it.
    public struct Proxy: Sendable, Hashable {
        public var host: String
        public var port: Int
        /// `user:password` from the proxy URL, for `Proxy-Authorization: Basic`.
        public var credentials: (user: String, password: String)? {
            guard let user else { return nil }
            return (user, password ?? "")
        }
        var user: String?
        var password: String?
    }

    /// Checks that every proxy URL is an `http://` URL with a host (and a port, 1 … 65535, if any).
    public func validate() throws(AgentError) {
        for (name, url) in [("HTTP proxy", http), ("HTTPS proxy", https)] {
            guard let url else { continue }
            guard Self.parse(url) != nil else {
                throw AgentError(
                    .configuration,
                    "The \(name) '\(url)' is not an http://[user:password@]host[:port] URL (--proxy, or https_proxy/http_proxy in the environment).")
            }
        }
    }

    /// The proxy a request to `serverURL` goes through, or nil to go direct.
    public func proxy(for serverURL: String) -> Proxy? {
        guard let url = URLComponents(string: serverURL), let scheme = url.scheme?.lowercased(), let host = url.host else {
            return nil
        }
        let port = url.port ?? (scheme == "https" ? 443 : 80)
        guard let proxyURL = scheme == "https" ? https : http, !Self.bypasses(host: host, port: port, noProxy: noProxy) else {
            return nil
        }
        return Self.parse(proxyURL)
    }

    /// A proxy URL's parts; nil for one that is not `http://host[:port]` (a bare `host:port` is taken
    /// as `http://host:port`, as curl takes it).
    static func parse(_ text: String) -> Proxy? {
        let withScheme = text.contains("://") ? text : "http://" + text
        guard let url = URLComponents(string: withScheme), url.scheme?.lowercased() == "http",
            let host = url.host, !host.isEmpty, (url.port ?? 80) > 0, (url.port ?? 80) <= 65535
        else { return nil }
        return Proxy(
            host: host, port: url.port ?? 80, user: url.user.map { $0.removingPercentEncoding ?? $0 },
            password: url.password.map { $0.removingPercentEncoding ?? $0 })
    }

    /// Whether `NO_PROXY` sends requests to `host:port` direct.
    static func bypasses(host: String, port: Int, noProxy: String?) -> Bool {
        guard let noProxy else { return false }
        let host = host.lowercased().trimmingCharacters(in: CharacterSet(charactersIn: "[]"))
        for entry in noProxy.split(separator: ",") {
            var name = Substring(entry.trimmingCharacters(in: .whitespaces).lowercased())
            if name == "*" { return true }
            var entryPort: Substring?
            if name.hasPrefix("["), let close = name.firstIndex(of: "]") {  // [::1] or [::1]:8080
                let rest = name[name.index(after: close)...]
                if rest.hasPrefix(":") { entryPort = rest.dropFirst() }
                name = name[name.index(after: name.startIndex)..<close]
            } else if name.filter({ $0 == ":" }).count == 1, let colon = name.firstIndex(of: ":") {  // host:port
                entryPort = name[name.index(after: colon)...]
                name = name[..<colon]
            }
            if let entryPort, Int(entryPort) != port { continue }
            if name.hasPrefix("*.") { name = name.dropFirst(2) } else if name.hasPrefix(".") { name = name.dropFirst() }
            guard !name.isEmpty else { continue }
            if host == name || host.hasSuffix("." + name) { return true }
        }
        return false
    }
}
