import ArgumentParser
import Foundation
import Tributary
import TributaryAgentCore
import TributaryStore
import TributaryErrors
import TributaryExitStatus

@main
struct TributaryCLI: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "tributary",
        abstract: "Record analytics events into an app group's shared store and look inside it.",
        discussion: """
            Every command takes --group DIR, the app group directory that holds the shared store \
            (tributary.mdb). Producers append to it; the sync agent (tributary-agent) drains it.

            Exit codes: 0 success; 64 bad usage; 65 the event, id or setting was rejected, or the stored \
            settings are not valid (nothing written); \
            66 no store in the group directory (for track: no group directory, unless --create); 69 no agent \
            is listening (flush); 74 store or outbox I/O error, corrupt data, or a stdout that cannot be written \
            (stderr says what was done); 75 the store is full (retry once the agent has drained it), was deleted or \
            created anew during the call, or is busy (every reader slot taken and its writer lock held) (retry); \
            verify: 65 the store is damaged; 77 the group directory is unsafe \
            (world-writable), or this user may not use it or the outbox (permission denied: join the group \
            that owns it, or run as its owner). A --group path that is not a directory is bad usage (64).
            """,
        subcommands: [
            Track.self, Profile.self, Status.self, Inspect.self, Flush.self, DeadLetters.self, Login.self, Logout.self, Identify.self,
            Config.self, Verify.self,
        ]
    )

    static func main() {
        // A reader that went away is an EPIPE the output handles (say): ends a listing quietly, and tells
        // a command that changed something what it did. The signal killed it silently (141), after the
        // event was stored.
        signal(SIGPIPE, SIG_IGN)
        StandardDescriptors.takeClosed()
        StoreCheck.walkerMain(Array(CommandLine.arguments.dropFirst()))  // a child walking a store: exits here
        // Swift reads the command line with U+FFFD in place of bytes that are not UTF-8: an id, a
        // property or a name given so would be stored as something else than what was given.
        for index in stride(from: 1, to: Int(CommandLine.argc), by: 1) {  // none when exec'd with an empty argv
            guard let raw = CommandLine.unsafeArgv[index] else { continue }
            let bytes = UnsafeBufferPointer(start: UnsafeRawPointer(raw).assumingMemoryBound(to: UInt8.self), count: strlen(raw))
            guard String(validating: bytes, as: UTF8.self) == nil else { continue }
            warn("argument \(index) is not valid UTF-8 (\(String(decoding: bytes, as: UTF8.self))); nothing was done.")
            Glibc.exit(ExitStatus.dataError.rawValue)
        }
        main(CommandLineArguments.helpFirst(Array(CommandLine.arguments.dropFirst())))
    }
}

struct GroupOption: ParsableArguments {
    @Option(name: .long, help: ArgumentHelp("The app group directory.", valueName: "dir"))
    var group: String

    func validate() throws {
        // An empty path was looked up as it was: "the group directory  vanished after it was created" (66).
        guard !group.isEmpty else { throw ValidationError("--group must name the app group directory; it is empty.") }
    }
}

struct Track: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Record one event; prints its event id once it is durably stored.",
        discussion: """
            The group directory must exist (exit 66 otherwise): a mistyped --group would make a new group \
            and a store no agent drains. --create makes a missing one (mode 2770), as an app's first run does. \
            An existing directory without a store gets one.
            """)

    @OptionGroup var options: GroupOption

    @Flag(help: "Create the group directory when it does not exist (an app's first run); without it, a missing one is exit 66.")
    var create = false

    @Argument(help: "The event name, e.g. BuyProduct (Sensors rules: ^[a-zA-Z_$][a-zA-Z0-9_$]{0,99}$).")
    var name: String

    @Option(help: ArgumentHelp("Event properties as a JSON object, e.g. '{\"price\": 9.99}'.", valueName: "json"))
    var properties: String?

    @OptionGroup var producer: ProducerOptions

    @Option(
        name: .customLong("app-version"),
        help: """
            Sent as $app_version (default 0.0.0). Given with the app producer kind, it is also published \
            as the app's version, which the agent adds to extension events; without it the app's \
            published presets are left as they are.
            """)
    var appVersion: String?

    func validate() throws {
        if let appVersion {
            do {
                try EventRules.validateID(appVersion, what: "--app-version")
            } catch let error as TrackingError {
                throw ValidationError(error.message)
            }
        }
    }

    func run() throws {
        try reportingErrors {
            let props = try properties.map { try PropertyValue.properties(fromJSON: $0) } ?? [:]
            // Before the Tracker opens the store: it publishes the app's presets as it opens, and a
            // refused event must leave the group as it was (exit 65, "nothing written").
            try EventRules.validateEventName(name)
            try EventRules.validateProperties(props)
            var config = producer.configuration(group: options.group)
            config.store.createDirectory = create
            config.appVersion = appVersion ?? config.appVersion
            config.publishesAppPresets = appVersion != nil
            let receipt = try Tracker(configuration: config).track(name, properties: props)
            say(receipt.eventID, done: "event \(receipt.eventID) is stored")
        }
    }
}

