import Foundation
import Synchronization
import Testing
import Tributary
import TributaryStore
import TributaryTestSupport

/// A clock the test moves by hand.
final class ManualClock: Sendable {
    private let nanos = Mutex<UInt64>(1_000_000_000)
    func advance(seconds: Double) { nanos.withLock { $0 += UInt64(seconds * 1e9) } }
    var now: UInt64 { nanos.withLock { $0 } }
}

@Suite("Tracker")
struct TrackerTests {
    static func tracker(_ group: String, clock: ManualClock? = nil, kind: ProducerKind = .app) throws -> Tracker {
        var config = Tracker.Configuration(groupDirectory: group, producerKind: kind)
        config.appVersion = "2.3.4"
        if let clock { config.monotonicNanos = { clock.now } }
        return try Tracker(configuration: config)
    }

    static func body(_ store: SharedStore, seq: UInt64) throws -> [String: Any] {
        let entry = try #require(try store.events(from: seq, limit: 1).first)
        let record = try entry.record.get()
        return try #require(try JSONSerialization.jsonObject(with: Data(record.body)) as? [String: Any])
    }

    @Test("an event has the Sensors shape, presets, and the header fields")
    func eventShape() throws {
        try withTemporaryGroup { group in
            let tracker = try Self.tracker(group)
            let before = BootClock.wallMillis()
            let receipt = try tracker.track("BuyProduct", properties: ["price": 9.99, "sku": "A-1", "tags": ["x"]])
            let body = try Self.body(tracker.store, seq: receipt.seq)
            #expect(body["type"] as? String == "track")
            #expect(body["event"] as? String == "BuyProduct")
            #expect(body["event_id"] as? String == receipt.eventID)
            #expect((body["_track_id"] as? NSNumber)?.int64Value == receipt.trackID)
            let time = try #require((body["time"] as? NSNumber)?.int64Value)
            #expect(time >= before && time <= BootClock.wallMillis())
            let identity = try tracker.identity()
            #expect(body["distinct_id"] as? String == identity.anonymousID)
            #expect(body["anonymous_id"] as? String == identity.anonymousID)
            #expect(body["login_id"] == nil)
            let lib = try #require(body["lib"] as? [String: Any])
            #expect(lib["$lib"] as? String == "Linux")
            #expect(lib["$lib_method"] as? String == "code")
            #expect(lib["$app_version"] as? String == "2.3.4")
            let props = try #require(body["properties"] as? [String: Any])
            #expect(props["price"] as? Double == 9.99)
            #expect(props["sku"] as? String == "A-1")
            #expect(props["tags"] as? [String] == ["x"])
            for key in ["$os", "$os_version", "$model", "$manufacturer", "$app_version", "$lib", "$lib_version", "$device_id"] {
                #expect(props[key] is String, "missing preset \(key)")
            }
            #expect(props["$device_id"] as? String == identity.deviceID)

            let record = try #require(try tracker.store.events(from: receipt.seq, limit: 1).first).record.get()
            #expect(record.producerKind == .app && record.producerID == "app" && record.pid == getpid())
            #expect(record.producerSeq == receipt.producerSeq)
            #expect(record.bootID == BootID.current)
            #expect(record.wallTimeMillis == time)
        }
    }

    @Test("super properties override presets; event properties override both")
    func propertyPrecedence() throws {
        try withTemporaryGroup { group in
            let tracker = try Self.tracker(group)
            try tracker.registerSuperProperties(["channel": "store", "$app_version": "9.9", "plan": "free"])
            let r1 = try tracker.track("A", properties: ["plan": "pro"])
            let p1 = try #require(try Self.body(tracker.store, seq: r1.seq)["properties"] as? [String: Any])
            #expect(p1["channel"] as? String == "store")
            #expect(p1["$app_version"] as? String == "9.9")
            #expect(p1["plan"] as? String == "pro")
            tracker.unregisterSuperProperty("channel")
            let r2 = try tracker.track("A")
            let p2 = try #require(try Self.body(tracker.store, seq: r2.seq)["properties"] as? [String: Any])
            #expect(p2["channel"] == nil && p2["plan"] as? String == "free")
            tracker.clearSuperProperties()
            #expect(tracker.superProperties.isEmpty)
            #expect(throws: TrackingError.self) { try tracker.registerSuperProperties(["time": 1]) }
        }
    }

