import Foundation
import GRDB
import Tributary
import TributaryStore

/// Backlogs for the agent benchmarks: a store full of real producer events, filled fast and copied
/// for every run, and the checks that a run left nothing behind.
///
/// A backlog is filled once per size with `SharedStore.append` in transactions of 10,000 events
/// (not durable while filling; the file is fsynced at the end), which is the producer path with
/// big group commits: the records are exactly what a `Tracker` writes. Every event is the body a
/// real `Tracker` produced for ``BenchEvent`` (719 bytes of JSON with presets, identity, `_track_id`),
/// with its own `event_id`. Each run gets a byte-for-byte copy of the backlog file (fsynced, so the
/// run does not pay for writing back the copy), so the Swift and C drains of a repetition start from
/// the same store and must produce the same outbox.
enum Backlog {
    /// The producer id of every backlog event.
    static let producerID = "bench-app"

    /// Fills `group` with `events` app events; returns their record size in bytes (all are alike).
    static func fill(group: String, events: Int, mapSize: Int, template: [UInt8]) throws -> Double {
        let body = try EventTemplate(template)
        let prefix = Array(UUID().uuidString.lowercased().utf8.prefix(24))  // "xxxxxxxx-xxxx-4xxx-yxxx-"
        do {
            var options = StoreCheck.options(mapSize: mapSize, create: true)
            options.durable = false
            let store = try SharedStore(groupDirectory: group, options: options)
            _ = try store.identity()
            let producer = SharedStore.Producer(kind: .app, id: producerID)
            var written = 0
            while written < events {
                let count = min(10_000, events - written)
                // One clock reading per transaction: the wall and boot times of a record must agree,
                // or the agent takes the event for one recorded before a clock change and rewrites it.
                let wall = BootClock.wallMillis()
                let boot = BootClock.nowNanos()
                let first = written
                _ = try store.append(producer: producer, count: count) { index, _ in
                    SharedStore.Draft(
                        wallTimeMillis: wall, bootTimeNanos: boot, body: body.make(prefix: prefix, index: first + index)
                    )
                }
                written += count
            }
        }
        try syncFile(group + "/" + SharedStore.fileName)
        let status = try SharedStore(
            groupDirectory: group, options: StoreCheck.options(mapSize: mapSize, create: false)
        )
        .status()
        guard status.pendingEvents == events, status.lastAssignedSeq == UInt64(events) else {
            throw BenchFailure("backlog \(group): filled \(events) events, the store holds \(status.pendingEvents).")
        }
        let recordSize = 54 + producerID.utf8.count + body.size
        return Double(recordSize)
    }

    /// One real `Tracker` event body for ``BenchEvent``, read back from a scratch store.
    static func trackerBody(scratch: String) throws -> [UInt8] {
        let group = scratch + "/template"
        defer { try? FileManager.default.removeItem(atPath: group) }
        do {
            let tracker = try Tracker(
                configuration: Tracker.Configuration(groupDirectory: group, producerID: producerID))
            try tracker.track(BenchEvent.name, properties: BenchEvent.properties(index: 0))
        }
        let store = try SharedStore(
            groupDirectory: group, options: StoreCheck.options(mapSize: 32 << 20, create: false))
        guard let first = try store.events(limit: 1).first, case .success(let record) = first.record else {
            throw BenchFailure("could not read back the template event.")
        }
        return record.body
    }

    /// Copies the backlog file of `source` into a new group directory `destination` and fsyncs it.
    static func copy(from source: String, to destination: String) throws {
        guard mkdir(destination, 0o770) == 0 else {
            throw BenchFailure("mkdir \(destination): \(String(cString: strerror(errno))).")
        }
        let from = source + "/" + SharedStore.fileName
        let to = destination + "/" + SharedStore.fileName
        try FileManager.default.copyItem(atPath: from, toPath: to)
        chmod(to, 0o660)
        try syncFile(to)
    }

    /// fsync: the file's pages are on disk before the measured run starts.
    static func syncFile(_ path: String) throws {
        let fd = open(path, O_RDONLY)
        guard fd >= 0 else { throw BenchFailure("open \(path): \(String(cString: strerror(errno))).") }
        defer { close(fd) }
        guard fsync(fd) == 0 else { throw BenchFailure("fsync \(path): \(String(cString: strerror(errno))).") }
    }

    /// Events left in the store of `group`.
    static func pendingInStore(group: String) throws -> Int {
        let store = try SharedStore(
            groupDirectory: group, options: StoreCheck.options(mapSize: 32 << 20, create: false))
        return try store.status().pendingEvents
    }
}

