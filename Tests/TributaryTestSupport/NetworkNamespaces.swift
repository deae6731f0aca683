import Foundation
import Synchronization

/// Two network namespaces made for one test, an agent's and a collector's, joined by a veth pair
/// (`10.231.0.1` and `10.231.0.2`, addresses that exist only inside them), with the tools that put
/// faults in the link between them: nftables rules (drops, resets, random loss) and `tc` qdiscs (`tbf`
/// rate limits). `ip netns exec` gives the agent's namespace its own `/etc/hosts` and `/etc/resolv.conf`
/// (from `/etc/netns/<name>/`), which the test rewrites to make a host name resolve.
///
/// Needs root, `ip` (iproute2) and `nft` (nftables); ``unavailable()`` says why not. Make them with
/// ``with(_:)``, which removes both namespaces and their `/etc/netns` directories whatever happens
/// (first killing any process left inside), and removes those a killed test run left behind.
public final class NetworkNamespaces: Sendable {
    /// The agent's namespace.
    public let agent: String
    /// The collector's namespace.
    public let collector: String
    /// The agent's address, on its end of the veth pair.
    public let agentAddress = "10.231.0.1"
    /// The collector's address, on its end of the veth pair.
    public let collectorAddress = "10.231.0.2"
    /// The agent's end of the veth pair (inside its namespace).
    public let agentInterface = "trib-a0"
    /// The name the agent's `/etc/hosts` maps to ``collectorAddress`` once ``resolve(_:)`` is called.
    public static let collectorName = "collector.tributary.test"

    /// Where Debian installs the tools.
    public static let ip = ["/usr/sbin/ip", "/usr/bin/ip", "/sbin/ip", "/bin/ip"].first {
        FileManager.default.isExecutableFile(atPath: $0)
    }
    public static let nft = ["/usr/sbin/nft", "/sbin/nft"].first { FileManager.default.isExecutableFile(atPath: $0) }
    public static let tc = ["/usr/sbin/tc", "/sbin/tc"].first { FileManager.default.isExecutableFile(atPath: $0) }

    /// The prefix of every namespace these tests make, followed by the test process's pid.
    static let prefix = "trib-"
    private static let counter = Mutex(0)

    /// Why namespaces cannot be made here (not root, a tool missing, `ip netns add` refused), or nil.
    public static func unavailable() async -> String? {
        guard geteuid() == 0 else { return "not root: ip netns needs CAP_SYS_ADMIN (CI runs as root)" }
        guard ip != nil else { return "ip (iproute2) not installed (make deps)" }
        guard nft != nil else { return "nft (nftables) not installed (make deps)" }
        guard tc != nil else { return "tc (iproute2) not installed (make deps)" }
        let probe = "\(prefix)\(getpid())-probe"
        let added = await run(ip!, ["netns", "add", probe])
        guard added.status == 0 else { return "ip netns add failed: \(added.stderr.prefix(120))" }
        _ = await run(ip!, ["netns", "del", probe])
        return nil
    }

    /// Makes both namespaces, runs `body`, and removes them, also when `body` throws.
    public static func with<T: Sendable>(_ body: (NetworkNamespaces) async throws -> T) async throws -> T {
        await removeLeftovers()
        let net = NetworkNamespaces()
        do {
            try await net.create()
            let result = try await body(net)
            await net.remove()
            return result
        } catch {
            await net.remove()
            throw error
        }
    }

    private init() {
        let n = Self.counter.withLock { count in
            count += 1
            return count
        }
        agent = "\(Self.prefix)\(getpid())-\(n)a"
        collector = "\(Self.prefix)\(getpid())-\(n)c"
    }

    private func create() async throws {
        try FileManager.default.createDirectory(atPath: etc(agent), withIntermediateDirectories: true)
        try write("127.0.0.1 localhost\n::1 localhost ip6-localhost\n", to: etc(agent) + "/hosts")
        // Nothing listens there: a lookup the hosts file does not answer fails at once, inside the namespace.
        try write("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n", to: etc(agent) + "/resolv.conf")
        let peer = "trib-c0"
        for arguments in [
            ["netns", "add", agent], ["netns", "add", collector],
            ["link", "add", agentInterface, "netns", agent, "type", "veth", "peer", "name", peer, "netns", collector],
            ["-n", agent, "addr", "add", agentAddress + "/24", "dev", agentInterface],
            ["-n", collector, "addr", "add", collectorAddress + "/24", "dev", peer],
            ["-n", agent, "link", "set", agentInterface, "up"], ["-n", collector, "link", "set", peer, "up"],
            ["-n", agent, "link", "set", "lo", "up"], ["-n", collector, "link", "set", "lo", "up"],
        ] {
            try await Self.check(Self.ip!, arguments)
        }
    }