    @Test("properties are written once each, sorted by key, base and own merged")
    func propertiesSortedAndMerged() throws {
        try withTemporaryGroup { group in
            let tracker = try Self.tracker(group)
            try tracker.registerSuperProperties(["mid": "super", "plan": "pro"])
            let receipt = try tracker.track("Sorted", properties: ["zz_last": 1, "a_first": true, "mid": "own"])
            let entry = try #require(try tracker.store.events(from: receipt.seq, limit: 1).first)
            let text = String(decoding: try entry.record.get().body, as: UTF8.self)
            let properties = try #require(text.range(of: "\"properties\":{")).upperBound
            let object = String(text[properties...])
            func position(_ key: String) throws -> String.Index {
                let ranges = object.ranges(of: "\"\(key)\":")
                try #require(ranges.count == 1, "\(key) appears \(ranges.count) times in \(object)")
                return ranges[0].lowerBound
            }
            let keys = ["$app_version", "$os", "a_first", "mid", "plan", "zz_last"]
            let positions = try keys.map(position)
            #expect(positions == positions.sorted(), "properties out of order: \(object)")
            #expect(object.contains("\"mid\":\"own\""))
        }
    }

    @Test("login and logout change distinct_id of later events, for every tracker of the group")
    func identityAcrossTrackers() throws {
        try withTemporaryGroup { group in
            let app = try Self.tracker(group)
            let ext = try Self.tracker(group, kind: .extension)
            try app.login("user-7")
            let r1 = try ext.track("Shared")
            let b1 = try Self.body(app.store, seq: r1.seq)
            #expect(b1["distinct_id"] as? String == "user-7")
            #expect(b1["login_id"] as? String == "user-7")
            try ext.logout()
            let r2 = try app.track("Shared")
            let b2 = try Self.body(app.store, seq: r2.seq)
            #expect(b2["distinct_id"] as? String == b2["anonymous_id"] as? String)
            #expect(b2["login_id"] == nil)
            #expect(throws: TrackingError.self) { try app.login("") }
        }
    }

    @Test("an identity change waits for the events queued before it: they keep the identity they were tracked under")
    func identityAfterQueued() async throws {
        try await withTemporaryGroup { group in
            let app = try Self.tracker(group)
            func loginIDs(_ pending: [PendingTrack]) async throws -> Set<String> {
                var ids: Set<String> = []
                for p in pending { ids.insert(try Self.body(app.store, seq: try await p.receipt().seq)["login_id"] as? String ?? "-") }
                return ids
            }
            var before: [PendingTrack] = []
            for i in 0..<1_000 { before.append(try await app.enqueue("BeforeLogin", properties: ["i": .int(Int64(i))])) }
            try app.login("user-7")
            var during: [PendingTrack] = []
            for _ in 0..<1_000 { during.append(try await app.enqueue("LoggedIn")) }
            try app.logout()
            let after = try await app.track("AfterLogout")
            #expect(try await loginIDs(before) == ["-"])
            #expect(try await loginIDs(during) == ["user-7"])
            #expect(try Self.body(app.store, seq: after.seq)["login_id"] == nil)
            try app.identify(anonymousID: "device-42")
            #expect(try Self.body(app.store, seq: (try await app.track("Identified")).seq)["anonymous_id"] as? String == "device-42")
        }
    }

