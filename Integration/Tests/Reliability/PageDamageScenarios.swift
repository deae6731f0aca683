import Foundation
import Synchronization
import Testing
import TributaryCollector
import TributaryStore
import TributaryTestSupport

extension ReliabilityScenarios {
    /// Random damage to LMDB's own pages (bytes of garbage, pages zeroed or swapped, files cut short),
    /// which LMDB, keeping no page checksums, may walk into a segfault. Each damaged store is judged by a
    /// walk in a child process (`StoreCheck`): the process that asks never crashes, whatever the walk
    /// meets; the agent moves a damaged store aside whole and goes on with a new one.
    @Suite("Reliability: page damage", .serialized, .timeLimit(.minutes(6 * Reliability.soak)))
    struct PageDamageScenarios {
        /// One way to damage a copy of the store.
        enum Damage: CustomStringConvertible, Sendable {
            case garbage(page: Int, offset: Int, bytes: [UInt8])
            case zero(page: Int)
            case copy(from: Int, to: Int)
            case truncate(length: Int)

            var description: String {
                switch self {
                case .garbage(let page, let offset, let bytes): return "\(bytes.count) random bytes at page \(page) + \(offset)"
                case .zero(let page): return "page \(page) zeroed"
                case .copy(let from, let to): return "page \(from) copied over page \(to)"
                case .truncate(let length): return "cut at \(length) bytes"
                }
            }

            func apply(to template: [UInt8], pageSize: Int) -> [UInt8] {
                var bytes = template
                switch self {
                case .garbage(let page, let offset, let garbage):
                    let start = page * pageSize + offset
                    bytes.replaceSubrange(start..<min(bytes.count, start + garbage.count), with: garbage.prefix(bytes.count - start))
                case .zero(let page):
                    bytes.replaceSubrange(page * pageSize..<(page + 1) * pageSize, with: repeatElement(0, count: pageSize))
                case .copy(let from, let to):
                    bytes.replaceSubrange(to * pageSize..<(to + 1) * pageSize, with: template[from * pageSize..<(from + 1) * pageSize])
                case .truncate(let length):
                    bytes.removeLast(bytes.count - length)
                }
                return bytes
            }

            static func random(pages: Int, pageSize: Int, using rng: inout SplitMix64) -> Damage {
                // Mostly tree pages (2 …), now and then a meta page (0, 1).
                func page() -> Int { rng.next() % 10 == 0 ? Int(rng.next() % 2) : 2 + Int(rng.next() % UInt64(pages - 2)) }
                switch rng.next() % 20 {
                case 0..<9:
                    // A page header (its first 16 bytes: number, flags, bounds) or anywhere in the page.
                    let offset = rng.next() % 2 == 0 ? Int(rng.next() % 16) : Int(rng.next() % UInt64(pageSize))
                    let count = 1 + Int(rng.next() % UInt64(rng.next() % 3 == 0 ? pageSize : 16))
                    return .garbage(page: page(), offset: offset, bytes: (0..<count).map { _ in UInt8(truncatingIfNeeded: rng.next()) })
                case 9..<12: return .zero(page: page())
                case 12..<15: return .copy(from: page(), to: page())
                default: return .truncate(length: Int(rng.next() % UInt64(pages * pageSize)))
                }
            }
        }

        /// The verdict of each case, from the threads that judge them.
        final class Verdicts: Sendable {
            let map = Mutex<[Int: StoreCheck.Verdict]>([:])
        }

