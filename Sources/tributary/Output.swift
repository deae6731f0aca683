import ArgumentParser
import Foundation
import Tributary
import TributaryAgentCore
import TributaryStore
import TributaryErrors
import TributaryExitStatus

/// Writes a line to stdout unbuffered (stdout is a pipe under systemd and in tests).
///
/// `done` says what the command has already changed (an event stored, an identity set, dead letters
/// discarded), for a stdout that cannot be written to: the caller is then told on stderr, exit 74,
/// so that a script does not do it again. A command that changed nothing ends quietly (exit 0) when
/// its reader went away (`EPIPE`: `tributary inspect | head`), and with 74 on any other error.
/// (`FileHandle.write(_:)` trapped on either, after the event was stored.)
func say(_ line: String, done: String? = nil) {
    guard let error = writeAll(STDOUT_FILENO, Array((line + "\n").utf8)) else { return }
    if error == EPIPE && done == nil { exit(0) }
    let reason = String(cString: strerror(error))
    fail(.ioError, "cannot write to stdout (\(reason))" + (done.map { "; \($0): do not do it again" } ?? ""))
}

/// Writes a line to stderr; a stderr that cannot be written to is ignored.
func warn(_ message: String) {
    _ = writeAll(STDERR_FILENO, Array(("tributary: " + message + "\n").utf8))
}

/// Runs `body`, turning Tributary's errors into a message on stderr and a documented exit code.
func reportingErrors(_ body: () throws -> Void) throws {
    do {
        try body()
    } catch let error as TrackingError {
        fail(.of(error, as: .command), "rejected: \(error.message)")
    } catch let error as StoreError {
        // An I/O error names its code and where it was raised, for a bug report.
        let status = ExitStatus.of(error, as: .command)
        fail(status, status == .ioError ? "\(error.description) (at \(error.location))" : error.message)
    } catch let error as AgentError {
        fail(.of(error, as: .command), error.description)
    } catch let error as Outbox.UnknownDeadLetters {
        fail(.of(error, as: .command), error.description)
    }
}

private func fail(_ status: ExitStatus, _ message: String) -> Never {
    warn(message)
    exit(status.rawValue)
}

/// Opens a group's store for reading without creating anything.
func openExisting(_ group: String) throws -> SharedStore {
    var options = SharedStore.Options()
    options.create = false
    return try SharedStore(groupDirectory: group, options: options)
}

func encodeJSON<T: Encodable>(_ value: T) throws -> String {
    let encoder = JSONEncoder()
    encoder.outputFormatting = [.sortedKeys]
    encoder.keyEncodingStrategy = .convertToSnakeCase
    return String(decoding: try encoder.encode(value), as: UTF8.self)
}

func jsonString(_ s: String) -> String {
    var w = JSONWriter()
    w.string(s)
    return String(decoding: w.bytes, as: UTF8.self)
}

struct StatusReport: Encodable {
    struct Producer: Encodable {
        var id: String
        var kind: String
        var lastSeq: UInt64
        var pid: Int32
        var lastSeenMillis: Int64
    }
    var group: String
    var pendingEvents: Int
    var oldestSeq: UInt64?
    var newestSeq: UInt64?
    var lastAssignedSeq: UInt64
    var fileSize: Int
    var mapSize: Int
    // No quota: a store has none of its own. Each writer grows the map up to the quota it opened the
    // store with (`SharedStore.Options.quota`); this tool's own (the default, 1 GiB) said nothing of the
    // producers' and was shown as the store's.
    var staleReadersCleared: Int
    var memoryBacked: Bool
    var identity: Identity?
    var producers: [Producer]
    var damagedProducers: [String]
    /// Damaged stores the agent moved aside in the group directory: each one's directory and reason.
    var damagedStores: [[String: String]] = []
    var agent: AgentStatus?
    /// The group's agent settings, as the app wrote them, or why they are not valid.
    var agentSettings: AgentSettings?
    var agentSettingsProblem: String?

    init(_ s: SharedStore.Status, group: String, agent: AgentStatus?) {
        self.agent = agent
        self.group = group
        pendingEvents = s.pendingEvents
        oldestSeq = s.oldestSeq
        newestSeq = s.newestSeq
        lastAssignedSeq = s.lastAssignedSeq
        fileSize = s.fileSize
        mapSize = s.mapSize
        staleReadersCleared = s.staleReadersCleared
        memoryBacked = s.isMemoryBacked
        identity = s.identity
        damagedProducers = s.damagedProducers
        producers = s.producers.map {
            Producer(id: $0.id, kind: $0.kind.description, lastSeq: $0.lastSeq, pid: $0.pid, lastSeenMillis: $0.lastSeenMillis)
        }
    }

