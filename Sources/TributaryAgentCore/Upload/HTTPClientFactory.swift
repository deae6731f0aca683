import AsyncHTTPClient

/// Creates the agent's HTTP client: connect timeout 5 s, no redirects (a redirected POST could
/// silently go somewhere else), the system trust store for `https://`.
package enum HTTPClientFactory {
    package static func make(readTimeout: Duration = .seconds(30)) -> HTTPClient {
        var configuration = HTTPClient.Configuration()
        configuration.timeout = .init(connect: .seconds(5), read: .init(readTimeout))
        configuration.redirectConfiguration = .disallow
        return HTTPClient(eventLoopGroupProvider: .singleton, configuration: configuration)
    }
}
