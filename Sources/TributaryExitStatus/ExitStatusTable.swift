import Tributary
import TributaryAgentCore
import TributaryBridge
import TributaryCollector
import TributaryErrors
import TributaryStore

/// Who ends with the status: a command that a person or a script runs, or a service that systemd
/// restarts (`RestartPreventExitStatus=` reads it: a configuration error is not restarted into).
public enum ExitRole: Sendable {
    /// `tributary`, `tributary-sim` and `tributary-collector`.
    case command
    /// `tributary-agent`.
    case service
}

extension ExitStatus {
    /// The one table from errors to exit statuses, shared by the four executables (docs/operations.md,
    /// "Exit codes of `tributary-agent`"; `tributary --help`; `tributary-sim --help`; docs/collector.md).
    ///
    /// The two roles differ where a restart should, or should not, follow: a group path that is no
    /// directory is a mistyped argument for a command (64) and a configuration error for the agent
    /// (78); a store of a newer Tributary is an I/O error for a command and a configuration error for
    /// the agent, which a restart would meet again.
    public static func of(_ error: any Error, as role: ExitRole) -> ExitStatus {
        switch error {
        case is TrackingError, is Outbox.UnknownDeadLetters, is AppSiteAssociationError: return .dataError
        case let error as StoreError: return of(error.code, as: role)
        case let error as AgentError: return role == .command ? .ioError : of(error.code)
        case is BrowserError: return .unavailable
        case is CollectorError: return .failure
        default: return role == .service ? .software : .ioError
        }
    }

    /// A store error's status.
    static func of(_ code: StoreError.Code, as role: ExitRole) -> ExitStatus {
        switch (code, role) {
        case (.storeReplaced, _): return .tempFail  // the restart, or the next try, opens the new store
        case (.insecureDirectory, _), (.permissionDenied, _): return .noPermission
        case (.notADirectory, .service), (.unsupportedSchema, .service): return .configuration
        case (.notADirectory, .command): return .usage
        case (.storeFull, .command): return .tempFail  // try again once the agent has drained it
        case (.busy, .command): return .tempFail  // another process holds the store's writer lock: try again
        case (.directoryUnavailable, .command): return .noInput
        case (.valueTooLarge, .command), (.invalidSettings, .command): return .dataError
        default: return .ioError
        }
    }

    /// The agent's own errors, as it ends with them.
    static func of(_ code: AgentError.Code) -> ExitStatus {
        switch code {
        case .alreadyRunning: return .unavailable
        case .configuration, .halted, .outboxFull: return .configuration
        case .storeReplaced: return .tempFail
        default: return .ioError
        }
    }
}
