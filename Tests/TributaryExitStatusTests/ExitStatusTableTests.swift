import Testing
import Tributary
@testable import TributaryAgentCore
import TributaryBridge
import TributaryCollector
import TributaryErrors
import TributaryExitStatus
import TributaryStore
import TributaryWire

/// The one table from errors to exit statuses: each row as the executables documented it before it
/// was one table (docs/operations.md, `tributary --help`, `tributary-sim --help`, docs/collector.md).
@Suite("Exit statuses")
struct ExitStatusTableTests {
    struct Row: Sendable, CustomTestStringConvertible {
        var error: any Error & Sendable
        var role: ExitRole
        var status: Int32
        var testDescription: String { "\(error) as \(role) → \(status)" }
    }

    static let rows: [Row] = [
        // tributary-agent (systemd reads these: RestartPreventExitStatus=)
        Row(error: AgentError(.alreadyRunning, "x"), role: .service, status: 69),
        Row(error: AgentError(.configuration, "x"), role: .service, status: 78),
        Row(error: AgentError(.halted, "x"), role: .service, status: 78),
        Row(error: AgentError(.outboxFull, "x"), role: .service, status: 78),
        Row(error: AgentError(.storeReplaced, "x"), role: .service, status: 75),
        Row(error: AgentError(.outboxIO, "x"), role: .service, status: 74),
        Row(error: AgentError(.failStop, "x"), role: .service, status: 74),
        Row(error: AgentError(.startup, "x"), role: .service, status: 74),
        Row(error: StoreError(.insecureDirectory, "x"), role: .service, status: 77),
        Row(error: StoreError(.permissionDenied, "x"), role: .service, status: 77),
        Row(error: StoreError(.notADirectory, "x"), role: .service, status: 78),
        Row(error: StoreError(.unsupportedSchema, "x"), role: .service, status: 78),
        Row(error: StoreError(.storeReplaced, "x"), role: .service, status: 75),
        Row(error: StoreError(.storeFull, "x"), role: .service, status: 74),
        Row(error: StoreError(.lmdb, "x"), role: .service, status: 74),
        Row(error: CancellationError(), role: .service, status: 70),
        // tributary, tributary-sim, tributary-collector
        Row(error: TrackingError(.invalidName, field: "event", "x"), role: .command, status: 65),
        Row(error: StoreError(.storeFull, "x"), role: .command, status: 75),
        Row(error: StoreError(.storeReplaced, "x"), role: .command, status: 75),
        Row(error: StoreError(.insecureDirectory, "x"), role: .command, status: 77),
        Row(error: StoreError(.notADirectory, "x"), role: .command, status: 64),
        Row(error: StoreError(.directoryUnavailable, "x"), role: .command, status: 66),
        Row(error: StoreError(.valueTooLarge, "x"), role: .command, status: 65),
        Row(error: StoreError(.invalidSettings, "x"), role: .command, status: 65),
        Row(error: StoreError(.unsupportedSchema, "x"), role: .command, status: 74),
        Row(error: StoreError(.corruptRecord, "x"), role: .command, status: 74),
        Row(error: AgentError(.outboxIO, "x"), role: .command, status: 74),
        Row(error: Outbox.UnknownDeadLetters(ids: [3]), role: .command, status: 65),
        Row(error: BrowserError(.chromiumNotFound, "x"), role: .command, status: 69),
        Row(error: CollectorError(.serverNotStarted, "x"), role: .command, status: 1),
        Row(error: CollectorError(.database, "x"), role: .command, status: 1),
        Row(error: CancellationError(), role: .command, status: 74),
    ]

    @Test("each error ends each executable with the status it documents", arguments: rows)
    func table(_ row: Row) {
        #expect(ExitStatus.of(row.error, as: row.role).rawValue == row.status)
    }

    @Test("errors are equal by code, say code and message, and know where they were raised")
    func shape() {
        let here = #line + 1
        let error = StoreError(.storeFull, "The store is full.", cause: WireError(.tooLarge, "inner"))
        #expect(error == StoreError(.storeFull, "another message"))
        #expect(error != StoreError(.busy, "The store is full."))
        #expect(error.location == SourceLocation(file: #fileID, line: here))
        #expect(error.description == "storeFull: The store is full. [cause: tooLarge: inner]")
        #expect(AgentError(.halted, "x").description == "halted: x")
    }

    @Test("a code reads back from its name, and no other name makes one")
    func codes() {
        #expect(AgentError.Code(rawValue: "outboxIO") == .outboxIO)
        #expect(StoreError.Code(rawValue: "busy") == .busy)
        #expect(TrackingError.Code(rawValue: "invalidURL") == .invalidURL)
        #expect(StoreError.Code(rawValue: "noSuchCode") == nil)
        #expect(BridgeRejection.Reason.foreignOrigin.rawValue == "foreign_origin")
    }
}
