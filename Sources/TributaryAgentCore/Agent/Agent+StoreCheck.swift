import Logging
import TributaryStore

extension Agent {
    /// Has ``AgentConfiguration/storeWalker`` walk the group's store; a damaged one is moved aside whole
    /// (``StoreCheck/setAside(groupDirectory:reason:)``) and said loudly: the log (critical), the status
    /// file (``AgentStatus/damagedStore``), `tributary status`, the metric `tributary_damaged_stores_total`.
    /// Returns where it went and why, or nil. A walk that could not be made is logged, and the store
    /// opened as it is.
    static func setAsideIfDamaged(
        _ configuration: AgentConfiguration, logger: Logger
    ) throws -> (directory: String, reason: String)? {
        guard let walker = configuration.storeWalker else { return nil }
        // Before READY=1, as a migration: a long walk (a large store, or one whose damage loops the walk
        // until its limit) extends systemd's start timeout.
        let verdict = SystemdNotifier().extendingStart(status: "walking the pages of the shared store") {
            StoreCheck.check(groupDirectory: configuration.groupDirectory, walker: walker)
        }
        switch verdict {
        case .intact:
            return nil
        case .notChecked(let why):
            logger.warning(
                "the shared store could not be walked before it was opened; opening it unchecked",
                metadata: ["tributary.group": "\(configuration.groupDirectory)", "tributary.reason": "\(why)"])
            return nil
        case .damaged(let reason):
            let directory = try StoreCheck.setAside(groupDirectory: configuration.groupDirectory, reason: reason)
            logger.critical(
                "the shared store is damaged: moved aside whole, a new store is made; the events it held are NOT drained (kept in the directory named, for forensics or a restore)",
                metadata: [
                    "tributary.group": "\(configuration.groupDirectory)", "tributary.set_aside": "\(directory)",
                    "tributary.reason": "\(reason)",
                ])
            return (directory, reason)
        }
    }
}