    /// Kills what still runs inside the namespaces and deletes them (the veth pair goes with them).
    func remove() async {
        for namespace in [agent, collector] {
            await Self.delete(namespace)
        }
    }

    private static func delete(_ namespace: String) async {
        guard let ip else { return }
        let pids = await run(ip, ["netns", "pids", namespace])
        for pid in pids.stdout.split(whereSeparator: \.isNewline).compactMap({ Int32($0) }) {
            kill(pid, SIGKILL)
        }
        _ = await run(ip, ["netns", "del", namespace])
        try? FileManager.default.removeItem(atPath: "/etc/netns/" + namespace)
        // Only if empty: /etc/netns may hold other programs' namespaces.
        _ = rmdir("/etc/netns")
    }

    /// Deletes namespaces of these tests whose test process is gone (a run killed before its cleanup).
    static func removeLeftovers() async {
        guard let ip else { return }
        let list = await run(ip, ["netns", "list"])
        for line in list.stdout.split(whereSeparator: \.isNewline) {
            let name = String(line.split(separator: " ").first ?? "")
            guard name.hasPrefix(prefix), let pid = Int32(name.dropFirst(prefix.count).prefix { $0.isNumber }),
                pid != getpid(), kill(pid, 0) != 0, errno == ESRCH
            else { continue }
            await delete(name)
        }
    }

    // MARK: Processes and faults

    /// Starts `executable` (one of this package's) inside `namespace`: `ip netns exec NAME PATH ARGS`,
    /// which `exec`s it, so the child is the program itself.
    public func start(
        _ executable: String, in namespace: String, _ arguments: [String], environment: [String: String] = [:]
    ) throws -> ChildProcess {
        let path = productsDirectory.appendingPathComponent(executable).path
        return try ChildProcess(path: Self.ip!, ["netns", "exec", namespace, path] + arguments, environment: environment)
    }

    /// Loads an nftables ruleset (`nft -f -`) into `namespace`.
    public func nft(_ namespace: String, _ ruleset: String) async throws {
        let file = NSTemporaryDirectory() + "/\(namespace)-\(UUID().uuidString.prefix(8)).nft"
        try write(ruleset, to: file)
        defer { try? FileManager.default.removeItem(atPath: file) }
        try await Self.check(Self.ip!, ["netns", "exec", namespace, Self.nft!, "-f", file])
    }

    /// `nft list ruleset` in `namespace` (with its counters).
    public func ruleset(_ namespace: String) async throws -> String {
        try await Self.check(Self.ip!, ["netns", "exec", namespace, Self.nft!, "list", "ruleset"])
    }

    /// Runs `tc ARGS` in `namespace` and returns its output.
    @discardableResult
    public func tc(_ namespace: String, _ arguments: [String]) async throws -> String {
        try await Self.check(Self.ip!, ["netns", "exec", namespace, Self.tc!] + arguments)
    }

    /// Makes ``collectorName`` resolve to the collector in the agent's namespace, from its next lookup
    /// on: the hosts file is rewritten in place (`ip netns exec` bind-mounted that very file).
    public func resolve(_ name: String = collectorName) throws {
        guard let handle = FileHandle(forWritingAtPath: etc(agent) + "/hosts") else { throw POSIXError(.ENOENT) }
        defer { try? handle.close() }
        try handle.seekToEnd()
        try handle.write(contentsOf: Data("\(collectorAddress) \(name)\n".utf8))
    }

    private func etc(_ namespace: String) -> String { "/etc/netns/" + namespace }

    private func write(_ text: String, to path: String) throws {
        try Data(text.utf8).write(to: URL(fileURLWithPath: path))
    }

    /// A command that failed.
    public struct CommandFailed: Error, CustomStringConvertible {
        public var command: [String]
        public var status: Int32
        public var stderr: String
        public var description: String { "\(command.joined(separator: " ")): exit \(status): \(stderr)" }
    }

    @discardableResult
    static func check(_ path: String, _ arguments: [String]) async throws -> String {
        let result = await run(path, arguments)
        guard result.status == 0 else { throw CommandFailed(command: [path] + arguments, status: result.status, stderr: result.stderr) }
        return result.stdout
    }

    static func run(_ path: String, _ arguments: [String]) async -> (status: Int32, stdout: String, stderr: String) {
        guard let process = try? ChildProcess(path: path, arguments) else { return (127, "", "cannot start \(path)") }
        return await process.finish()
    }
}