struct Status: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Show pending events, sequence numbers, size, quota, identity and producers.")

    @OptionGroup var options: GroupOption

    @Flag(help: "Print JSON instead of text.")
    var json = false

    func run() throws {
        try reportingErrors {
            let store = try openExisting(options.group)
            let status = try store.status()
            var report = StatusReport(
                status, group: store.groupDirectory, agent: AgentChannel.readStatus(groupDirectory: store.groupDirectory))
            report.damagedStores = StoreCheck.setAsideStores(groupDirectory: store.groupDirectory).map {
                ["directory": $0.directory, "reason": $0.reason]
            }
            do {
                report.agentSettings = try store.agentSettings()
            } catch let error as StoreError where error.code == .invalidSettings {
                report.agentSettingsProblem = error.message
            }
            say(json ? try encodeJSON(report) : report.text)
        }
    }
}

struct Inspect: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "List pending events, oldest first.")

    @OptionGroup var options: GroupOption

    @Option(parsing: .unconditional, help: "Show at most this many events.")
    var limit: Int = 20

    @Option(parsing: .unconditional, help: "Start at this global sequence number.")
    var from: UInt64 = 0

    @Flag(help: "Print one JSON object per line (header fields and the event).")
    var json = false

    func validate() throws {
        guard limit > 0 else { throw ValidationError("--limit must be positive.") }
    }

    func run() throws {
        try reportingErrors {
            let store = try openExisting(options.group)
            var corrupt = 0
            for entry in try store.events(from: from, limit: limit) {
                switch entry.record {
                case .success(let record):
                    say(json ? inspectJSON(seq: entry.seq, record) : inspectLine(seq: entry.seq, record))
                case .failure(let corruption):
                    corrupt += 1
                    say(json ? "{\"seq\":\(entry.seq),\"corrupt\":\(jsonString(corruption.reason))}"
                        : "\(entry.seq)\tCORRUPT\t\(corruption.reason)")
                }
            }
            if corrupt > 0 {
                throw StoreError(.corruptRecord, "\(corrupt) record(s) failed their CRC check; they are reported above, not used.")
            }
        }
    }
}

/// Which producer the command writes as (`track`, and the identity commands' events).
struct ProducerOptions: ParsableArguments {
    @Option(help: ArgumentHelp("Producer kind: app, extension or hybrid.", valueName: "kind"))
    var producer: String = "app"

    @Option(name: .customLong("producer-id"), help: ArgumentHelp("Producer id (default: the kind).", valueName: "id"))
    var producerID: String?

    func validate() throws {
        guard ProducerKind(name: producer) != nil else {
            throw ValidationError("--producer must be app, extension or hybrid, not '\(producer)'.")
        }
    }

    /// A tracker's configuration for this producer in `group`; it never publishes the app's presets
    /// (the CLI does not know the app's version unless `track --app-version` says it).
    func configuration(group: String) -> Tracker.Configuration {
        var config = Tracker.Configuration(groupDirectory: group, producerKind: ProducerKind(name: producer)!, producerID: producerID)
        config.publishesAppPresets = false
        return config
    }

    /// A tracker of the group's existing store (a mistyped --group is exit 66, not a new store).
    func existingTracker(group: String) throws -> Tracker {
        var config = configuration(group: group)
        config.store.create = false
        return try Tracker(configuration: config)
    }
}