    @Test("invalid input writes nothing")
    func invalidWritesNothing() async throws {
        try await withTemporaryGroup { group in
            let tracker = try Self.tracker(group)
            try await tracker.track("Ok")
            await #expect(throws: TrackingError.self) { try await tracker.track("bad name") }
            await #expect(throws: TrackingError.self) { try await tracker.track("Ok", properties: ["x": .double(.nan)]) }
            await #expect(throws: TrackingError.self) { try await tracker.track("Ok", properties: ["big": .string(String(repeating: "x", count: 9000))]) }
            #expect(try tracker.store.status().pendingEvents == 1)
        }
    }

    @Test("an oversized event is refused with its size and the limit")
    func eventTooLarge() throws {
        try withTemporaryGroup { group in
            var config = Tracker.Configuration(groupDirectory: group)
            config.maxEventBytes = 4096
            let tracker = try Tracker(configuration: config)
            var props: [String: PropertyValue] = [:]
            for i in 0..<10 { props["p\(i)"] = .string(String(repeating: "x", count: 800)) }
            let error = #expect(throws: TrackingError.self) { try tracker.track("Big", properties: props) }
            #expect(error?.code == .eventTooLarge)
            #expect(error?.message.contains("4096") == true)
        }
    }

    @Test("the size check leaves room for the identity: with the longest ids, each byte escaped, a stored event stays within maxEventBytes")
    func sizeCheckReservesIdentity() async throws {
        try await withTemporaryGroup { group in
            var config = Tracker.Configuration(groupDirectory: group)
            config.maxEventBytes = 4096
            let tracker = try Tracker(configuration: config)
            // Written into the event in the store's transaction, after the check: 255 bytes, 510 escaped.
            let quotes = String(repeating: "\"", count: EventRules.maxIDBytes)
            _ = try tracker.identify(anonymousID: quotes)
            _ = try tracker.login(quotes)
            var accepted = 0
            for length in stride(from: 0, through: 4096, by: 8) {
                do {
                    try await tracker.track("Grown", properties: ["p": .string(String(repeating: "x", count: length))])
                    accepted += 1
                } catch let error as TrackingError {
                    #expect(error.code == .eventTooLarge)
                    break
                }
            }
            #expect(accepted > 10, "events of ordinary size fit")
            let sizes = try tracker.store.events(limit: 1000).map { try $0.record.get().body.count }
            // The identify's $Identify and the login's $SignUp (four identity fields, original_id too) come first.
            #expect(sizes.count == accepted + 2 && sizes.allSatisfy { $0 <= 4096 }, "largest stored: \(sizes.max() ?? 0) bytes")
        }
    }

    @Test("group commit: concurrent callers each get their own durable receipt")
    func groupCommit() async throws {
        try await withTemporaryGroup { group in
            let tracker = try Self.tracker(group)
            let receipts = try await withThrowingTaskGroup(of: TrackReceipt.self) { tasks in
                for i in 0..<300 { tasks.addTask { try await tracker.track("Concurrent", properties: ["i": .int(Int64(i))]) } }
                return try await tasks.reduce(into: []) { $0.append($1) }
            }
            #expect(Set(receipts.map(\.eventID)).count == 300)
            #expect(receipts.map(\.seq).sorted() == Array(1...300))
            #expect(receipts.map(\.producerSeq).sorted() == Array(1...300))
            // Every receipt's event is in the store under the seq it was given.
            let stored = try tracker.store.events(limit: 1000)
            for receipt in receipts {
                let body = try #require(try? stored[Int(receipt.seq) - 1].record.get()).body
                #expect(String(decoding: body, as: UTF8.self).contains(receipt.eventID))
            }
        }
    }

