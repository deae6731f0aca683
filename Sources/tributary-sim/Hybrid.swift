import ArgumentParser
import Foundation
import Logging
import Tributary
import TributaryBridge
import TributaryStore

/// A hybrid page in a real headless browser, its events handed to the app through the bridge.
struct Hybrid: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "A hybrid (H5) page in headless Chromium whose JavaScript SDK hands its events to the app.",
        discussion: """
            Serves test pages from loopback (two origins: 127.0.0.1 and localhost on one port, both \
            whitelisted; localhost on a second port, foreign), opens the main page in headless Chromium \
            and records what the pages post through the bridge (producer kind hybrid). The main page \
            and a whitelisted cross-site iframe each track --events events. With --scenario all the \
            pages also send malformed messages, a forged distinct_id and a claimed login, a \
            track_signup, profile operations (a profile_set_once, a profile_increment, and one whose \
            value is not a number), events from a foreign iframe (and a legacy navigation it makes a whitelisted \
            child frame do) and from a page of another project, and legacy channel events. Prints \
            'BRIDGE <json>' (accepted and rejected counts by reason) at the end.

            With --url it opens that page instead, as an app opens its H5 page: the page's own origin \
            is whitelisted unless --allow-origin names the origins to trust (repeatable), and the page \
            may send for --server-url and each --allow-server-url. It records what the page sends for \
            --duration seconds (default 10), then prints the BRIDGE line and, on stderr, the counts by \
            reason.
            """)

    @OptionGroup var options: ProducerOptions

    @Option(
        name: .customLong("server-url"), help: "The app's server URL; its host and project are what pages must name.")
    var serverURL = "https://sa.example.com/sa?project=tributary"

    @Option(help: "pages (main page and whitelisted iframe) or all (also every kind of message the bridge refuses).")
    var scenario = "pages"

    @Option(parsing: .unconditional, help: "Give up when the pages have not reported within this many seconds.")
    var timeout: Double = 60

    @Option(help: ArgumentHelp("Open this page (http or https) instead of serving the test pages.", valueName: "url"))
    var url: String?

    @Option(
        name: .customLong("allow-origin"),
        help: ArgumentHelp("With --url: an origin whose frames may post (repeatable; default: the page's own).", valueName: "origin"))
    var allowedOrigins: [String] = []

    @Option(
        name: .customLong("allow-server-url"),
        help: ArgumentHelp("Another server URL pages may send for besides --server-url (repeatable).", valueName: "url"))
    var allowedServerURLs: [String] = []

    @Option(parsing: .unconditional, help: "With --url: how many seconds to keep the page open and record what it sends.")
    var duration: Double?

    func validate() throws {
        guard ["pages", "all"].contains(scenario) else {
            throw ValidationError("--scenario must be pages or all, not '\(scenario)'.")
        }
        guard ServerProject(url: serverURL) != nil else {
            throw ValidationError(
                "--server-url must be an absolute URL with a host, like https://host/sa?project=name.")
        }
        guard timeout > 0, timeout <= 86_400 else {  // NaN and inf fail too
            throw ValidationError("--timeout must be more than 0 and at most a day of seconds; got \(timeout).")
        }
        for allowed in allowedServerURLs where ServerProject(url: allowed) == nil {
            throw ValidationError("--allow-server-url \(allowed) must be an absolute URL with a host.")
        }
        try validateURLMode()
    }

    func run() async throws {
        if let url {
            try await runPage(url)
            return
        }
        var logger = Logger(label: "tributary.sim.hybrid")
        logger.logLevel = .error
        let pages = PageServer()
        let foreignPages = PageServer()
        let (ports, portsContinuation) = AsyncStream.makeStream(of: Int.self)
        try await withThrowingTaskGroup(of: Void.self) { tasks in
            // A server that fails to start ends the stream, so the wait below ends too (a failed child task
            // does not cancel the group's body).
            for server in [pages, foreignPages] {
                tasks.addTask {
                    do {
                        try await server.run { portsContinuation.yield($0) }
                    } catch {
                        portsContinuation.finish()
                        throw error
                    }
                }
            }
            var iterator = ports.makeAsyncIterator()
            guard let trusted = await iterator.next(), let foreign = await iterator.next() else {
                throw runFailure("The page servers did not start.")
            }
            // The browser is spawned before the store is opened: no child inherits an open LMDB environment.
            var configuration = BridgeConfiguration(
                serverURL: serverURL, allowedOrigins: ["http://127.0.0.1:\(trusted)", "http://localhost:\(trusted)"])
            configuration.allowedServerURLs = allowedServerURLs
            let (host, bridge) = try startBridge(configuration, logger: logger)
            defer { host.close() }
            tasks.addTask { await host.run(bridge: bridge) }

            let roles =
                scenario == "all"
                ? ["main", "iframe", "foreign", "hijacker", "other-project", "legacy"] : ["main", "iframe"]
            do {
                try await host.open(
                    mainPageURL(trusted: trusted, foreign: foreign, maxBytes: configuration.maxMessageBytes))
            } catch {
                throw Self.browserFailure(error)
            }
            let counts = try await waitForPages(roles: roles, servers: [pages, foreignPages], bridge: bridge)
            FileHandle.standardOutput.write(Data("BRIDGE \(Self.summary(counts))\n".utf8))
            host.close()
            tasks.cancelAll()
        }
    }

    private func mainPageURL(trusted: Int, foreign: Int, maxBytes: Int) -> String {
        func page(_ origin: String, _ role: String, events: Int, extra: String = "") -> String {
            var query = "role=\(role)&events=\(events)&rate=\(options.rate)&seed=\(options.seed)&max=\(maxBytes)"
            query += "&scenario=\(scenario)&server=\(Self.encoded(serverURL))" + extra
            return "\(origin)/page.html?\(query)"
        }
        var frames = [page("http://localhost:\(trusted)", "iframe", events: options.events)]
        if scenario == "all" {
            let otherProject = serverURL.replacingOccurrences(of: "project=", with: "project=other-")
            frames += [
                page("http://localhost:\(foreign)", "foreign", events: 2),
                page(
                    "http://localhost:\(foreign)", "hijacker", events: 0,
                    extra: "&child=\(Self.encoded(page("http://127.0.0.1:\(trusted)", "idle", events: 0)))"),
                page("http://127.0.0.1:\(trusted)", "other-project", events: 2).replacingOccurrences(
                    of: "server=\(Self.encoded(serverURL))", with: "server=\(Self.encoded(otherProject + "&x=1"))"),
                page("http://localhost:\(trusted)", "legacy", events: 2),
            ]
        }
        return page(
            "http://127.0.0.1:\(trusted)", "main", events: options.events,
            extra: "&frames=\(Self.encoded(frames.joined(separator: " ")))")
    }

    /// Starts the browser, then opens the store and makes the bridge that records into it (every accepted
    /// record appended to the ledger once durable); prints `READY <pid>`. The browser is spawned before the
    /// store is opened: no child inherits an open LMDB environment.
    func startBridge(_ configuration: BridgeConfiguration, logger: Logger) throws -> (WebViewHost, HybridBridge) {
        let host: WebViewHost
        do {
            host = try WebViewHost(configuration: configuration, logger: logger)
        } catch {
            throw Self.browserFailure(error)
        }
        do {
            let tracker = try options.openTracker(kind: .hybrid)
            do {
                try tracker.registerSuperProperties(["app_channel": "tributary-sim"])
            } catch {
                throw producerFailure(error)
            }
            let ledger = try Ledger(path: options.ledger)
            let bridge = HybridBridge(tracker: tracker, configuration: configuration, logger: logger) { receipt in
                ledger.record(receipt)
            }
            FileHandle.standardOutput.write(Data("READY \(getpid())\n".utf8))
            return (host, bridge)
        } catch {
            host.close()
            throw error
        }
    }

    /// Waits until every frame reported and the bridge has handled as many messages as they posted:
    /// finished handling them (`handled`), the last accepted one committed, not merely received.
    private func waitForPages(roles: [String], servers: [PageServer], bridge: HybridBridge) async throws
        -> HybridBridge.Counts
    {
        let deadline = ContinuousClock.now + .seconds(timeout)
        while ContinuousClock.now < deadline {
            let reported = servers.reduce(into: [String: Int]()) { $0.merge($1.reported) { a, _ in a } }
            let counts = bridge.snapshot
            if roles.allSatisfy({ reported[$0] != nil }),
                counts.handled >= reported.values.reduce(0, +)
            {
                return counts
            }
            try await Task.sleep(for: .milliseconds(20))
        }
        let reported = servers.flatMap { $0.reported.keys }.sorted()
        FileHandle.standardError.write(
            Data(
                "tributary-sim: pages did not finish within \(timeout) s (reported: \(reported), expected: \(roles))\n"
                    .utf8))
        throw ExitCode(75)
    }

    /// Exit 69 (EX_UNAVAILABLE) with the reason on stderr: the browser could not be started, or did
    /// not answer (`TRIBUTARY_CHROMIUM` names another binary).
    static func browserFailure(_ error: any Error) -> ExitCode {
        runFailure("The headless browser is not available: \(error)", exitCode: 69)
    }

    static func encoded(_ s: String) -> String {
        s.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? s
    }

    static func summary(_ counts: HybridBridge.Counts) -> String {
        var rejected: [String: JSON] = [:]
        for (reason, n) in counts.rejected { rejected[reason.rawValue] = .number(Double(n)) }
        return JSON.object(["accepted": .number(Double(counts.accepted)), "rejected": .object(rejected)]).text
    }
}
