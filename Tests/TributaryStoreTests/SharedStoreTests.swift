import Foundation
import Testing

@testable import TributaryStore

/// The shared store against real LMDB files. The tests are in `SharedStoreTests+*.swift`, a file per concern;
/// the helpers several of those files use are here.
@Suite("Shared store")
struct SharedStoreTests {
    static let producer = SharedStore.Producer(kind: .app, id: "app")

    static func draft(_ body: String) -> SharedStore.Draft {
        SharedStore.Draft(wallTimeMillis: BootClock.wallMillis(), bootTimeNanos: BootClock.nowNanos(), body: Array(body.utf8))
    }

    @discardableResult
    static func append(_ store: SharedStore, _ n: Int, producer: SharedStore.Producer = producer, size: Int = 16) throws
        -> [SharedStore.Appended]
    {
        try store.append(producer: producer, count: n) { i, _ in draft(String(repeating: "x", count: max(0, size - 8)) + "\(i)") }
    }
}