struct Login: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Log the group in; later events of every process carry the login id.",
        discussion: """
            Tracks $SignUp (type track_signup, with original_id: the anonymous id the login is bound to) in \
            the same transaction, as an app's login() does; logging in again as the current login id tracks \
            nothing. The group's store must exist (a producer creates it): a mistyped --group is exit 66, \
            not a new store.
            """)
    @OptionGroup var options: GroupOption
    @OptionGroup var producer: ProducerOptions
    @Argument(help: "The login id.") var loginID: String

    func run() throws {
        try reportingErrors {
            try EventRules.validateID(loginID, what: "login id")
            say(try producer.existingTracker(group: options.group).login(loginID).distinctID, done: "the group is logged in")
        }
    }
}

struct Logout: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Log the group out.",
        discussion: "Tracks $Logout, carrying the login that ended, in the same transaction; a group not logged in tracks nothing.")
    @OptionGroup var options: GroupOption
    @OptionGroup var producer: ProducerOptions

    func run() throws {
        try reportingErrors { say(try producer.existingTracker(group: options.group).logout().distinctID, done: "the group is logged out") }
    }
}

struct Identify: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Replace the group's anonymous id.",
        discussion: "Tracks $Identify (with original_id: the anonymous id replaced) in the same transaction; the current id again tracks nothing.")
    @OptionGroup var options: GroupOption
    @OptionGroup var producer: ProducerOptions
    @Argument(help: "The new anonymous id.") var anonymousID: String

    func run() throws {
        try reportingErrors {
            try EventRules.validateID(anonymousID, what: "anonymous id")
            say(
                try producer.existingTracker(group: options.group).identify(anonymousID: anonymousID).distinctID,
                done: "the anonymous id is set")
        }
    }
}

struct Flush: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Ask the group's agent to upload now (the app entered the background).",
        discussion: """
            Never waits for the agent: a request the agent has not read yet (it is busy, or stopped) is enough. \
            Exits 69 when no agent is listening (the events stay safely in the store), 66 when the group has no \
            store, 64 when --group is not a directory, 77 when this user may not look inside the group directory \
            or write to the agent's socket.
            """)
    @OptionGroup var options: GroupOption

    func run() throws {
        // A mistyped group is not "no agent": say that there is nothing there, or that this user may not
        // look (exit 66, 64 or 77). Only the file is looked for: the agent, not this request, decides
        // whether the store can be used.
        try reportingErrors { try SharedStore.checkExists(groupDirectory: options.group) }
        let socket = "\(options.group)/\(AgentChannel.socketFile)"
        switch AgentChannel.flush(groupDirectory: options.group) {
        case .sent:
            say("flush requested", done: "the flush is requested")
        case .alreadyQueued:
            say("flush requested (the agent has not read the requests before this one yet; it flushes once it does)", done: "the flush is requested")
        case .noAgent:
            warn("no agent is listening on \(socket); start tributary-agent.")
            throw ExitCode(ExitStatus.unavailable.rawValue)
        case .permissionDenied:
            warn(
                "this user may not write to \(socket): the group directory's files belong to the app's group (see docs/operations.md, \"Files in the group directory\").")
            throw ExitCode(ExitStatus.noPermission.rawValue)
        }
    }
}

