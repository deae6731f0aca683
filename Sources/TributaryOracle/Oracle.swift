import Foundation
import GRDB
import TributaryCollector
import TributaryStore

/// The one oracle every reliability scenario is judged by (Jepsen's total-queue checker, adapted).
///
/// Inputs: what each producer was told was durable (its `--ledger`: `producer_seq seq event_id` lines)
/// and what the collector accepted (its unique events in arrival order, and how many events it saw a
/// second time on the wire). Output: a ``Verdict`` with every count of the reliability table.
///
/// A scenario passes when nothing acknowledged is lost, nothing unexpected arrives, nothing is listed
/// twice after dedup, each producer's events arrive in `producer_seq` order and the batches in global
/// `seq` order, wire duplicates stay within one in-flight batch per crash, and the health checks of the
/// store and the outbox pass.
public struct Oracle: Sendable {
    /// One producer's ledger file.
    public struct Ledger: Sendable {
        /// The producer id the events carry (`_tributary.producer`).
        public var producer: String
        /// The ledger file (`tributary-sim load --ledger`).
        public var path: String

        public init(producer: String, path: String) {
            self.producer = producer
            self.path = path
        }

        /// The acknowledged events, in the order the producer was told.
        public func entries() -> [(producerSeq: UInt64, seq: UInt64, eventID: String)] {
            lines().map { ($0.producerSeq, $0.seq, $0.eventID) }
        }

        /// The ledger's lines: `producer_seq seq event_id`, then the `distinct_id` the event was stored
        /// under as a JSON string when the producer records it (`tributary-sim`'s ledgers do): what the
        /// collector must receive it with.
        fileprivate func lines() -> [(producerSeq: UInt64, seq: UInt64, eventID: String, distinctID: String?)] {
            let text = (try? String(contentsOfFile: path, encoding: .utf8)) ?? ""
            return text.split(separator: "\n").compactMap { line in
                let parts = line.split(separator: " ", maxSplits: 3)
                guard parts.count >= 3, let p = UInt64(parts[0]), let s = UInt64(parts[1]) else { return nil }
                let distinctID = parts.count == 4
                    ? (try? JSONSerialization.jsonObject(with: Data(parts[3].utf8), options: .fragmentsAllowed)) as? String
                    : nil
                return (p, s, String(parts[2]), distinctID)
            }
        }
    }

    /// One event the collector accepted (first arrival; later copies were deduplicated).
    public struct Delivery: Sendable {
        public var eventID: String
        public var producer: String?
        public var producerSeq: UInt64?
        public var seq: UInt64?
        /// The `distinct_id` the event arrived with.
        public var distinctID: String?
        /// `_tributary.producer_kind` (`app`, `extension`, `hybrid`).
        public var producerKind: String?
        /// Whether the event carries `_hybrid_h5: true` at its top level and not among its properties,
        /// as the Sensors SDKs mark an event a hybrid page sent.
        public var markedH5 = false

        public init(
            eventID: String, producer: String?, producerSeq: UInt64?, seq: UInt64?, distinctID: String? = nil,
            producerKind: String? = nil, markedH5: Bool = false
        ) {
            self.eventID = eventID
            self.producer = producer
            self.producerSeq = producerSeq
            self.seq = seq
            self.distinctID = distinctID
            self.producerKind = producerKind
            self.markedH5 = markedH5
        }

        /// Reads a collector's event: its indexed fields and, from its JSON, identity, kind and H5 mark.
        init(_ received: ReceivedEvent) {
            let object = try? received.jsonObject()
            let properties = object?["properties"] as? [String: Any]
            self.init(
                eventID: received.eventID, producer: received.producer, producerSeq: received.producerSeq,
                seq: received.seq, distinctID: object?["distinct_id"] as? String,
                producerKind: (object?["_tributary"] as? [String: Any])?["producer_kind"] as? String,
                markedH5: object?["_hybrid_h5"] as? Bool == true && properties?["_hybrid_h5"] == nil)
        }
    }

    /// What the collector saw.
    public struct Observed: Sendable {
        /// Unique events, in arrival order.
        public var deliveries: [Delivery]
        /// Events that arrived again after they were stored (accepted twice on the wire).
        public var wireDuplicates: Int