/// A Tracker event body with a slot for its `event_id` (a 36-character UUID).
struct EventTemplate {
    private let bytes: [UInt8]
    private let idOffset: Int
    var size: Int { bytes.count }

    init(_ body: [UInt8]) throws {
        let key = Array("\"event_id\":\"".utf8)
        guard let found = body.indices.first(where: { body[$0...].starts(with: key) }),
            body.count >= found + key.count + 37, body[found + key.count + 36] == UInt8(ascii: "\"")
        else { throw BenchFailure("the template event has no 36-character event_id.") }
        bytes = body
        idOffset = found + key.count
    }

    /// The body with event id `prefix` (24 bytes) followed by `index` as 12 hex digits.
    func make(prefix: [UInt8], index: Int) -> [UInt8] {
        var out = bytes
        let digits = Array("0123456789abcdef".utf8)
        out.withUnsafeMutableBufferPointer { buffer in
            for i in 0..<24 { buffer[idOffset + i] = prefix[i] }
            var value = index
            for i in stride(from: 35, through: 24, by: -1) {
                buffer[idOffset + i] = digits[value & 15]
                value >>= 4
            }
        }
        return out
    }
}

/// What a run left in an outbox (the driver's own reading, with plain SQL).
struct OutboxContents {
    var rows: Int
    var minSeq: Int64
    var maxSeq: Int64
    var distinctEventIDs: Int
    var deadLetters: Int
    var state: [String: Int64]

    init(path: String) throws {
        let queue = try DatabaseQueue(path: path)
        self = try queue.read { db in
            let row = try Row.fetchOne(
                db,
                sql:
                    "SELECT COUNT(*), COALESCE(MIN(seq), 0), COALESCE(MAX(seq), 0), COUNT(DISTINCT event_id) FROM outbox"
            )
            guard let row else { throw BenchFailure("\(path): no answer to SELECT COUNT(*).") }
            var state: [String: Int64] = [:]
            for pair in try Row.fetchAll(db, sql: "SELECT key, value FROM agent_state") {
                let key: String = pair[0]
                let value: Int64 = pair[1]
                state[key] = value
            }
            return OutboxContents(
                rows: row[0], minSeq: row[1], maxSeq: row[2], distinctEventIDs: row[3],
                deadLetters: try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM dead_letters") ?? 0, state: state)
        }
    }

    init(rows: Int, minSeq: Int64, maxSeq: Int64, distinctEventIDs: Int, deadLetters: Int, state: [String: Int64]) {
        self.rows = rows
        self.minSeq = minSeq
        self.maxSeq = maxSeq
        self.distinctEventIDs = distinctEventIDs
        self.deadLetters = deadLetters
        self.state = state
    }

    /// Checks that the outbox holds exactly the drained events 1…`events`, each once, and no dead letter.
    func verifyDrained(_ events: Int, name: String) throws {
        guard rows == events, minSeq == 1, maxSeq == Int64(events), distinctEventIDs == events, deadLetters == 0,
            state["last_drained_seq"] == Int64(events), state["drained"] == Int64(events)
        else {
            throw BenchFailure(
                "\(name): expected \(events) rows (seq 1…\(events)); the outbox has \(rows) rows, seq \(minSeq)…\(maxSeq), "
                    + "\(distinctEventIDs) distinct event ids, \(deadLetters) dead letters, state \(state).")
        }
    }

    /// Checks that two outboxes hold the same rows, column by column.
    static func verifySame(_ a: String, _ b: String, events: Int) throws {
        let queue = try DatabaseQueue(path: a)
        let same = try queue.inDatabase { db -> Int in
            try db.execute(sql: "ATTACH DATABASE ? AS other", arguments: [b])
            defer { try? db.execute(sql: "DETACH DATABASE other") }
            return try Int.fetchOne(
                db,
                sql: """
                    SELECT COUNT(*) FROM main.outbox a JOIN other.outbox b ON a.id = b.id
                    WHERE a.seq = b.seq AND a.event_id = b.event_id AND a.producer = b.producer
                        AND a.producer_kind = b.producer_kind AND a.producer_seq = b.producer_seq AND a.wall_ms = b.wall_ms
                        AND a.boot_ns = b.boot_ns AND a.boot_id = b.boot_id AND a.body = b.body
                    """) ?? 0
        }
        guard same == events else {
            throw BenchFailure("the outboxes \(a) and \(b) differ: \(same) of \(events) rows are identical.")
        }
    }
}
