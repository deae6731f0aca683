import Foundation
import GRDB
import Logging
import Testing
import Tributary
import TributaryStore
import TributaryTestSupport

@testable import TributaryAgentCore

/// The fail-stop rule in one process (``FatalIO``): once an I/O error trips an agent's latch, no outbox
/// write, checkpoint or store delete touches a file again, and each says why with the latched error.
/// The real thing, an injected `fsync` EIO on the agent process, is reliability row 5 (`DiskFaultScenarios`).
@Suite("Fail-stop latch")
struct FatalIOTests {
    /// The error SQLite gives for a failed fsync, as a transaction would fail with it.
    static let fsyncFailed = DatabaseError(resultCode: .SQLITE_IOERR_FSYNC)

    @Test("an I/O error inside an outbox transaction trips the latch there; every write after it is refused, nothing written")
    func outboxRefusesAfterTrip() throws {
        try withTemporaryGroup { dir in
            let outbox = try Outbox(path: dir + "/outbox.sqlite")
            #expect(try outbox.insertDrained((1...3).map { .event(OutboxTests.row($0)) }) == 3)
            #expect(outbox.fatalIO.error == nil)
            // Not fatal: a full disk fails the step, and the next write goes on.
            #expect(throws: DatabaseError.self) {
                try outbox.write { _ in throw DatabaseError(resultCode: .SQLITE_FULL) }
            }
            try outbox.countRetry()
            let before = try outbox.counters()

            #expect(throws: AgentError.self, "the failed write says fail-stop too") {
                try outbox.write { _ in throw Self.fsyncFailed }
            }
            let latched = try #require(outbox.fatalIO.error)
            #expect(latched.code == .failStop)
            #expect(latched.message.contains("fail-stop"))
            let wal = Self.bytes(dir + "/outbox.sqlite-wal")
            let database = Self.bytes(dir + "/outbox.sqlite")
            for write: () throws -> Void in [
                { try outbox.countRetry() },
                { _ = try outbox.insertDrained([.event(OutboxTests.row(4))]) },
                { try outbox.checkpoint() },
            ] {
                #expect(throws: AgentError.self) { try write() }
                do { try write() } catch let error as AgentError { #expect(error.code == .failStop) }
            }
            #expect(try outbox.counters() == before, "reads still work; nothing was written")
            #expect(try outbox.lastDrainedSeq() == 3)
            #expect(Self.bytes(dir + "/outbox.sqlite-wal") == wal && Self.bytes(dir + "/outbox.sqlite") == database)
            #expect(FatalIO.matches(latched), "a latched error is still fail-stop where it surfaces")
        }
    }

    @Test("the first error is the one latched; the latch keeps what it is given alive")
    func firstErrorWins() {
        let latch = FatalIO.Latch()
        #expect(throws: Never.self) { try latch.check() }
        let first = latch.trip(Self.fsyncFailed)
        let second = latch.trip(StoreError(.lmdb, "commit failed", lmdbCode: EIO))
        #expect(second.message == first.message)
        #expect((first.cause as? DatabaseError)?.extendedResultCode == .SQLITE_IOERR_FSYNC)
        weak var weakOwner: Owner?
        do {
            let owner = Owner()
            weakOwner = owner
            latch.trip(Self.fsyncFailed, keeping: owner)
        }
        #expect(weakOwner != nil, "kept to the end of the process: an outbox closed now would checkpoint")
    }

    @Test("store deletes: refused once the agent's latch tripped, and the store keeps its events")
    func storeDeletesRefuse() async throws {
        try await withTemporaryGroup { dir in
            let tracker = try Tracker(configuration: .init(groupDirectory: dir))
            for i in 0..<3 { try await tracker.track("Ordinary", properties: ["i": .int(Int64(i))]) }
            let store = try SharedStore(groupDirectory: dir)
            let latch = FatalIO.Latch()
            let deletes = StoreDeletes(logger: Logger(label: "test"), fatalIO: latch)
            latch.trip(Self.fsyncFailed)
            #expect(throws: AgentError.self) { _ = try deletes.delete(through: 3, in: store) }
            #expect(try store.status().pendingEvents == 3)
        }
    }

    final class Owner: Sendable {}

    static func bytes(_ path: String) -> Data? { FileManager.default.contents(atPath: path) }
}