        public init(deliveries: [Delivery], wireDuplicates: Int) {
            self.deliveries = deliveries
            self.wireDuplicates = wireDuplicates
        }

        /// Reads the collector's unique events and duplicate count.
        public static func from(_ collector: RunningCollector) async throws -> Observed {
            try await from(collector.collector)
        }

        /// Reads the unique events and duplicate count of a collector, running or not (a collector made
        /// on a database file reads what that file holds: `tributary-sim judge --collector-db`).
        public static func from(_ collector: Collector) async throws -> Observed {
            let events = try await collector.events()
            let stats = try await collector.stats()
            return Observed(deliveries: events.map(Delivery.init), wireDuplicates: stats.duplicates)
        }
    }

    /// The scenario's judgement, with every figure of its table row.
    public struct Verdict: Sendable, CustomStringConvertible {
        public var acknowledged = 0
        public var delivered = 0
        public var lost = 0
        public var unexpected = 0
        public var wireDuplicates = 0
        public var allowedWireDuplicates = 0
        public var duplicatesAfterDedup = 0
        public var producerOrderViolations = 0
        public var seqOrderViolations = 0
        /// Events that arrived under another identity than the one their producer stored them under
        /// (its ledger's `distinct_id`): attributed to the wrong person.
        public var misattributed = 0
        /// Events whose H5 mark is wrong: a hybrid producer's without `_hybrid_h5: true` at the top level
        /// (or with it among its properties, where a Sensors server does not look), or another producer's
        /// with it.
        public var mismarkedH5 = 0
        /// Events of a cut producer (``Oracle/cutProducers``) its ledger does not list: past the last one
        /// it lists, or below it up to one fewer than the producer's callers (``Oracle/cutCallers``).
        /// Stored when the power went, their acknowledgement never written. Allowed, not unexpected.
        public var unacknowledgedTail = 0
        /// Of ``unacknowledgedTail``, those below the last event their producer's ledger lists (a
        /// concurrent caller's line still in the machine while another's, for a later event, had left).
        public var unlistedBelowLast = 0
        /// Failed health checks, each a sentence.
        public var healthProblems: [String] = []
        /// Up to five lost event ids, for the failure message.
        public var lostExamples: [String] = []

        /// An empty verdict (every count zero), for scenarios that count by themselves.
        public init() {}

        /// Every order violation, per producer and by global seq.
        public var orderViolations: Int { producerOrderViolations + seqOrderViolations }

        /// Whether the scenario upheld every promise.
        public var passed: Bool {
            lost == 0 && unexpected == 0 && duplicatesAfterDedup == 0 && orderViolations == 0 && misattributed == 0
                && mismarkedH5 == 0
                && wireDuplicates <= allowedWireDuplicates && healthProblems.isEmpty
        }

        public var description: String {
            var text = "acknowledged \(acknowledged), delivered \(delivered), lost \(lost), unexpected \(unexpected), "
                + "wire duplicates \(wireDuplicates) (allowed \(allowedWireDuplicates)), duplicates after dedup "
                + "\(duplicatesAfterDedup), producer order violations \(producerOrderViolations), seq order "
                + "violations \(seqOrderViolations), misattributed \(misattributed)"
            if mismarkedH5 > 0 { text += ", mismarked H5 \(mismarkedH5)" }
            if unacknowledgedTail > 0 {
                text += ", unacknowledged tail of cut producers \(unacknowledgedTail)"
                if unlistedBelowLast > 0 { text += " (\(unlistedBelowLast) below a ledger's last line)" }
            }
            if !lostExamples.isEmpty { text += "; lost e.g. \(lostExamples.joined(separator: ", "))" }
            if !healthProblems.isEmpty { text += "; health: " + healthProblems.joined(separator: "; ") }
            return text
        }
    }

