import ArgumentParser
import Foundation
import TributaryAgentCore
import TributaryStore

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// The demo behind `make run`: the whole pipeline with real processes on loopback.
struct Demo: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Run the pipeline end to end: collector, agent and producer processes; print a summary.",
        discussion: """
            Starts tributary-collector on a free loopback port, tributary-agent on a fresh group directory, \
            then, concurrently, a main app (group commit), two extensions, a hybrid page in headless \
            Chromium (its events and profile operations through the bridge) and an autotracked app \
            session (lifecycle, page views, clicks) that crashes, and its restart that reports the crash; \
            waits until the collector holds every event, prints a table (with the events by producer kind \
            and type), and stops everything it started.
            """)

    @Option(help: ArgumentHelp("Group directory to create (removed first).", valueName: "dir"))
    var group: String = ".run/group"

    @Option(name: .customLong("app-events"), parsing: .unconditional, help: "Events from the main app.")
    var appEvents = 20_000

    @Option(name: .customLong("extension-events"), parsing: .unconditional, help: "Events from each of the two extensions.")
    var extensionEvents = 2_000

    @Option(name: .customLong("hybrid-events"), parsing: .unconditional, help: "Events from each frame of the hybrid page (0: no hybrid page).")
    var hybridEvents = 20

    @Option(name: .customLong("session-events"), parsing: .unconditional, help: "Events of the autotracked app session before it crashes (0: no session).")
    var sessionEvents = 40

    @Option(help: "Wire format: sensors or ndjson.")
    var format = "sensors"

    @Option(parsing: .unconditional, help: "Give up waiting for delivery after this many seconds.")
    var timeout: Double = 120

    func validate() throws {
        guard ["sensors", "ndjson"].contains(format) else {
            throw ValidationError("--format must be sensors or ndjson, not '\(format)'.")
        }
        guard appEvents >= 0, extensionEvents >= 0, hybridEvents >= 0, sessionEvents >= 0 else {
            throw ValidationError("--app-events, --extension-events, --hybrid-events and --session-events must not be negative.")
        }
        guard timeout > 0, timeout <= 86_400 else {  // NaN and inf fail too
            throw ValidationError("--timeout must be more than 0 and at most a day of seconds; got \(timeout).")
        }
        guard !group.isEmpty else { throw ValidationError("--group must name a directory.") }
        // The demo removes both directories first: only ones that hold nothing but what a demo puts there.
        let groupEntries = try Self.checkRemovable(group, keeping: Self.groupFiles)
        try Self.checkRemovable(group + "-state", keeping: Self.stateFiles)
        try Self.checkNoUndelivered(group, entries: groupEntries)
        try Self.checkOutboxDelivered(group, entries: groupEntries)
    }

    /// Throws if `<group>-state/outbox.sqlite` holds events not yet sent, or dead letters, and no demo made
    /// the group: an agent may have been given that outbox. Read through a read-only connection.
    static func checkOutboxDelivered(_ group: String, entries: [String]) throws {
        let outbox = group + "-state/outbox.sqlite"
        guard !entries.contains(marker), FileManager.default.fileExists(atPath: outbox) else { return }
        let held: Int
        do {
            let box = try Outbox(readingAt: outbox)
            held = try box.pending().count + box.deadLetterCount()
        } catch {
            throw ValidationError("\(outbox) cannot be read (\(error)); the demo removes it first, so give --group a new path.")
        }
        guard held == 0 else {
            throw ValidationError(
                "\(outbox) holds \(held) events not yet delivered (or dead letters), which no demo made; the demo removes "
                    + "it first, so give --group a new path (or remove \(group)-state yourself).")
        }
    }

    /// The file a demo leaves in the group it made, so that the next demo knows the group for its own.
    static let marker = ".tributary-demo"

    /// What a demo's group directory holds: its marker, the store and the agent's files.
    static let groupFiles: Set<String> = [
        marker, SharedStore.fileName, SharedStore.fileName + "-lock",
        AgentChannel.lockFile, AgentChannel.socketFile, AgentChannel.statusFile,
        // The autotracked session's crash file (TributaryAutoTrack CrashLog), and the one it reports from.
        "crash-\(sessionProducer).records", "crash-\(sessionProducer).records.pending",
    ]

    /// The producer id of the autotracked app session.
    static let sessionProducer = "app-session"

    /// Throws if the store in `group` holds events not yet delivered and no demo made the group: an app's
    /// real group has the same file names as a demo's. (A group of an earlier demo, made before the
    /// marker, has delivered everything unless that demo failed.)
    /// `entries`: the group directory's names, as ``checkRemovable(_:keeping:)`` listed them.
    static func checkNoUndelivered(_ group: String, entries: [String]) throws {
        guard !entries.contains(marker), entries.contains(SharedStore.fileName) else { return }
        var options = SharedStore.Options()
        options.create = false
        // Closed again before any process is spawned (the store is released with the value).
        let pending: Int
        do {
            pending = try SharedStore(groupDirectory: group, options: options).status().pendingEvents
        } catch {
            throw producerFailure(error)  // the store's own exit status (74 unreadable, 77 permission, …)
        }
        guard pending == 0 else {
            throw ValidationError(
                "\(group) holds a Tributary store with \(pending) events not yet delivered, which no demo made; the "
                    + "demo removes its group first, so give --group a new path (or remove \(group) yourself).")
        }
    }

    /// What the demo's `-state` directory next to it holds: the outbox, its SQLite files and lock.
    static let stateFiles: Set<String> = ["outbox.sqlite", "outbox.sqlite-wal", "outbox.sqlite-shm", "outbox.sqlite-journal", "outbox.sqlite.lock"]

    /// Throws unless `path` is missing, or a directory holding only names in `expected`; returns its
    /// names (none when it is missing).
    @discardableResult
    static func checkRemovable(_ path: String, keeping expected: Set<String>) throws -> [String] {
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory) else { return [] }
        let entries = isDirectory.boolValue ? try? FileManager.default.contentsOfDirectory(atPath: path) : nil
        guard let entries else {
            throw ValidationError("\(path) is not a directory the demo may remove and create anew; give --group a new path.")
        }
        if let other = entries.sorted().first(where: { !expected.contains($0) }) {
            throw ValidationError(
                "\(path) holds \(other), which no demo put there; the demo removes its directories first, so give --group a new path (or remove \(path) yourself).")
        }
        return entries
    }

    func run() async throws {
        // The other tools are this one's siblings, wherever it was started from (PATH, a relative path).
        let bin = URL(fileURLWithPath: parentDirectory(of: resolvedPath("/proc/self/exe") ?? CommandLine.arguments[0]))
        try? FileManager.default.removeItem(atPath: group)
        try? FileManager.default.removeItem(atPath: group + "-state")
        // Made here, owner and group only (as a producer makes it), with the demo's marker in it.
        do {
            try FileManager.default.createDirectory(
                atPath: group, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o2770])
            try Data("made by tributary-sim demo; the next demo removes it\n".utf8).write(
                to: URL(fileURLWithPath: group + "/" + Self.marker))
        } catch {
            throw runFailure("Cannot create the group directory \(group): \(error.localizedDescription)")
        }
        var started: [Process] = []
        defer {
            for process in started where process.isRunning {
                process.terminate()
                process.waitUntilExit()
            }
        }

        say("== starting tributary-collector on a free loopback port")
        let (collector, collectorOut) = try launch(bin, "tributary-collector", ["--port", "0"], capture: true)
        started.append(collector)
        guard let line = readLine(collectorOut, prefix: "LISTENING "), let url = line.split(separator: " ").last else {
            throw runFailure("tributary-collector did not report its address.")
        }
        say("   \(url)")

        let ledgers = FileManager.default.temporaryDirectory.appendingPathComponent("tributary-demo-\(getpid())").path
        try? FileManager.default.createDirectory(atPath: ledgers, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: ledgers) }
        // Intervals on the monotonic clock: a wall clock stepped meanwhile (NTP) neither ends the wait early
        // nor stretches the rate.
        let clock = ContinuousClock()
        let begin = clock.now
        say("== producers: app (\(appEvents), group commit), share-extension and widget (\(extensionEvents) each)")
        let producers = [
            try launch(bin, "tributary-sim", ["load", "--group", group, "--producer-id", "app", "--count", "\(appEvents)",
                                              "--concurrency", "16"]).0,
            try launch(bin, "tributary-sim", ["load", "--kind", "extension", "--group", group, "--producer-id", "share-extension",
                                              "--count", "\(extensionEvents)"]).0,
            try launch(bin, "tributary-sim", ["load", "--kind", "extension", "--group", group, "--producer-id", "widget",
                                              "--count", "\(extensionEvents)", "--event", "WidgetRefresh"]).0,
        ]
        started += producers
        let hybridLedger = ledgers + "/hybrid", sessionLedger = ledgers + "/session"
        var hybrid: (process: Process, output: FileHandle?)?
        if hybridEvents > 0 {
            say("== hybrid page in headless Chromium (\(hybridEvents) events a frame, its profile operations, refusals)")
            hybrid = try launch(bin, "tributary-sim", [
                "hybrid", "--group", group, "--events", "\(hybridEvents)", "--scenario", "all", "--ledger", hybridLedger,
            ], capture: true)
            started.append(hybrid!.process)
        }
        if sessionEvents > 0 {
            say("== autotracked app session (\(sessionEvents) events, then a crash; the restart reports it)")
        }
        let session = sessionEvents > 0 ? try launch(bin, "tributary-sim", [
            "app", "--group", group, "--producer-id", Self.sessionProducer, "--events", "\(2 * sessionEvents)",
            "--crash-after", "\(sessionEvents)", "--crash-kind", "fatal", "--ledger", sessionLedger,
        ], quiet: true).0 : nil
        if let session { started.append(session) }

        say("== tributary-agent --group \(group) --server \(url)/sa --format \(format)")
        let (agent, _) = try launch(bin, "tributary-agent", [
            "--group", group, "--server", "\(url)/sa", "--format", format, "--outbox", group + "-state/outbox.sqlite",
            "--flush-interval", "1", "--log-level", "warning",
        ])
        started.append(agent)

        for producer in producers {
            producer.waitUntilExit()
            guard producer.terminationStatus == 0 else { throw runFailure("A producer failed (exit \(producer.terminationStatus)).") }
        }
        if let session {
            session.waitUntilExit()
            guard session.terminationReason == .uncaughtSignal else {
                throw runFailure("The app session did not crash (exit \(session.terminationStatus)).")
            }
            let restart = try launch(bin, "tributary-sim", [
                "app", "--group", group, "--producer-id", Self.sessionProducer, "--events", "\(sessionEvents / 2 + 1)",
                "--ledger", sessionLedger,
            ]).0
            started.append(restart)
            restart.waitUntilExit()
            guard restart.terminationStatus == 0 else { throw runFailure("The app's restart failed (exit \(restart.terminationStatus)).") }
        }
        var bridgeLine = ""
        if let hybrid {
            hybrid.process.waitUntilExit()
            guard hybrid.process.terminationStatus == 0 else {
                throw runFailure("The hybrid page failed (exit \(hybrid.process.terminationStatus)); its reason is above.")
            }
            bridgeLine = readLine(hybrid.output, prefix: "BRIDGE ") ?? ""
        }
        let produced = appEvents + 2 * extensionEvents + Self.lines(hybridLedger) + Self.lines(sessionLedger)
        let producedAfter = String(format: "%.2f", (clock.now - begin) / .seconds(1))
        say("   \(produced) events durable in the store after \(producedAfter) s")
        let (flush, _) = try launch(bin, "tributary", ["flush", "--group", group])
        started.append(flush)
        flush.waitUntilExit()

        var stats: [String: Any] = [:]
        while clock.now - begin < .seconds(timeout) {
            stats = try await fetchStats(String(url))
            if (stats["unique"] as? Int ?? 0) >= produced { break }
            guard agent.isRunning else {
                throw runFailure("tributary-agent exited (status \(agent.terminationStatus)) before delivering everything; its log is above.")
            }
            try await Task.sleep(for: .milliseconds(50))
        }
        let elapsed = (clock.now - begin) / .seconds(1)
        let unique = stats["unique"] as? Int ?? 0
        let duplicates = stats["duplicates"] as? Int ?? 0
        let violations = (stats["order_violations"] as? [String: Int] ?? [:]).values.reduce(0, +)
            + (stats["seq_violations"] as? Int ?? 0)

        // Duplicates after dedup, counted from what the collector stored: the same producer event
        // (producer, producer_seq) stored more than once, under different event ids.
        let stored = try await fetchEvents(String(url))
        let keys = stored.compactMap { event -> String? in
            guard let tributary = event["_tributary"] as? [String: Any], let producer = tributary["producer"] as? String,
                let producerSeq = tributary["producer_seq"] as? Int
            else { return nil }
            return "\(producer)#\(producerSeq)"
        }
        let duplicatesAfterDedup = keys.count - Set(keys).count

        agent.terminate()
        agent.waitUntilExit()
        say("")
        say("  produced                     \(produced)")
        say("  delivered (unique)           \(unique)")
        say("  duplicates on the wire       \(duplicates)")
        say("  duplicates after dedup       \(duplicatesAfterDedup)")
        say("  lost                         \(produced - unique)")
        say("  order violations             \(violations)")
        say("  batches                      \(stats["batches"] as? Int ?? 0)")
        say("  end to end                   \(Int(Double(unique) / elapsed)) events/s (\(String(format: "%.2f", elapsed)) s)")
        say("  agent exit status            \(agent.terminationStatus) (SIGTERM)")
        if !bridgeLine.isEmpty { say("  hybrid bridge                \(bridgeLine.dropFirst("BRIDGE ".count))") }
        say("")
        for line in DemoSummary.lines(stored) { say(line) }
        guard unique == produced, violations == 0, duplicatesAfterDedup == 0, keys.count == unique else { throw ExitCode(1) }
    }

    /// The lines of a ledger (none when it is missing: that producer did not run).
    static func lines(_ path: String) -> Int {
        ((try? String(contentsOfFile: path, encoding: .utf8)) ?? "").split(separator: "\n").count
    }

    private func launch(
        _ bin: URL, _ name: String, _ arguments: [String], capture: Bool = false, quiet: Bool = false
    ) throws -> (Process, FileHandle?) {
        let process = Process()
        process.executableURL = bin.appendingPathComponent(name)
        process.arguments = arguments
        if quiet {
            // A process whose crash is the point: no backtracer (about 4 s, and 100 MB), no trace on the screen.
            process.environment = ProcessInfo.processInfo.environment.merging(["SWIFT_BACKTRACE": "enable=no"]) { _, new in new }
            process.standardError = FileHandle.nullDevice
        }
        var handle: FileHandle?
        if capture {
            let pipe = Pipe()
            process.standardOutput = pipe
            handle = pipe.fileHandleForReading
        } else {
            process.standardOutput = FileHandle.nullDevice
        }
        try process.run()
        return (process, handle)
    }

    private func readLine(_ handle: FileHandle?, prefix: String) -> String? {
        guard let handle else { return nil }
        var buffer = Data()
        while true {
            let chunk = handle.availableData
            if chunk.isEmpty { return nil }
            buffer.append(chunk)
            if let line = String(decoding: buffer, as: UTF8.self).split(separator: "\n").first(where: { $0.hasPrefix(prefix) }) {
                return String(line)
            }
        }
    }

    private func fetchStats(_ url: String) async throws -> [String: Any] {
        guard let statsURL = URL(string: url + "/stats") else { return [:] }
        let (data, _) = try await URLSession.shared.data(from: statsURL)
        return (try JSONSerialization.jsonObject(with: data) as? [String: Any]) ?? [:]
    }

    /// Every event the collector stored (`GET /events`, a page at a time).
    private func fetchEvents(_ url: String) async throws -> [[String: Any]] {
        var events: [[String: Any]] = []
        while let pageURL = URL(string: url + "/events?after=\(events.count)&limit=5000") {
            let (data, _) = try await URLSession.shared.data(from: pageURL)
            let page = (try JSONSerialization.jsonObject(with: data) as? [[String: Any]]) ?? []
            if page.isEmpty { break }
            events += page
        }
        return events
    }

    private func say(_ line: String) { FileHandle.standardOutput.write(Data((line + "\n").utf8)) }
}
