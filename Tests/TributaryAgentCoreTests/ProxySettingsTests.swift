import Testing

@testable import TributaryAgentCore

/// Which proxy a collector URL goes through: the scheme's variable, `--proxy`, and `NO_PROXY`.
@Suite("Proxy settings")
struct ProxySettingsTests {
    @Test("the environment: https_proxy for https, http_proxy for http, lower case first, empty is unset")
    func environment() {
        let proxies = ProxySettings(environment: [
            "https_proxy": "http://secure:3128", "HTTPS_PROXY": "http://ignored:1", "HTTP_PROXY": "plain:8080",
            "no_proxy": "",
        ])
        #expect(proxies.proxy(for: "https://collector.example/sa")?.host == "secure")
        #expect(proxies.proxy(for: "https://collector.example/sa")?.port == 3128)
        #expect(proxies.proxy(for: "http://collector.example/sa")?.host == "plain")
        #expect(proxies.proxy(for: "http://collector.example/sa")?.port == 8080)
        #expect(proxies.noProxy == nil)
        #expect(ProxySettings(environment: [:]).proxy(for: "https://collector.example") == nil)
        // An empty lower-case variable leaves the upper-case one in force.
        #expect(ProxySettings(environment: ["https_proxy": "", "HTTPS_PROXY": "proxy:1"]).https == "proxy:1")
    }

    @Test(
        "NO_PROXY: hosts, domains, ports, IP addresses and *",
        arguments: [
            ("collector.example", "https://collector.example/sa", true),
            ("example", "https://collector.example/sa", true),
            (".example", "https://collector.example/sa", true),
            ("*.example", "https://collector.example/sa", true),
            ("other.example", "https://collector.example/sa", false),
            ("lector.example", "https://collector.example/sa", false),
            ("collector.example:443", "https://collector.example/sa", true),
            ("collector.example:8443", "https://collector.example/sa", false),
            ("127.0.0.1", "http://127.0.0.1:9000/sa", true),
            ("[::1]:9000", "http://[::1]:9000/sa", true),
            ("::1", "http://[::1]:9000/sa", true),
            ("a.example, *", "https://collector.example/sa", true),
            (" a.example , collector.example ", "https://collector.example/sa", true),
        ])
    func noProxy(_ noProxy: String, _ url: String, _ direct: Bool) {
        let proxies = ProxySettings(proxy: "http://proxy:3128", noProxy: noProxy)
        #expect((proxies.proxy(for: url) == nil) == direct)
    }

    @Test("a proxy URL: http only, credentials, a bare host:port; others are a configuration error")
    func parse() throws {
        let proxy = try #require(ProxySettings.parse("http://user:p%40ss@proxy.internal:3128"))
        #expect(proxy.host == "proxy.internal" && proxy.port == 3128)
        #expect(proxy.credentials?.user == "user" && proxy.credentials?.password == "p@ss")
        #expect(ProxySettings.parse("proxy:8080")?.port == 8080)
        #expect(ProxySettings.parse("http://proxy")?.port == 80)
        for bad in ["https://proxy:443", "socks5://proxy:1080", "http://", "http://proxy:0", "http://proxy:70000"] {
            #expect(ProxySettings.parse(bad) == nil, "\(bad)")
            #expect(throws: AgentError.self) { try ProxySettings(proxy: bad, noProxy: nil).validate() }
        }
    }
}