    public var ledgers: [Ledger]
    /// Events the scenario expects to be dead-lettered rather than delivered (poison, too large).
    public var expectedUndelivered: Set<String> = []
    /// Producers whose events nobody recorded in a ledger (a `tributary track` one-off): never "unexpected".
    public var unledgeredProducers: Set<String> = []
    /// Lost acknowledgements, cancelled requests and clean stops: each may repeat at most one in-flight batch.
    public var inFlightWindows = 0
    /// Agent processes that ended without a clean stop (SIGKILL, SIGABRT, a fail-stop on an I/O error):
    /// each may repeat two batches, the last one acknowledged (its rows are deleted while the next one's
    /// request is out: docs/outbox.md, "The acknowledgement follows the next request") and that next one.
    public var crashWindows = 0
    /// The agent's batch size (`--batch-size`): the most one in-flight batch can repeat.
    public var batchSize = 500
    /// Producers a power cut ended. Each may have stored events whose `track()` had returned but whose
    /// ledger line never left the machine (or whose `track()` had not returned yet): those past the last
    /// `producer_seq` its ledger lists may arrive without being unexpected (``Verdict/unacknowledgedTail``).
    public var cutProducers: Set<String> = []
    /// How many `track()` callers each cut producer had at once (group-committed callers: `tributary-sim
    /// load --concurrency`); one for a producer not named. Each caller writes its own ledger line once
    /// its `track()` returned, so when the power went a caller's event could be stored with its line not
    /// out yet while another caller's line, for a later event, had left: up to one fewer than its callers
    /// of a cut producer's unlisted events may lie below the last line its ledger lists; more there are
    /// unexpected. (Past the last line any number is allowed: a ledger line written but still queued in
    /// the machine when the power went is lost with it.) ``CutCallersRule`` resolves `--cut-callers`.
    public var cutCallers: [String: Int] = [:]

    public init(ledgers: [Ledger]) {
        self.ledgers = ledgers
    }

    /// Judges what the collector observed against the ledgers (no health checks: see ``checkHealth``).
    public func judge(_ observed: Observed) -> Verdict {
        var verdict = Verdict()
        var acknowledged: [String: (producer: String, producerSeq: UInt64)] = [:]
        var identities: [String: String] = [:]
        var lastLedgered: [String: UInt64] = [:]
        for ledger in ledgers {
            for line in ledger.lines() {
                acknowledged[line.eventID] = (ledger.producer, line.producerSeq)
                lastLedgered[ledger.producer] = max(line.producerSeq, lastLedgered[ledger.producer, default: 0])
                if let distinctID = line.distinctID, identities[line.eventID] == nil {
                    identities[line.eventID] = distinctID
                }
            }
        }
        verdict.acknowledged = acknowledged.count
        // A ledger's producer creates it when it starts: a missing one means a wrong path or a producer
        // that never ran, and a run in which nothing at all was acknowledged tested nothing.
        for ledger in ledgers where !FileManager.default.fileExists(atPath: ledger.path) {
            verdict.healthProblems.append("no ledger at \(ledger.path) (producer \(ledger.producer))")
        }
        if !ledgers.isEmpty && acknowledged.isEmpty {
            verdict.healthProblems.append("no producer acknowledged any event")
        }
        verdict.wireDuplicates = observed.wireDuplicates
        verdict.allowedWireDuplicates = (inFlightWindows + 2 * crashWindows) * batchSize

        var seen = Set<String>()
        var unlistedBelowLast: [String: Int] = [:]
        var lastProducerSeq: [String: UInt64] = [:]
        var lastSeq: UInt64 = 0
        for delivery in observed.deliveries {
            guard seen.insert(delivery.eventID).inserted else {
                verdict.duplicatesAfterDedup += 1
                continue
            }
            verdict.delivered += 1
            if let stored = identities[delivery.eventID], delivery.distinctID != stored { verdict.misattributed += 1 }
            if let kind = delivery.producerKind, delivery.markedH5 != (kind == "hybrid") { verdict.mismarkedH5 += 1 }
            if acknowledged[delivery.eventID] == nil, !unledgeredProducers.contains(delivery.producer ?? ""),
                !expectedUndelivered.contains(delivery.eventID)
            {
                if let producer = delivery.producer, cutProducers.contains(producer),
                    let producerSeq = delivery.producerSeq
                {
                    let callers = max(1, cutCallers[producer] ?? 1)
                    if producerSeq > lastLedgered[producer, default: 0] {
                        verdict.unacknowledgedTail += 1
                    } else if unlistedBelowLast[producer, default: 0] < callers - 1 {
                        unlistedBelowLast[producer, default: 0] += 1
                        verdict.unlistedBelowLast += 1
                        verdict.unacknowledgedTail += 1
                    } else {
                        verdict.unexpected += 1
                    }
                } else {
                    verdict.unexpected += 1
                }
            }
            if let producer = delivery.producer, let producerSeq = delivery.producerSeq {
                if producerSeq <= lastProducerSeq[producer, default: 0] { verdict.producerOrderViolations += 1 }
                lastProducerSeq[producer] = max(producerSeq, lastProducerSeq[producer, default: 0])
            }
            if let seq = delivery.seq {
                if seq <= lastSeq { verdict.seqOrderViolations += 1 }
                lastSeq = max(seq, lastSeq)
            }
        }
        for (id, _) in acknowledged where !seen.contains(id) && !expectedUndelivered.contains(id) {
            verdict.lost += 1
            if verdict.lostExamples.count < 5 { verdict.lostExamples.append(id) }
        }
        return verdict
    }