    var text: String {
        var lines = [
            "group:          \(group)",
            "pending events: \(pendingEvents)"
                + (oldestSeq.map { " (seq \($0)…\(newestSeq ?? $0))" } ?? ""),
            "last seq:       \(lastAssignedSeq)",
            "store size:     \(mib(fileSize)) on disk, map \(mib(mapSize)) (each producer grows it up to its own quota)",
        ]
        if memoryBacked {
            lines.append(
                "warning:        the group directory is on tmpfs (memory): every event in the store is lost at the next "
                    + "reboot; put it on a disk")
        }
        for damaged in damagedStores {
            lines.append("DAMAGED STORE:  set aside in \(damaged["directory"] ?? "?") (its events are not drained): \(damaged["reason"] ?? "?")")
        }
        if let identity {
            lines.append("distinct id:    \(identity.distinctID)")
            lines.append("anonymous id:   \(identity.anonymousID)")
            lines.append("login id:       \(identity.loginID ?? "-")")
        }
        lines.append("producers:      \(producers.isEmpty ? "none" : "")")
        for p in producers.sorted(by: { $0.id < $1.id }) {
            lines.append("  \(p.id) (\(p.kind)): last seq \(p.lastSeq), pid \(p.pid)")
        }
        for id in damagedProducers.sorted() {
            lines.append("  \(id): DAMAGED registration; its next event goes on above every seq handed out")
        }
        if let settings = agentSettings {
            lines.append("agent settings: " + (settings.isEmpty ? "none" : settingsText(settings, separator: ", ")))
        } else if let problem = agentSettingsProblem {
            lines.append("agent settings: NOT VALID, not used: \(problem)")
        }
        if let a = agent {
            lines.append("agent:          \(a.state) (pid \(a.pid), last change \(ageText(a.updatedMillis)))")
            if let server = a.serverURL {
                lines.append("  server:       \(server)")
            } else if a.state == "waiting" {
                lines.append("  server:       none yet: events wait (tributary config set --group DIR server_url=URL)")
            }
            if let problem = a.settingsProblem { lines.append("  SETTINGS:     not used: \(problem)") }
            lines.append("  outbox:       \(a.outboxPending) pending in \(a.outboxPath)")
            if let bytes = a.outboxBytes, let dead = a.deadLetterBytes, let quota = a.outboxQuota {
                let full = bytes + dead >= quota ? "; FULL: the drain waits (see tributary dead-letters)" : ""
                lines.append("  bytes:        \(bytes) pending + \(dead) dead letters of a \(quota) quota\(full)")
            }
            lines.append("  delivered:    \(a.delivered) events in \(a.batches) batches, \(a.retries) retries")
            lines.append("  dead letters: \(a.deadLetters)\(a.corruptRecords > 0 ? " (\(a.corruptRecords) corrupt store records)" : "")")
            // One line each, whatever the collector answered (reports written before the agent made its
            // reasons one line hold them as it sent them).
            if let count = a.haltedAfterDeadLetters {
                lines.append("  HALTED:       after \(count) dead letters in a row (tributary dead-letters --group DIR)")
            }
            if let halt = a.haltReason { lines.append((a.haltedAfterDeadLetters == nil ? "  HALTED:       " : "  why:          ") + oneLine(halt)) }
            if let error = a.lastError { lines.append("  last error:   \(oneLine(error))") }
        } else {
            lines.append("agent:          no report (tributary-agent has not run on this group)")
        }
        return lines.joined(separator: "\n")
    }
}

/// The settings given, one `key=value` each, in the keys' order; "none" when none is.
func settingsText(_ settings: AgentSettings, separator: String = "\n") -> String {
    var parts: [String] = []
    if let url = settings.serverURL { parts.append("server_url=\(url)") }
    if let format = settings.format { parts.append("format=\(format.rawValue)") }
    if let size = settings.flushBulkSize { parts.append("flush_bulk_size=\(size)") }
    if let seconds = settings.flushIntervalSeconds {
        parts.append("flush_interval_seconds=\(seconds == seconds.rounded() ? String(Int(seconds)) : String(seconds))")
    }
    return parts.isEmpty ? "none" : parts.joined(separator: separator)
}

private func mib(_ bytes: Int) -> String {
    String(format: "%.1f MiB", Double(bytes) / 1_048_576)
}

func inspectLine(seq: UInt64, _ r: EventRecord) -> String {
    let object = (try? JSONSerialization.jsonObject(with: Data(r.body))) as? [String: Any]
    let name = object?["event"] as? String ?? object?["type"] as? String ?? "?"
    return "\(seq)\t\(r.producerID)#\(r.producerSeq)\t\(r.producerKind)\tpid \(r.pid)\t\(r.wallTimeMillis)\t\(name)"
}

func inspectJSON(seq: UInt64, _ r: EventRecord) -> String {
    var w = JSONWriter()
    w.raw("{\"seq\":")
    w.int(Int64(seq))
    w.raw(",\"producer\":")
    w.string(r.producerID)
    w.raw(",\"producer_kind\":")
    w.string(r.producerKind.description)
    w.raw(",\"producer_seq\":")
    w.int(Int64(r.producerSeq))
    w.raw(",\"pid\":")
    w.int(Int64(r.pid))
    w.raw(",\"wall_time_ms\":")
    w.int(r.wallTimeMillis)
    w.raw(",\"boot_time_ns\":")
    w.int(Int64(bitPattern: r.bootTimeNanos))
    w.raw(",\"boot_id\":")
    w.string(r.bootID.description)
    w.raw(",\"event\":")
    w.raw(r.body)
    w.raw("}")
    return String(decoding: w.bytes, as: UTF8.self)
}

private func ageText(_ millis: Int64) -> String {
    let seconds = max(0, (BootClock.wallMillis() - millis) / 1000)
    return seconds < 2 ? "just now" : "\(seconds) s ago"
}
