import Foundation

/// A real HTTP proxy, Debian's tinyproxy (`make deps` installs `tinyproxy-bin`), on a free loopback
/// port, logging every request and `CONNECT` to a file the test reads.
public final class Tinyproxy: Sendable {
    /// Where Debian installs it.
    public static let path = "/usr/bin/tinyproxy"
    /// The port it listens on (127.0.0.1).
    public let port: Int
    /// Its URL, as `--proxy` and `HTTPS_PROXY` take it.
    public var url: String { "http://127.0.0.1:\(port)" }
    private let process: ChildProcess
    private let logFile: String

    /// Starts tinyproxy with its files in `directory`, and waits until it accepts connections.
    public init(directory: String) async throws {
        port = try freeLoopbackPort()
        logFile = directory + "/tinyproxy.log"
        let config = directory + "/tinyproxy.conf"
        let user = getuid() == 0 ? "User nobody\nGroup nogroup\n" : ""
        try Data(
            """
            \(user)Port \(port)
            Listen 127.0.0.1
            Timeout 30
            MaxClients 20
            Allow 127.0.0.1
            LogFile "\(logFile)"
            LogLevel Info
            DisableViaHeader Yes

            """.utf8
        ).write(to: URL(fileURLWithPath: config))
        // Written by the proxy as the user it drops to.
        _ = FileManager.default.createFile(atPath: logFile, contents: nil, attributes: [.posixPermissions: 0o666])
        process = try ChildProcess(path: Self.path, ["-d", "-c", config])
        for _ in 0..<100 {
            if Self.accepts(port) { return }
            try await Task.sleep(for: .milliseconds(50))
        }
        process.send(SIGKILL)
        _ = await process.finish()
        throw ProxyNotStarted(log: (try? String(contentsOfFile: logFile, encoding: .utf8)) ?? "")
    }

    /// What it logged so far.
    public func log() -> String { (try? String(contentsOfFile: logFile, encoding: .utf8)) ?? "" }

    /// Stops it (SIGKILL: a proxy that drops every connection at once).
    public func stop() async {
        process.send(SIGKILL)
        _ = await process.finish()
    }

    /// tinyproxy did not listen within 5 s.
    public struct ProxyNotStarted: Error, CustomStringConvertible {
        public var log: String
        public var description: String { "tinyproxy did not start: \(log)" }
    }

    /// Whether something accepts TCP connections on 127.0.0.1:`port`.
    static func accepts(_ port: Int) -> Bool {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = UInt16(port).bigEndian
        return withUnsafePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0
            }
        }
    }
}