    /// Judges a run against the collector and checks the store and outbox health.
    public func judge(
        _ collector: RunningCollector, group: String? = nil, outbox: String? = nil, maxStoreBytes: Int = 64 << 20
    ) async throws -> Verdict {
        var verdict = judge(try await Observed.from(collector))
        verdict.healthProblems += Self.healthProblems(group: group, outbox: outbox, maxStoreBytes: maxStoreBytes)
        return verdict
    }

    /// The store's and the outbox's health checks; empty when all pass.
    ///
    /// - outbox: SQLite `PRAGMA integrity_check` must answer `ok`;
    /// - store: no reader slot may belong to a dead process (a stale slot pins pages and grows the
    ///   file), and the data file must stay within `maxStoreBytes`.
    public static func healthProblems(group: String?, outbox: String?, maxStoreBytes: Int = 64 << 20) -> [String] {
        var problems: [String] = []
        if let outbox {
            problems += outboxProblems(outbox)
        }
        if let group {
            do {
                let store = try openExistingStore(group)
                let stale = staleReaderSlots(store)
                if !stale.isEmpty { problems.append("stale LMDB reader slots of dead processes: \(stale)") }
                let size = try store.status().fileSize
                if size > maxStoreBytes { problems.append("store file is \(size) bytes, over the bound \(maxStoreBytes)") }
            } catch {
                problems.append("the store cannot be opened: \(error)")
            }
        }
        return problems
    }

    /// SQLite's own verdict on the outbox file; empty when it says `ok`. A missing file is a problem
    /// too: a scenario that names an outbox expects one (a wrong path must not pass as healthy).
    public static func outboxProblems(_ path: String) -> [String] {
        guard FileManager.default.fileExists(atPath: path) else { return ["no outbox at \(path)"] }
        do {
            var configuration = Configuration()
            configuration.readonly = true
            let queue = try DatabaseQueue(path: path, configuration: configuration)
            let answer = try queue.read { db in try String.fetchAll(db, sql: "PRAGMA integrity_check") }
            return answer == ["ok"] ? [] : ["outbox integrity_check: \(answer.joined(separator: "; "))"]
        } catch {
            return ["the outbox cannot be checked: \(error)"]
        }
    }

    /// Reader slots whose process is gone (`mdb_reader_list` lines "pid thread txnid").
    public static func staleReaderSlots(_ store: SharedStore) -> [String] {
        store.readerSlots().filter { line in
            guard let pid = line.split(separator: " ").first.flatMap({ Int32($0) }) else { return false }
            return kill(pid, 0) != 0 && errno == ESRCH
        }
    }
}

/// Opens the group's store without creating anything (a missing store is an error, not a new one).
public func openExistingStore(_ group: String) throws -> SharedStore {
    var options = SharedStore.Options()
    options.create = false
    return try SharedStore(groupDirectory: group, options: options)
}
