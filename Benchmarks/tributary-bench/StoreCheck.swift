import CLMDB
import Foundation
import TributaryStore

/// The driver's own look at a run's store: creating it before the producers start, counting write
/// transactions, and verifying afterwards that it holds exactly what the producers acknowledged.
///
/// lmdb.h: "Do not have open an LMDB database twice in the same process at the same time." Each
/// helper here opens the store, uses it and closes it before returning, and never while another
/// helper has it open; the producers are other processes, for which concurrent opens are the point.
enum StoreCheck {
    /// Store options for a run: one map big enough for the whole run, so nobody grows it mid-run.
    static func options(mapSize: Int, create: Bool) -> SharedStore.Options {
        var options = SharedStore.Options()
        options.initialMapSize = mapSize
        options.quota = mapSize
        options.create = create
        return options
    }

    /// Creates the store (tables, schema version, identity) so that the producers' own opens write nothing.
    static func prepare(group: String, mapSize: Int) throws {
        let store = try SharedStore(groupDirectory: group, options: options(mapSize: mapSize, create: true))
        _ = try store.identity()
    }

    /// The id of the last committed write transaction (`mdb_env_info`), to count a run's transactions.
    static func lastTransactionID(group: String) throws -> Int {
        var env: OpaquePointer?
        try lmdb(mdb_env_create(&env), "mdb_env_create")
        defer { mdb_env_close(env) }
        try lmdb(mdb_env_set_maxdbs(env, 8), "mdb_env_set_maxdbs")
        let path = group + "/" + SharedStore.fileName
        try lmdb(mdb_env_open(env, path, UInt32(MDB_NOSUBDIR | MDB_NOTLS | MDB_RDONLY), 0o660), "mdb_env_open")
        var info = MDB_envinfo()
        try lmdb(mdb_env_info(env, &info), "mdb_env_info")
        return info.me_last_txnid
    }

    /// What a verified store holds.
    struct Contents {
        var events: Int
        /// Mean size of an event record in bytes (header, producer id and JSON body).
        var meanRecordSize: Double
    }

    /// Checks that the store holds exactly `expected[producer]` events of each producer, under the
    /// global sequence numbers 1…total with no gap, each record intact (CRC) and each producer's own
    /// sequence gap-free in commit order; throws a ``BenchFailure`` naming the first violation.
    static func verify(group: String, mapSize: Int, expected: [String: Int]) throws -> Contents {
        let store = try SharedStore(groupDirectory: group, options: options(mapSize: mapSize, create: false))
        let total = expected.values.reduce(0, +)
        let status = try store.status()
        guard status.pendingEvents == total, status.lastAssignedSeq == UInt64(total) else {
            throw BenchFailure(
                "\(group): expected \(total) events, last_seq \(total); the store holds \(status.pendingEvents), "
                    + "last_seq \(status.lastAssignedSeq).")
        }
        var next: UInt64 = 1
        var producerSeqs: [String: UInt64] = [:]
        var recordBytes = 0
        while next <= UInt64(total) {
            let page = try store.events(from: next, limit: 10_000)
            guard !page.isEmpty else { throw BenchFailure("\(group): no events from seq \(next) on.") }
            for event in page {
                guard event.seq == next else {
                    throw BenchFailure("\(group): seq \(next) is missing (found \(event.seq) next).")
                }
                let record: EventRecord
                switch event.record {
                case .success(let decoded): record = decoded
                case .failure(let corruption): throw BenchFailure("\(group): seq \(event.seq) is corrupt: \(corruption).")
                }
                let expectedSeq = producerSeqs[record.producerID, default: 0] + 1
                guard record.producerSeq == expectedSeq else {
                    throw BenchFailure(
                        "\(group): seq \(event.seq) has producer_seq \(record.producerSeq) of \(record.producerID), "
                            + "expected \(expectedSeq).")
                }
                producerSeqs[record.producerID] = expectedSeq
                recordBytes += record.encodedSize
                next += 1
            }
        }
        let counted = producerSeqs.mapValues(Int.init)
        guard counted == expected else {
            throw BenchFailure("\(group): events per producer \(counted.sorted { $0.key < $1.key }), expected \(expected.sorted { $0.key < $1.key }).")
        }
        for registration in status.producers where expected[registration.id] != Int(registration.lastSeq) {
            throw BenchFailure(
                "\(group): producer \(registration.id) is registered with last seq \(registration.lastSeq), "
                    + "expected \(expected[registration.id] ?? 0).")
        }
        return Contents(events: total, meanRecordSize: total == 0 ? 0 : Double(recordBytes) / Double(total))
    }

    private static func lmdb(_ rc: Int32, _ call: String) throws {
        guard rc != MDB_SUCCESS else { return }
        throw BenchFailure("\(call) failed: \(String(cString: mdb_strerror(rc))) (\(rc)).")
    }
}
