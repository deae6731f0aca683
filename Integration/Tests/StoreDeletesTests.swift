import Foundation
import Logging
import Testing
import TributaryAgentCore
import TributaryStore
import TributaryTestSupport

/// The drain's store deletes beside a producer stopped inside its write transaction (LMDB's writer
/// lock held), with real processes: ``StoreDeletes`` bounds the drain's wait.
@Suite("Store deletes beside a stopped writer", .timeLimit(.minutes(2)))
struct StoreDeletesTests {
    static let logger = Logger(label: "test.store-deletes")

    /// A store of `events` events (written by `tributary-sim`), an outbox, and a drain of 20-event chunks
    /// whose deletes wait up to 1 s (a durable delete under the whole suite may take a few hundred ms).
    static func drain(_ group: String, events: Int) async throws -> (SharedStore, Outbox, StoreDeletes, Drainer) {
        try await DeadlineTests.produce(group, events)
        let store = try openExistingStore(group)
        let outbox = try Outbox(path: group + "-outbox.sqlite")
        let deletes = StoreDeletes(patience: .seconds(1), logger: logger)
        return (
            store, outbox, deletes,
            Drainer(store: store, outbox: outbox, chunkSize: 20, logger: logger, deletes: deletes)
        )
    }

    /// Kills the stopped writer and waits up to 30 s for the drain's waiting delete to end.
    static func kill(_ writer: ChildProcess, thenAwaitResumeOf drainer: Drainer) async throws {
        writer.send(SIGKILL)
        await writer.finish()
        for _ in 0..<600 where drainer.isPaused { try await Task.sleep(for: .milliseconds(50)) }
        #expect(!drainer.isPaused, "the delete still waits 30 s after the writer was killed")
    }

    @Test(
        "a delete waits for a stopped writer at most its patience and pauses the drain; it ends by itself once the writer is gone, and a failure it meets then reaches the next drain"
    )
    func boundedWait() async throws {
        try await withTemporaryGroup { group in
            let (store, outbox, deletes, drainer) = try await Self.drain(group, events: 50)

            // The lock free: a chunk moves and leaves the store at once.
            #expect(try drainer.drainChunk() == 20)
            #expect(!drainer.isPaused)
            #expect(try store.status().pendingEvents == 30)

            let writer = try await MultiProcessTests.stoppedWriter(group)
            defer { writer.send(SIGKILL) }

            // Reading needs no lock: the next chunk goes to the outbox; its delete waits, and the drain
            // returns (before, it waited in mdb_txn_begin as long as the writer stayed stopped).
            #expect(try drainer.drainChunk() == 20)
            #expect(drainer.isPaused)
            // Paused: the chunk still in the store is not read again.
            #expect(try drainer.drainChunk() == 0)
            #expect(try drainer.drainAvailable() == 0)
            #expect(try outbox.pending().count == 40)
            #expect(try store.status().pendingEvents == 30)

            // The store's lock file removed (the store being deleted) before the writer goes: the waiting
            // delete then takes the writer lock, finds the store replaced and deletes nothing; the drain
            // that follows reports it.
            #expect(unlink(group + "/" + SharedStore.fileName + "-lock") == 0)
            try await Self.kill(writer, thenAwaitResumeOf: drainer)
            // Its failure is kept for the drain (an I/O error there must reach the agent's fail-stop rule,
            // not be retried), and given once.
            let late = #expect(throws: StoreError.self) { try deletes.rethrowLateFailure() }
            #expect(late?.code == .storeReplaced)
            #expect(throws: Never.self) { try deletes.rethrowLateFailure() }
            // The next drain reads nothing from a replaced store.
            #expect(throws: StoreError.self) { try drainer.drainChunk() }
            #expect(try outbox.pending().count == 40)
        }
    }

    @Test("once the stopped writer is killed, the waiting delete goes through and the drain goes on")
    func resumesAfterWriter() async throws {
        try await withTemporaryGroup { group in
            let (store, outbox, _, drainer) = try await Self.drain(group, events: 50)

            let writer = try await MultiProcessTests.stoppedWriter(group)
            defer { writer.send(SIGKILL) }
            #expect(try drainer.drainAvailable() == 20)
            #expect(drainer.isPaused)

            try await Self.kill(writer, thenAwaitResumeOf: drainer)
            #expect(try store.status().pendingEvents == 30)
            #expect(try drainer.drainAvailable() == 30)
            #expect(try store.status().pendingEvents == 0)
            // Each event once, in order (the killed writer's event was never committed).
            let seqs = try outbox.nextBatch(maxCount: 100, maxBytes: 1 << 24).map(\.seq)
            #expect(seqs == Array(1...50))
        }
    }
}
