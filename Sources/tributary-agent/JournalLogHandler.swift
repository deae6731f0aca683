import Foundation
import Logging

/// The agent's log lines when its stderr is the journal (a systemd unit): each line starts with the
/// sd-daemon priority prefix (`<3>` for an error, sd-daemon(3)), which journald reads as the line's
/// priority (`SyslogLevelPrefix=`, on by default), so `journalctl -p err -u …` finds errors. Without
/// the prefix every line was stored at the unit's default priority, info. journald adds the time
/// and the unit; the line is `<N>label: level: message [key=value …]`.
struct JournalLogHandler: LogHandler {
    /// Whether stderr is the journal's stream: `JOURNAL_STREAM` (set by systemd, `device:inode`)
    /// names the file descriptor 2 holds (systemd.exec(5)). Not so for a process started by hand from
    /// a unit's shell, whose stderr is a terminal though it inherits the variable.
    static func stderrIsJournal(environment: [String: String] = ProcessInfo.processInfo.environment) -> Bool {
        let parts = environment["JOURNAL_STREAM"]?.split(separator: ":") ?? []
        guard parts.count == 2, let device = UInt64(parts[0]), let inode = UInt64(parts[1]) else { return false }
        var status = stat()
        guard fstat(STDERR_FILENO, &status) == 0 else { return false }
        return UInt64(status.st_dev) == device && UInt64(status.st_ino) == inode
    }

    /// syslog's priority of a swift-log level (sd-daemon's `SD_ERR` … `SD_DEBUG`).
    static func priority(_ level: Logger.Level) -> Int {
        switch level {
        case .trace, .debug: 7
        case .info: 6
        case .notice: 5
        case .warning: 4
        case .error: 3
        case .critical: 2
        }
    }

    let label: String
    var logLevel: Logger.Level = .info
    var metadata: Logger.Metadata = [:]
    var metadataProvider: Logger.MetadataProvider?

    init(label: String, metadataProvider: Logger.MetadataProvider? = LoggingSystem.metadataProvider) {
        self.label = label
        self.metadataProvider = metadataProvider
    }

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    func log(event: LogEvent) {
        let level = event.level
        let message = event.message
        var all = metadata
        if let provided = metadataProvider?.get() { all.merge(provided) { _, new in new } }
        if let explicit = event.metadata { all.merge(explicit) { _, new in new } }
        let fields = all.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: " ")
        let prefix = "<\(Self.priority(level))>"
        let text = "\(label): \(level): \(message)" + (fields.isEmpty ? "" : " [\(fields)]")
        // journald reads the prefix at the start of each line: a message's own line breaks get it too.
        let lines = text.split(separator: "\n", omittingEmptySubsequences: false).map { prefix + $0 + "\n" }
        FileHandle.standardError.write(Data(lines.joined().utf8))  // one write: lines of two threads never interleave
    }
}
