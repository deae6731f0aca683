import Foundation
import TributaryStore
import TributaryWire

/// Everything the agent needs to run. Defaults follow the iOS SDK (flush at 100 events or every 15 s).
public struct AgentConfiguration: Sendable {
    /// The app group directory to drain.
    public var groupDirectory: String
    /// The agent's private SQLite outbox. Default: ``defaultOutboxPath(environment:)``.
    public var outboxPath: String
    /// Upload settings (server, format, batch limits, backoff, token).
    public var upload: UploadConfiguration
    /// Upload as soon as this many events are pending. Default 100.
    public var bulkSize = 100
    /// Upload at least this often when anything is pending. Default 15 s.
    public var flushInterval: Duration = .seconds(15)
    /// The shortest time between two drains woken by store changes (a producer committing steadily is
    /// drained once per interval, not once per commit); also how often the store is polled where no
    /// change would wake the agent (docs/agent-core.md, "When the loop sleeps"). Default 200 ms.
    public var pollInterval: Duration = .milliseconds(200)
    /// Events per drain transaction. Default 2,000: each chunk costs an SQLite and an LMDB commit,
    /// with an fsync each, and a read of the store's last record; with 1,000 the pipeline benchmark
    /// moved about 9 % fewer events per second (docs/performance-history.md, "Eighteenth round"). The chunk is
    /// held in memory while it is inserted.
    public var drainChunk = 2000
    /// While producers are committing, the share of the time the agent's disk work (its drains and
    /// checkpoints) may take: after each turn it rests `1 / drainShare − 1` times as long as that work
    /// took, neither draining nor uploading (``LoopPacing``), so that producers' commits seldom wait
    /// behind its own. 1: it never rests; a one-shot run never does. Default 0.05: beside a producer
    /// committing every millisecond, that producer's p99 is about 1.5–1.8 × its p99 with no drain
    /// (4 × before the agent rested), its slowest call 5–7 ms (23 ms before; docs/performance.md);
    /// the drain then moves about a fifteenth of its rate alone, and goes at full speed a second after
    /// the producers' last commit, or while they append faster than half a chunk in a turn's work and
    /// its rest.
    public var drainShare = 0.05
    /// Stop draining while the outbox holds this many bytes of events, pending and dead letters
    /// together (the store then fills up and producers get `storeFull`, rather than the disk).
    /// Default 512 MiB.
    public var outboxQuotaBytes = 512 << 20
    /// While the collector accepts uploads, stop draining once the outbox holds this many events
    /// (at least two batches and the bulk size): the rest waits in the shared store, which is as
    /// crash-safe, and the outbox (its SQLite indexes and cache) stays small. While uploads fail
    /// (backoff, halted), the drain goes on up to ``outboxQuotaBytes``, so that the outbox absorbs a
    /// collector outage before producers reach the store's quota. Default 20,000; `.max` drains as
    /// far ahead as the quota allows.
    public var drainAhead = 20_000
    /// The drain-ahead bound in force: ``drainAhead``, raised to two batches and the bulk size.
    var effectiveDrainAhead: Int { max(drainAhead, upload.batchSize.doubledSaturating, bulkSize) }
    /// Drain and upload everything stored at the start, then return. Default false (run until stopped).
    public var once = false
    /// With `once`: the whole run's budget (`--deadline`), counted from the ``Agent``'s creation, which
    /// opens the store and migrates the outbox (work that cannot be stopped part way: a creation that
    /// outlasts the budget is followed by a run that stops at once). Nil = no limit.
    public var deadline: Duration?
    /// After SIGTERM: how long the agent may keep uploading before it stops (`--stop-timeout`).
    /// Default 80 s, a little under systemd's default `TimeoutStopSec` of 90 s.
    public var stopTimeout: Duration = .seconds(80)
    /// How long before a deadline the expiration handler runs. Default 1 s (at most half the budget).
    public var grace: Duration = .seconds(1)
    /// The budget a flush request ("app entered background") gets to upload. Default 30 s.
    public var backgroundBudget: Duration = .seconds(30)
    /// A file holding the bearer token; re-read after a 401/403 so a fixed token takes effect.
    public var authTokenFile: String?
    /// How to start a child that walks the store's pages before the agent opens it (an executable that
    /// calls `StoreCheck.walkerMain`, and its arguments; `tributary-agent` gives itself): a damaged store
    /// (the walk fails, or crashes inside liblmdb) is moved aside whole and a new one made. Default nil:
    /// no walk (an agent in a test process, which has no such executable).
    public var storeWalker: [String]?
    /// The size of the outbox's WAL file above which the agent, with nothing pending, empties it and
    /// cuts it back (a `TRUNCATE` checkpoint instead of its usual `PASSIVE` one). Under load the WAL
    /// grows to what is written between two checkpoints (about 170 MB in the pipeline benchmark);
    /// idle, the disk space goes back. Default 64 MiB.
    public var idleWALBytes = 64 << 20
    /// The settings the group's own (``AgentSettings``, written by the main app) may set, over this
    /// configuration's values: `tributary-agent` gives those its command line left out. Default none.
    /// The group's `server_url` applies whenever ``UploadConfiguration/serverURL`` is nil.
    public var settingsFromGroup: Set<AgentSettings.Key> = []
    /// The clock the loop reads and waits on (flush intervals, backoffs, deadlines, the status file's
    /// rhythm). Default ``SystemClock``; a test gives a ``ManualClock`` and moves it itself.
    public var clock: any AgentClock = SystemClock()