        @Test("random page bytes and truncations: every copy is judged by a walk in a child, and the process that asks never crashes; the agent sets a damaged store aside and goes on")
        func randomPageDamage() async throws {
            let seed = Reliability.seed()
            var rng = SplitMix64(seed: seed)
            let count = 2_000 * Reliability.soak
            try await withTemporaryGroup { group in
                // A store of a hundred-odd pages: events (overflow pages too), identity, settings, producers.
                let load = try await ChildProcess.run("tributary-sim", ["load", "--group", group, "--count", "600"])
                #expect(load.status == 0, "\(load.stderr)")
                let big = String(repeating: "x", count: 9_000)
                _ = try await ChildProcess.run("tributary", ["track", "--group", group, "Big", "--properties", #"{"text": "\#(big)"}"#])
                _ = try await ChildProcess.run("tributary", ["login", "--group", group, "user-1"])
                _ = try await ChildProcess.run("tributary", ["config", "set", "--group", group, "flush_bulk_size=500"])
                let template = [UInt8](try Data(contentsOf: URL(fileURLWithPath: group + "/" + SharedStore.fileName)))
                let pageSize = Int(getpagesize())
                let pages = template.count / pageSize
                try #require(pages > 40, "a store of \(pages) pages")
                let damages = (0..<count).map { _ in Damage.random(pages: pages, pageSize: pageSize, using: &rng) }
                let root = group + "-cases"
                defer { try? FileManager.default.removeItem(atPath: root) }
                let walker = productsDirectory.appendingPathComponent("tributary").path
                // Two workers, each on a thread of its own (a walk blocks while its child runs), each judging
                // 50 copies at a time: one child walks them in turn, and a new one goes on after a crash.
                let verdicts = Verdicts()
                let workers = 2
                let chunk = 50
                await withTaskGroup(of: Void.self) { tasks in
                    for worker in 0..<workers {
                        tasks.addTask {
                            await withCheckedContinuation { (done: CheckedContinuation<Void, Never>) in
                                Thread {
                                    for start in stride(from: worker * chunk, to: count, by: workers * chunk) {
                                        let indices = Array(start..<min(count, start + chunk))
                                        let directories = indices.map { root + "/case-\($0)" }
                                        for (index, directory) in zip(indices, directories) {
                                            try? FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
                                            let bytes = damages[index].apply(to: template, pageSize: pageSize)
                                            _ = FileManager.default.createFile(atPath: directory + "/" + SharedStore.fileName, contents: Data(bytes))
                                        }
                                        // A walk of this store takes milliseconds; one that loops (LMDB does, on some
                                        // garbage: 3 % of the cases) is damage after 1 s.
                                        let found = StoreCheck.check(groupDirectories: directories, walker: [walker], limit: .seconds(1))
                                        verdicts.map.withLock { map in
                                            for (index, verdict) in zip(indices, found) { map[index] = verdict }
                                        }
                                        for directory in directories { try? FileManager.default.removeItem(atPath: directory) }
                                    }
                                    done.resume()
                                }.start()
                            }
                        }
                    }
                }
                let all = verdicts.map.withLock { $0 }
                #expect(all.count == count)
                let damaged = all.filter { if case .damaged = $0.value { return true } else { return false } }
                let crashed = damaged.filter { if case .damaged(let reason) = $0.value { return reason.contains("crashed inside liblmdb") } else { return false } }
                let looped = damaged.filter { if case .damaged(let reason) = $0.value { return reason.contains("did not end") } else { return false } }
                let unchecked = all.filter { if case .notChecked = $0.value { return true } else { return false } }
                #expect(!damaged.isEmpty, "no damage found in \(count) cases (seed \(seed))")
                #expect(unchecked.isEmpty, "not walked: \(unchecked.prefix(3).map { "\(damages[$0.key]): \($0.value)" }) (seed \(seed))")
                // The agent itself, on some of the damaged copies (those whose walk crashed first): each
                // one is set aside whole and the agent ends its run; a crash of the agent is an exit by signal.
                var sample = Array(crashed.keys.sorted().prefix(5))
                sample += damaged.keys.sorted().filter { !sample.contains($0) }.prefix(8 - sample.count)
                for index in sample {
                    let directory = root + "/case-\(index)"
                    try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
                    let damagedBytes = Data(damages[index].apply(to: template, pageSize: pageSize))
                    try damagedBytes.write(to: URL(fileURLWithPath: directory + "/" + SharedStore.fileName))
                    let agent = try await ChildProcess.run("tributary-agent", [
                        "--group", directory, "--outbox", directory + "-outbox.sqlite", "--server", "http://127.0.0.1:9/sa",
                        "--once", "--deadline", "3", "--log-level", "warning",
                    ])
                    #expect(agent.status == 0, "case \(index) (\(damages[index])): the agent exited \(agent.status): \(agent.stderr) (seed \(seed))")
                    let aside = StoreCheck.setAsideStores(groupDirectory: directory)
                    #expect(aside.count == 1, "case \(index): \(aside)")
                    if let first = aside.first {
                        #expect(try Data(contentsOf: URL(fileURLWithPath: first.directory + "/" + SharedStore.fileName)) == damagedBytes,
                                "case \(index): moved aside whole")
                    }
                    let verify = try await ChildProcess.run("tributary", ["verify", "--group", directory])
                    #expect(verify.status == 0, "case \(index): the new store is intact: \(verify.stderr)")
                }
                Reliability.record(
                    "14 page damage: \(count) copies, \(damaged.count) damaged (\(crashed.count) crashed their walk, \(looped.count) looped), 0 crashes of the asker",
                    iterations: count, verdict: Oracle.Verdict(), seed: seed)
            }
        }
    }
}
