import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// The files through which the agent and the other processes of a group talk, in the group directory.
///
/// - `agent.lock`: held (`flock`) by the one agent draining the group; holds its pid.
/// - `agent.sock`: a Unix datagram socket the agent listens on; a `flush` datagram wakes it at once
///   (the "app entered background" moment).
/// - `agent-status.json`: the agent's last reported state, for `tributary status`.
public enum AgentChannel {
    /// File names inside the group directory.
    public static let lockFile = "agent.lock"
    public static let socketFile = "agent.sock"
    public static let statusFile = "agent-status.json"

    /// What became of a flush request.
    public enum FlushOutcome: Sendable, Equatable {
        /// The agent's socket took it.
        case sent
        /// The agent's socket is full of requests it has not read yet (a busy or stopped agent): it
        /// flushes when it reads them, and one more would change nothing.
        case alreadyQueued
        /// No agent is listening (no socket, or nobody bound to it).
        case noAgent
        /// This user may not write to the agent's socket (`EACCES`, `EPERM`).
        case permissionDenied
    }

    /// Asks the group's agent to flush now. Returns false when no agent is listening or the socket
    /// may not be written to. Never blocks: the app calls it from its UI thread on entering the
    /// background, and a stopped agent stops reading its socket.
    @discardableResult
    public static func requestFlush(groupDirectory: String) -> Bool {
        switch flush(groupDirectory: groupDirectory) {
        case .sent, .alreadyQueued: return true
        case .noAgent, .permissionDenied: return false
        }
    }

    /// ``requestFlush(groupDirectory:)``, saying what became of the request.
    public static func flush(groupDirectory: String) -> FlushOutcome {
        send("flush", to: groupDirectory + "/" + socketFile)
    }

    package static func send(_ message: String, to path: String) -> FlushOutcome {
        let fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return .noAgent }
        defer { close(fd) }
        guard var address = unixAddress(path) else { return .noAgent }
        let bytes = Array(message.utf8)
        // MSG_DONTWAIT: a datagram socket's queue holds a few messages (net.unix.max_dgram_qlen, 10 by
        // default); with the agent not reading, a blocking send waited until it did: for ever, for an
        // agent stopped or frozen.
        let sent = withUnsafePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { sa in
                sendto(fd, bytes, bytes.count, Int32(MSG_NOSIGNAL | MSG_DONTWAIT), sa, socklen_t(MemoryLayout<sockaddr_un>.size))
            }
        }
        if sent == bytes.count { return .sent }
        switch errno {
        case EAGAIN: return .alreadyQueued
        case EACCES, EPERM: return .permissionDenied
        default: return .noAgent
        }
    }

    /// The `sockaddr_un` for a socket path, or nil when the path is too long for one.
    package static func unixAddress(_ path: String) -> sockaddr_un? {
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8)
        guard bytes.count < MemoryLayout.size(ofValue: address.sun_path) else { return nil }
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            raw.copyBytes(from: bytes)
            raw[bytes.count] = 0
        }
        return address
    }

    /// Reads the agent's last status report, if any.
    public static func readStatus(groupDirectory: String) -> AgentStatus? {
        guard let data = FileManager.default.contents(atPath: groupDirectory + "/" + statusFile) else { return nil }
        return try? JSONDecoder().decode(AgentStatus.self, from: data)
    }
}

/// What the agent reports about itself in `agent-status.json`.
public struct AgentStatus: Codable, Sendable, Equatable {
    /// The agent's pid.
    public var pid: Int32
    /// `idle`, `uploading`, `backoff`, `halted`, `waiting` (events, and no collector URL to send them
    /// to), `stopping`, `stopped`, or `failed` (the run ended in an error: ``lastError``).
    public var state: String
    /// Why uploads are halted (401/403/404…, or the dead-letter halt), when they are.
    public var haltReason: String?
    /// When the halt is the one after `--halt-after-dead-letters` events in a row were dead-lettered
    /// (the collector refuses event after event): how many were; nil for any other halt, and when
    /// uploads are not halted.
    public var haltedAfterDeadLetters: Int?
    /// The last error seen (upload or drain); once `failed`, the error the run ended in.
    public var lastError: String?
    /// The outbox file.
    public var outboxPath: String
    /// Events in the outbox.
    public var outboxPending: Int
    /// Events delivered (acknowledged), dead-lettered, batches acknowledged, retries — since the outbox was created.
    public var delivered: Int64
    public var deadLetters: Int64
    public var batches: Int64
    public var retries: Int64
    /// Corrupt store records set aside.
    public var corruptRecords: Int64
    /// Bytes the outbox holds: its pending events, its dead letters, and the quota the two together
    /// may reach before the drain stops (nil in a report of an agent before these were reported).
    public var outboxBytes: Int?
    public var deadLetterBytes: Int?
    public var outboxQuota: Int?
    /// Where batches go (nil: no collector URL yet, or a report of an agent before it reported this).
    public var serverURL: String?
    /// Why the group's agent settings are not used, while they are not.
    public var settingsProblem: String?
    /// The damaged store this agent moved aside at its start (its directory, then why), if it did
    /// (`StoreCheck`): its events are not drained.
    public var damagedStore: String?
    /// When the last batch was acknowledged (wall clock ms), if ever.
    public var lastUploadMillis: Int64?
    /// When this report was written (wall clock ms): the agent writes one only when it says something
    /// new, so an idle agent's report grows old while the agent runs (`agent.lock` says whether it does).
    public var updatedMillis: Int64

    /// Creates a report.
    public init(
        pid: Int32, state: String, haltReason: String? = nil, lastError: String? = nil, outboxPath: String,
        outboxPending: Int, delivered: Int64, deadLetters: Int64, batches: Int64, retries: Int64,
        corruptRecords: Int64, lastUploadMillis: Int64?, updatedMillis: Int64
    ) {
        self.pid = pid
        self.state = state
        self.haltReason = haltReason
        self.lastError = lastError
        self.outboxPath = outboxPath
        self.outboxPending = outboxPending
        self.delivered = delivered
        self.deadLetters = deadLetters
        self.batches = batches
        self.retries = retries
        self.corruptRecords = corruptRecords
        self.lastUploadMillis = lastUploadMillis
        self.updatedMillis = updatedMillis
    }

    /// Writes the report atomically (temp file + rename) into the group directory.
    public func write(groupDirectory: String) throws {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        let data = try encoder.encode(self)
        let path = groupDirectory + "/" + AgentChannel.statusFile
        let temp = path + ".tmp"
        try data.write(to: URL(fileURLWithPath: temp))
        guard rename(temp, path) == 0 else {
            throw StoreError(.directoryUnavailable, "Could not rename \(temp) to \(path): \(String(cString: strerror(errno))).")
        }
    }
}