struct DeadLetters: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "dead-letters",
        abstract: "List the events the collector rejected (kept in the agent's outbox), replay or discard them.",
        discussion: """
            The outbox is found from the running agent's status file in the group directory, or given \
            with --outbox. --replay moves dead letters back into the outbox; the agent uploads them \
            after the current backlog. Corrupt store records cannot be replayed and stay listed. \
            --discard deletes dead letters for good: they count against the outbox quota, and an outbox \
            at its quota stops the drain.
            """)
    @Option(help: ArgumentHelp("The app group directory (to find the agent's outbox).", valueName: "dir"))
    var group: String?
    @Option(help: ArgumentHelp("The agent's outbox file.", valueName: "path"))
    var outbox: String?
    @Flag(help: "Move the dead letters back into the outbox for another upload.")
    var replay = false
    @Flag(help: "Delete the dead letters for good (after looking at them: they are events the collector refused).")
    var discard = false
    @Option(parsing: .unconditionalSingleValue, help: "With --replay or --discard: only this dead letter id (repeatable; without it, every dead letter, listed or not).")
    var id: [Int64] = []
    @Option(parsing: .unconditional, help: "List at most this many, oldest first; how many more there are is said.")
    var limit: Int = 1000
    @Flag(help: "Print JSON instead of text.")
    var json = false

    func validate() throws {
        guard group != nil || outbox != nil else { throw ValidationError("Give --group or --outbox.") }
        guard group != "", outbox != "" else { throw ValidationError("--group and --outbox must not be empty.") }
        guard !(replay && discard) else { throw ValidationError("Give --replay or --discard, not both.") }
        guard limit >= 1 else { throw ValidationError("--limit must be at least 1, not \(limit).") }
        guard id.isEmpty || replay || discard else {
            throw ValidationError("--id chooses dead letters to replay or discard: give --replay or --discard too.")
        }
    }

    func run() throws {
        try reportingErrors {
            var path = outbox
            if path == nil, let group {
                // The group's own failures (not a directory, not this user's to look in) are said as such,
                // not as a missing outbox at the default path the status file would have overridden.
                try SharedStore.checkDirectory(groupDirectory: group)
                path = AgentChannel.readStatus(groupDirectory: group)?.outboxPath
                    ?? AgentConfiguration.defaultOutboxPath(groupDirectory: group)
            }
            // An empty file is not an outbox: opening it would make it one. One this user may not look at
            // is not "no outbox" either.
            var info = stat()
            if let path, stat(path, &info) != 0, errno == EACCES {
                throw StoreError.permissionDenied("the outbox \(path)", directory: parentDirectory(of: path))
            }
            guard let path, info.st_size > 0 else {
                throw StoreError(.directoryUnavailable, "There is no outbox at \(path ?? "?"); give --outbox.")
            }
            // One it may see but not read (or, to replay or discard, write: the agent's, mode 0600 or 0644):
            // refused as such, not as an outbox that "cannot be read".
            let changes = replay || discard
            if faccessat(AT_FDCWD, path, changes ? R_OK | W_OK : R_OK, AT_EACCESS) != 0, errno == EACCES {
                // Named with the file's own owner and mode, which refuse it.
                throw StoreError.permissionDenied("the outbox \(path)", directory: path)
            }
            let letters: [Outbox.DeadLetter]
            let total: Int
            do {
                // Listing only reads: a read-only connection, which writes nothing (not even a migration).
                let box = changes ? try Outbox(path: path) : try Outbox(readingAt: path)
                if replay {
                    let count = try box.replayDeadLetters(ids: id.isEmpty ? nil : id)
                    say("replayed \(count) dead letter(s)", done: "\(count) dead letter(s) replayed")
                    return
                }
                if discard {
                    let count = try box.discardDeadLetters(ids: id.isEmpty ? nil : id)
                    say("discarded \(count) dead letter(s)", done: "\(count) dead letter(s) discarded")
                    return
                }
                letters = try box.deadLetters(limit: limit)
                total = try box.deadLetterCount()
            } catch let error as Outbox.UnknownDeadLetters {
                throw error
            } catch let error as AgentError where error.code == .configuration {
                throw error
            } catch let error as Outbox.ReplayInterrupted {
                throw AgentError(.outboxIO, "The replay into the outbox \(path) stopped: \(error).")
            } catch {
                throw AgentError(.outboxIO, "The outbox \(path) cannot be read: \(error).")
            }
            if json {
                say(try encodeJSON(letters))
            } else if letters.isEmpty {
                say("no dead letters in \(path)")
            } else {
                for l in letters {
                    say("\(l.id)\tseq \(l.seq)\t\(l.eventID ?? "-")\t\(l.producer ?? "-")\tHTTP \(l.status)\t\(oneLine(l.reason))")
                }
            }
            // Said on stderr: stdout stays the list (or the JSON array) a script reads.
            if total > letters.count {
                warn("\(total - letters.count) more dead letter(s) not listed (\(total) in all); --limit \(total) lists them all.")
            }
        }
    }
}