    @Test("enqueue: callers keeping windows of pending events; each caller's events stored in its order")
    func enqueueWindows() async throws {
        try await withTemporaryGroup { group in
            let tracker = try Self.tracker(group)
            let (callers, perCaller, window) = (4, 250, 32)
            let receipts = try await withThrowingTaskGroup(of: [TrackReceipt].self) { tasks in
                for caller in 0..<callers {
                    tasks.addTask {
                        var inFlight: [PendingTrack] = []
                        var receipts: [TrackReceipt] = []
                        for i in 0..<perCaller {
                            let properties: [String: PropertyValue] = ["caller": .int(Int64(caller)), "i": .int(Int64(i))]
                            inFlight.append(try await tracker.enqueue("Windowed", properties: properties))
                            if inFlight.count == window { receipts.append(try await inFlight.removeFirst().receipt()) }
                        }
                        for pending in inFlight { receipts.append(try await pending.receipt()) }
                        return receipts
                    }
                }
                return try await tasks.reduce(into: []) { $0.append($1) }
            }
            #expect(receipts.map(\.count) == Array(repeating: perCaller, count: callers))
            // Every receipt is durable now: the store holds each event under its seq.
            let stored = try tracker.store.events(limit: 2000)
            #expect(stored.count == callers * perCaller)
            var positions: [Int64: [Int64]] = [:]
            for entry in stored {
                let body = try JSONSerialization.jsonObject(with: Data(try entry.record.get().body)) as? [String: Any]
                let properties = try #require(body?["properties"] as? [String: Any])
                let caller = try #require((properties["caller"] as? NSNumber)?.int64Value)
                positions[caller, default: []].append(try #require((properties["i"] as? NSNumber)?.int64Value))
            }
            for caller in 0..<Int64(callers) { #expect(positions[caller] == Array(0..<Int64(perCaller))) }
            for receipts in receipts { #expect(receipts.map(\.seq) == receipts.map(\.seq).sorted()) }
        }
    }

    @Test("enqueue suspends while the queue is full and loses nothing")
    func enqueueBackpressure() async throws {
        try await withTemporaryGroup { group in
            var config = Tracker.Configuration(groupDirectory: group)
            config.maxGroupCommit = 4
            config.maxQueuedEvents = 4
            let tracker = try Tracker(configuration: config)
            // Nobody awaits a receipt until everything is queued: only the bound holds the caller back.
            // At most 4 events wait in the queue and 4 more in the transaction being committed.
            var pending: [PendingTrack] = []
            var behind: [Int] = []
            for i in 0..<300 {
                pending.append(try await tracker.enqueue("Burst", properties: ["i": .int(Int64(i))]))
                behind.append(pending.count - (try tracker.store.status().pendingEvents))
            }
            #expect(behind.max() ?? 0 <= 8, "events queued but not yet stored: \(behind.max() ?? 0)")
            var seqs: [UInt64] = []
            for item in pending { seqs.append(try await item.receipt().seq) }
            #expect(seqs == Array(1...300))
            #expect(try tracker.store.status().pendingEvents == 300)
        }
    }

    @Test("a pending event's receipt is the same however often and whenever it is awaited")
    func receiptAwaitedTwice() async throws {
        try await withTemporaryGroup { group in
            let tracker = try Self.tracker(group)
            let pending = try await tracker.enqueue("Twice")
            async let first = pending.receipt()
            async let second = pending.receipt()
            let (a, b) = try await (first, second)
            #expect(a == b)
            #expect(try await pending.receipt() == a)
            #expect(a.eventID == pending.eventID)
        }
    }

    @Test("enqueue refuses invalid input at once, and nothing is queued")
    func enqueueValidates() async throws {
        try await withTemporaryGroup { group in
            let tracker = try Self.tracker(group)
            let error = await #expect(throws: TrackingError.self) { try await tracker.enqueue("bad name") }
            #expect(error?.code == .invalidName)
            _ = try await tracker.enqueue("Ok").receipt()
            #expect(try tracker.store.status().pendingEvents == 1)
        }
    }

    @Test("a configuration value below 1 is a typed error, not a tracker that hangs or traps",
          arguments: ["maxGroupCommit", "maxQueuedEvents", "maxQueuedBytes", "maxEventBytes"], [0, -1])
    func invalidConfiguration(field: String, value: Int) throws {
        try withTemporaryGroup { group in
            var config = Tracker.Configuration(groupDirectory: group)
            switch field {
            case "maxGroupCommit": config.maxGroupCommit = value
            case "maxQueuedEvents": config.maxQueuedEvents = value
            case "maxQueuedBytes": config.maxQueuedBytes = value
            default: config.maxEventBytes = value
            }
            let error = #expect(throws: TrackingError.self) { try Tracker(configuration: config) }
            #expect(error?.code == .invalidConfiguration && error?.field == field)
        }
    }

    @Test("an app version that is empty, blank, longer than 255 bytes or holds a control character is refused before anything is written",
          arguments: ["", "  ", String(repeating: "9", count: 256), "1.0\t2", "1.0\n"])
    func invalidAppVersion(version: String) throws {
        try withTemporaryGroup { group in
            var config = Tracker.Configuration(groupDirectory: group)
            config.appVersion = version
            let error = #expect(throws: TrackingError.self) { try Tracker(configuration: config) }
            #expect(error?.code == .invalidConfiguration && error?.field == "appVersion")
            #expect(!FileManager.default.fileExists(atPath: group + "/" + SharedStore.fileName), "the store was created")
        }
    }

    /// Starts an append on a thread of its own and returns once it holds the store's writer lock (the
    /// lock of every process and thread of the group); it gives the lock up when `release` is
    /// signalled, writing nothing. The task ends then.
    static func holdWriterLock(_ store: SharedStore, until release: DispatchSemaphore) -> Task<Void, Never> {
        let holding = DispatchSemaphore(value: 0)
        let done = DispatchSemaphore(value: 0)
        Thread.detachNewThread {
            _ = try? store.append(producer: .init(kind: .app, id: "lock-holder"), count: 1) { _, _ in
                holding.signal()
                release.wait()
                throw CancellationError()
            }
            done.signal()
        }
        holding.wait()
        return Task.detached { done.wait() }
    }

    /// The synchronous `track`, from code that is not async.
    static func trackNow(
        _ tracker: Tracker, _ event: String, properties: [String: PropertyValue] = [:]
    ) throws -> TrackReceipt {
        try tracker.track(event, properties: properties)
    }

    @Test("a synchronous track after enqueue is stored after every event queued before it", arguments: 1...5)
    func synchronousAfterQueued(round: Int) async throws {
        try await withTemporaryGroup { group in
            var config = Tracker.Configuration(groupDirectory: group)
            config.maxGroupCommit = 100  // several transactions' worth queued when the synchronous track comes
            let tracker = try Tracker(configuration: config)
            var pending: [PendingTrack] = []
            for i in 0..<1000 { pending.append(try await tracker.enqueue("Queued", properties: ["i": .int(Int64(i))])) }
            let now = try Self.trackNow(tracker, "Now")
            var queuedSeqs: [UInt64] = []
            for item in pending { queuedSeqs.append(try await item.receipt().seq) }
            #expect(now.seq > queuedSeqs.max() ?? 0, "round \(round): program order")
        }
    }

    @Test("a group commit that fails fails only pending events in it, and stores exactly the acknowledged ones")
    func enqueueStoreFull() async throws {
        try await withTemporaryGroup { group in
            var config = Tracker.Configuration(groupDirectory: group)
            config.store.initialMapSize = 256 << 10
            // Room for a few commits of 8 events of 8 KiB (a 4,000-byte filler takes overflow pages),
            // whatever the timing: the rest fail.
            config.store.quota = 512 << 10
            config.maxGroupCommit = 8
            let tracker = try Tracker(configuration: config)
            let filler = String(repeating: "x", count: 4000)
            var pending: [PendingTrack] = []
            for i in 0..<200 {
                pending.append(try await tracker.enqueue("Fill", properties: ["i": .int(Int64(i)), "filler": .string(filler)]))
            }
            var stored = 0
            var full = 0
            for item in pending {
                do {
                    _ = try await item.receipt()
                    stored += 1
                } catch let error as StoreError {
                    #expect(error.code == .storeFull)
                    full += 1
                }
            }
            #expect(full > 0)
            #expect(stored > 0)
            // Exactly the acknowledged events are in the store.
            #expect(try tracker.store.status().pendingEvents == stored)
        }
    }

    @Test("a group commit too large for the room left stores the events that fit, as one track at a time would")
    func enqueueStoreFullStoresWhatFits() async throws {
        // Events of about 12 KiB (two 6,000-byte strings), 50 of them: about 600 KiB, more than a 512 KiB
        // quota holds. Queued before any receipt is awaited, they go in as few transactions as the
        // default maxGroupCommit allows.
        let filler = String(repeating: "x", count: 6000)
        func properties(_ i: Int) -> [String: PropertyValue] {
            ["i": .int(Int64(i)), "a": .string(filler), "b": .string(filler)]
        }
        func configuration(_ group: String) -> Tracker.Configuration {
            var config = Tracker.Configuration(groupDirectory: group)
            config.store.quota = 512 << 10
            return config
        }
        // What fits: the same events tracked one at a time, each in a transaction of its own.
        let alone = try withTemporaryGroup { group in
            let tracker = try Tracker(configuration: configuration(group))
            var stored = 0
            for i in 0..<50 {
                do {
                    _ = try Self.trackNow(tracker, "Fill", properties: properties(i))
                    stored += 1
                } catch let error as StoreError where error.code == .storeFull {}
            }
            return stored
        }
        try #require(alone > 10 && alone < 50, "the quota should hold some of the events, not all: \(alone)")
        try await withTemporaryGroup { group in
            let tracker = try Tracker(configuration: configuration(group))
            // Every event queued while another append holds the writer lock: the first goes in a
            // transaction of its own, the other 49 in one.
            let release = DispatchSemaphore(value: 0)
            let released = Self.holdWriterLock(tracker.store, until: release)
            var pending: [PendingTrack] = []
            for i in 0..<50 { pending.append(try await tracker.enqueue("Fill", properties: properties(i))) }
            release.signal()
            await released.value
            var stored: [(index: Int, seq: UInt64)] = []
            for (index, item) in pending.enumerated() {
                do {
                    stored.append((index, try await item.receipt().seq))
                } catch let error as StoreError {
                    #expect(error.code == .storeFull)
                }
            }
            // One transaction of all 50 holds less than a transaction per event (LMDB's own pages per
            // commit), never fewer events.
            #expect(stored.count >= alone, "stored \(stored.count) of 50 events; one at a time, \(alone) fit")
            #expect(try tracker.store.status().pendingEvents == stored.count)
            // Stored in queue order, with no gap in the sequence.
            #expect(stored.map(\.seq) == Array(1...UInt64(stored.count)))
            #expect(stored.map(\.index) == stored.map(\.index).sorted())
        }
    }

    @Test("a page event's time outside 1 ms … 9999-12-30 is a typed error, not a trap; nothing is written",
          arguments: [Int64.min, Int64.min + 1, -1, 0, PageEvent.timeRange.upperBound + 1, Int64.max])
    func pageTimeOutOfRange(time: Int64) async throws {
        try await withTemporaryGroup { group in
            let tracker = try Self.tracker(group)
            let before = tracker.store.lastTransactionID
            let page = PageEvent(type: .track, event: "$pageview", timeMillis: time, lib: ["$lib": "js"], properties: [:])
            let error = await #expect(throws: TrackingError.self) { try await tracker.trackFromPage(page) }
            #expect(error?.code == .timeOutOfRange && error?.field == "time")
            #expect(error?.message.contains("\(PageEvent.timeRange.upperBound)") == true)
            #expect(throws: TrackingError.self) { try tracker.signUpFromPage(page, loginID: "user-1") }
            #expect(tracker.store.lastTransactionID == before)
            #expect(try tracker.identity().loginID == nil)
        }
    }

    @Test("a page event's time at either end of the range is stored as given",
          arguments: [PageEvent.timeRange.lowerBound, PageEvent.timeRange.upperBound])
    func pageTimeAtBounds(time: Int64) async throws {
        try await withTemporaryGroup { group in
            let tracker = try Self.tracker(group)
            let page = PageEvent(type: .track, event: "$pageview", timeMillis: time, lib: ["$lib": "js"], properties: [:])
            let receipt = try await tracker.trackFromPage(page)
            #expect((try Self.body(tracker.store, seq: receipt.seq)["time"] as? NSNumber)?.int64Value == time)
        }
    }

    @Test("trackFromPage stores only track events and signUpFromPage only track_signup: anything else is a typed error, nothing written, no login")
    func pageEventTypes() async throws {
        try await withTemporaryGroup { group in
            let tracker = try Self.tracker(group)
            let before = tracker.store.lastTransactionID
            func page(_ type: PageEvent.EventType) -> PageEvent {
                PageEvent(type: type, event: "$pageview", timeMillis: 1_700_000_000_000, lib: ["$lib": "js"], properties: [:])
            }
            for type in [PageEvent.EventType(rawValue: "profile_set"), PageEvent.EventType(rawValue: ""), .signup] {
                let error = await #expect(throws: TrackingError.self) { try await tracker.trackFromPage(page(type)) }
                #expect(error?.code == .invalidValueType && error?.field == "type")
            }
            let error = #expect(throws: TrackingError.self) { try tracker.signUpFromPage(page(.track), loginID: "user-1") }
            #expect(error?.code == .invalidValueType && error?.field == "type")
            #expect(tracker.store.lastTransactionID == before)
            #expect(try tracker.identity().loginID == nil)
            _ = try tracker.signUpFromPage(page(.signup), loginID: "user-1")
            #expect(try tracker.identity().loginID == "user-1")
        }
    }

    @Test("timers use the monotonic clock and stop counting in background")
    func timers() async throws {
        try await withTemporaryGroup { group in
            let clock = ManualClock()
            let tracker = try Self.tracker(group, clock: clock)
            try tracker.trackTimerStart("Watch")
            clock.advance(seconds: 2)
            tracker.enterBackground()
            clock.advance(seconds: 100)
            tracker.enterForeground()
            clock.advance(seconds: 1.5)
            try tracker.trackTimerPause("Watch")
            clock.advance(seconds: 50)
            try tracker.trackTimerResume("Watch")
            clock.advance(seconds: 0.25)
            // A refused end leaves the timer running: it was removed, and the retry found no timer.
            await #expect(throws: TrackingError.self) { try await tracker.trackTimerEnd("Watch", properties: ["bad key": "v1"]) }
            let receipt = try await tracker.trackTimerEnd("Watch", properties: ["video": "v1"])
            let props = try #require(try Self.body(tracker.store, seq: receipt.seq)["properties"] as? [String: Any])
            #expect(props["$event_duration"] as? Double == 3.75)
            #expect(props["video"] as? String == "v1")
            await #expect(throws: TrackingError.self) { try await tracker.trackTimerEnd("Watch") }
            #expect(throws: TrackingError.self) { try tracker.trackTimerPause("Never") }
        }
    }

    @Test("an app-paused timer stays paused across a background/foreground cycle")
    func timerPausedByApp() async throws {
        try await withTemporaryGroup { group in
            let clock = ManualClock()
            let tracker = try Self.tracker(group, clock: clock)
            try tracker.trackTimerStart("T")
            clock.advance(seconds: 1)
            try tracker.trackTimerPause("T")
            tracker.enterBackground()
            tracker.enterForeground()
            clock.advance(seconds: 10)
            let receipt = try await tracker.trackTimerEnd("T")
            let props = try #require(try Self.body(tracker.store, seq: receipt.seq)["properties"] as? [String: Any])
            #expect(props["$event_duration"] as? Double == 1.0)
        }
    }
}