    /// A configuration with defaults for everything but the group and the server. With no server
    /// URL, the agent uploads once the group's settings give one (`--once` requires one).
    public init(groupDirectory: String, serverURL: String?, outboxPath: String? = nil) {
        self.groupDirectory = groupDirectory
        self.upload = UploadConfiguration(serverURL: serverURL)
        self.outboxPath = outboxPath ?? Self.defaultOutboxPath(groupDirectory: groupDirectory)
    }

    /// The default outbox path: `$STATE_DIRECTORY/outbox.sqlite` under systemd (`StateDirectory=`),
    /// else `$XDG_STATE_HOME/tributary/<group>-<hash>/outbox.sqlite` (`~/.local/state` by default),
    /// one outbox per group directory.
    public static func defaultOutboxPath(
        groupDirectory: String, environment: [String: String] = ProcessInfo.processInfo.environment
    ) -> String {
        if let state = environment["STATE_DIRECTORY"]?.split(separator: ":").first, !state.isEmpty {
            return "\(state)/outbox.sqlite"
        }
        let base = environment["XDG_STATE_HOME"].flatMap { $0.isEmpty ? nil : $0 }
            ?? (environment["HOME"] ?? NSHomeDirectory()) + "/.local/state"
        let absolute = URL(fileURLWithPath: groupDirectory).standardizedFileURL.path
        let name = URL(fileURLWithPath: absolute).lastPathComponent
        return "\(base)/tributary/\(name)-\(fnv1a(absolute))/outbox.sqlite"
    }

    /// What the agent runs with, given the group's `settings`: each one this configuration leaves to
    /// the group (``settingsFromGroup``) and the group gives, else this configuration's. The group's
    /// format applies only together with the group's server URL.
    func effective(_ settings: AgentSettings) -> EffectiveSettings {
        func follows(_ key: AgentSettings.Key) -> Bool { settingsFromGroup.contains(key) }
        var effective = EffectiveSettings(
            serverURL: upload.serverURL, format: upload.format, bulkSize: bulkSize, flushInterval: flushInterval)
        let groupsServer = settings.serverURL != nil && (follows(.serverURL) || upload.serverURL == nil)
        if groupsServer { effective.serverURL = settings.serverURL }
        // The app's format goes with the app's server: a body for its collector may be refused by another.
        if let format = settings.format, follows(.format), groupsServer {
            effective.format = WireFormat(rawValue: format.rawValue) ?? effective.format
        }
        if let size = settings.flushBulkSize, follows(.flushBulkSize) { effective.bulkSize = size }
        if let seconds = settings.flushIntervalSeconds, follows(.flushIntervalSeconds) {
            effective.flushInterval = .milliseconds(Int64((seconds * 1000).rounded()))
        }
        return effective
    }

    /// Checks values a user may have mistyped.
    public func validate() throws {
        if let serverURL = upload.serverURL {
            do throws(StoreError) {
                try AgentSettings.validateServerURL(serverURL)
            } catch {
                throw AgentError(.configuration, "The server URL \(serverURL) is not an http:// or https:// URL with a host.")
            }
        }
        guard bulkSize > 0, upload.batchSize > 0, upload.maxBatchBytes > 0, drainChunk > 0 else {
            throw AgentError(.configuration, "Bulk size, batch size, batch bytes and drain chunk must be positive.")
        }
        guard drainShare > 0 && drainShare <= 1 else {
            throw AgentError(.configuration, "The drain share must be above 0 and at most 1 (it is \(drainShare)).")
        }
        guard (1...9).contains(upload.gzipLevel) else {
            throw AgentError(.configuration, "The gzip level must be 1 … 9 (it is \(upload.gzipLevel)).")
        }
        guard flushInterval > .zero, upload.backoff.base > .zero, upload.backoff.cap >= upload.backoff.base else {
            throw AgentError(.configuration, "The flush interval and backoff base must be positive, and the cap ≥ the base.")
        }
    }
}

/// The settings the group's may change while the agent runs, as they are in force.
struct EffectiveSettings: Equatable {
    var serverURL: String?
    var format: WireFormat
    var bulkSize: Int
    var flushInterval: Duration
}

/// FNV-1a 64-bit, hex: a short stable name for a path.
func fnv1a(_ text: String) -> String { String(fnv1a64(text.utf8), radix: 16) }

/// FNV-1a 64-bit of `bytes`.
func fnv1a64(_ bytes: some Sequence<UInt8>) -> UInt64 {
    var hash: UInt64 = 0xcbf2_9ce4_8422_2325
    for byte in bytes {
        hash ^= UInt64(byte)
        hash = hash &* 0x0000_0100_0000_01b3
    }
    return hash
}

extension Int {
    /// Twice this, or `Int.max` when that does not fit (a batch size may be as large as `Int.max`).
    var doubledSaturating: Int {
        let doubled = multipliedReportingOverflow(by: 2)
        return doubled.overflow ? .max : doubled.partialValue
    }
}
