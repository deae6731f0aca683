import AsyncHTTPClient
import NIOSSL
import Synchronization

/// Creates the agent's HTTP clients: connect timeout 5 s, no redirects (a redirected POST could
/// silently go somewhere else), TLS 1.2 or later with the system's roots or those of ``TLSSettings``,
/// and no connection retries of the client's own: a connection that cannot be made (refused, reset,
/// a name that does not resolve) fails the attempt at once and the agent's ``Backoff`` decides when
/// to try again. async-http-client's pool would otherwise go on retrying behind the agent on a backoff
/// of its own (100 ms × 1.25ⁿ, up to a minute) while the request waited, so that after an outage the
/// next attempt could come well past the agent's backoff cap.
package enum HTTPClientFactory {
    package static func make(
        readTimeout: Duration = .seconds(30), tls: TLSConfiguration = TLSSettings.systemDefault.configuration,
        proxy: ProxySettings.Proxy? = nil
    ) -> HTTPClient {
        var configuration = HTTPClient.Configuration()
        configuration.timeout = .init(connect: .seconds(5), read: .init(readTimeout))
        configuration.redirectConfiguration = .disallow
        configuration.connectionPool.retryConnectionEstablishment = false
        configuration.tlsConfiguration = tls
        if let proxy {
            configuration.proxy = .server(
                host: proxy.host, port: proxy.port,
                authorization: proxy.credentials.map { .basic(username: $0.user, password: $0.password) })
        }
        return HTTPClient(eventLoopGroupProvider: .singleton, configuration: configuration)
    }
}

/// The agent's HTTP clients, one per proxy in use: async-http-client takes its proxy per client, and
/// whether a request goes through one depends on the collector URL (its scheme, `NO_PROXY`), which
/// the app's settings may change while the agent runs. Made when first needed.
package final class HTTPClients: Sendable {
    private let make: @Sendable (ProxySettings.Proxy?) -> HTTPClient
    private let proxies: ProxySettings
    private let clients = Mutex<[ProxySettings.Proxy?: HTTPClient]>([:])

    /// Clients for `configuration`: its request timeout, TLS and proxies.
    package init(_ configuration: UploadConfiguration) {
        let (timeout, tls) = (configuration.requestTimeout, configuration.loadedTLS ?? TLSSettings.systemDefault)
        make = { proxy in HTTPClientFactory.make(readTimeout: timeout, tls: tls.configuration, proxy: proxy) }
        proxies = configuration.proxy
    }

    /// Always `client`, whatever the URL (tests that make their own client).
    package init(fixed client: HTTPClient) {
        make = { _ in client }
        proxies = ProxySettings()
    }

    /// The client for requests to `serverURL`.
    package func client(for serverURL: String) -> HTTPClient {
        let proxy = proxies.proxy(for: serverURL)
        return clients.withLock { clients in
            if let client = clients[proxy] { return client }
            let client = make(proxy)
            clients[proxy] = client
            return client
        }
    }

    /// Every client made so far (to shut them down).
    package var all: [HTTPClient] { clients.withLock { Array($0.values) } }
}