struct Config: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Show or change the group's agent settings: where the agent uploads, and how often.",
        discussion: """
            The settings the app writes into the group's store for its agent (SharedStore.setAgentSettings): \
            server_url (an http:// or https:// URL), format (sensors or ndjson), flush_bulk_size (50 … \
            1000000 events) and flush_interval_seconds (5 … 86400). A running agent applies them within \
            a poll interval, each one whose option it was not started with (--server, --format, --bulk-size, \
            --flush-interval; for server_url and format, nor TRIBUTARY_SERVER, TRIBUTARY_FORMAT). The \
            group's store must exist (a producer creates it). An unknown key is exit 64, a value out of \
            range (or stored settings that are not valid) exit 65, and nothing is written.
            """,
        subcommands: [ConfigShow.self, ConfigSet.self, ConfigUnset.self],
        defaultSubcommand: ConfigShow.self)
}

struct ConfigShow: ParsableCommand {
    static let configuration = CommandConfiguration(commandName: "show", abstract: "Print the group's agent settings.")
    @OptionGroup var options: GroupOption
    @Flag(help: "Print the settings as stored: a JSON object ({} when there are none).")
    var json = false

    func run() throws {
        try reportingErrors {
            let store = try openExisting(options.group)
            do {
                let settings = try store.agentSettings()
                say(json ? settings.json : settingsText(settings))
            } catch let error as StoreError where error.code == .invalidSettings {
                // What is stored, so that it can be looked at before it is replaced.
                let stored = try store.configurationValue(AgentSettings.configurationKey) ?? ""
                say(json ? stored : "stored (not valid, the agent does not use it): \(stored)")
                throw error
            }
        }
    }
}

struct ConfigSet: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "set", abstract: "Set agent settings; prints the group's settings as they now are.")
    @OptionGroup var options: GroupOption
    @Argument(help: ArgumentHelp("KEY=VALUE, e.g. server_url=https://collector.example.com/sa?project=default.", valueName: "key=value"))
    var assignments: [String] = []

    func validate() throws {
        guard !assignments.isEmpty else { throw ValidationError("Give at least one KEY=VALUE.") }
        _ = try parsed()
    }

    /// Each assignment's setting and value text; a malformed one or an unknown name is bad usage.
    func parsed() throws -> [(key: AgentSettings.Key, value: String)] {
        try assignments.map { assignment in
            guard let equals = assignment.firstIndex(of: "=") else {
                throw ValidationError("\"\(assignment)\" is not KEY=VALUE.")
            }
            return (try settingKey(String(assignment[..<equals])), String(assignment[assignment.index(after: equals)...]))
        }
    }

    func run() throws {
        let assignments = try parsed()
        try reportingErrors {
            // Every value is checked before the store is opened: a refused one writes nothing.
            var changes = AgentSettings()
            for (key, value) in assignments { try changes.set(key, to: value) }
            let keys = assignments.map(\.key)
            var settings = AgentSettings()
            try openExisting(options.group).updateAgentSettings { stored in
                for key in keys { stored.merge(key, from: changes) }
                settings = stored
            }
            say(settingsText(settings), done: "the agent settings are stored")
        }
    }
}

struct ConfigUnset: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "unset", abstract: "Remove agent settings (the agent's own options apply again).")
    @OptionGroup var options: GroupOption
    @Argument(help: ArgumentHelp("Setting names, e.g. flush_bulk_size.", valueName: "key"))
    var keys: [String] = []
    @Flag(help: "Remove every setting, valid or not.")
    var all = false

    func validate() throws {
        guard keys.isEmpty == all else { throw ValidationError("Give setting names or --all (one of the two).") }
        for name in keys { _ = try settingKey(name) }
    }

    func run() throws {
        try reportingErrors {
            let store = try openExisting(options.group)
            if all {
                let removed = try store.removeConfiguration(AgentSettings.configurationKey)
                say(removed ? "removed the agent settings" : "no agent settings", done: "the agent settings are removed")
                return
            }
            var settings = AgentSettings()
            try store.updateAgentSettings { stored in
                for name in keys { stored.remove(try settingKey(name)) }
                settings = stored
            }
            say(settingsText(settings), done: "the agent settings are stored")
        }
    }
}

/// The setting a command line names; an unknown name is bad usage (64).
func settingKey(_ name: String) throws -> AgentSettings.Key {
    guard let key = AgentSettings.Key(rawValue: name) else {
        throw ValidationError(
            "Unknown setting \"\(name)\"; the known ones are "
                + AgentSettings.Key.allCases.map(\.rawValue).joined(separator: ", ") + ".")
    }
    return key
}
