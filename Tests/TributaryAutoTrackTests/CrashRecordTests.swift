import CTributaryCrash
import Foundation
import Synchronization
import Testing
import Tributary
@testable import TributaryAutoTrack
import TributaryStore
import TributaryTestSupport

/// A record as the signal handler writes it (the real multi-process crash is in Integration/CrashTests).
func crashRecordBytes(
    signal: Int32, foreground: Bool, activeSince: UInt64, crashedAt: UInt64, wallMillis: Int64,
    session: String, screen: String, appVersion: String = "1.0.0", frames: Int = 2, pid: Int32 = 4242
) -> [UInt8] {
    var r = tributary_crash_record()
    r.magic = TRIBUTARY_CRASH_MAGIC
    r.version = TRIBUTARY_CRASH_VERSION
    r.size = UInt32(MemoryLayout<tributary_crash_record>.size)
    r.signal = signal
    r.code = 1
    r.pid = pid
    r.fault_address = 0x10
    r.instruction = 0x5555_0000_1234
    r.wall_ms = wallMillis
    r.boot_ns = crashedAt
    r.active_since_ns = activeSince
    r.foreground = foreground ? 1 : 0
    withUnsafeMutableBytes(of: &r.boot_id) { $0.copyBytes(from: BootID.current.bytes) }
    withUnsafeMutableBytes(of: &r.session_id) { $0.copyBytes(from: Array(session.utf8)) }
    withUnsafeMutableBytes(of: &r.screen_name) { $0.copyBytes(from: Array(screen.utf8)) }
    r.frame_count = UInt32(frames)
    withUnsafeMutableBytes(of: &r.frames) { raw in
        raw.storeBytes(of: 0x5555_0000_1234 as UInt64, toByteOffset: 0, as: UInt64.self)
        raw.storeBytes(of: 0x7fff_0000_0042 as UInt64, toByteOffset: 8, as: UInt64.self)
        for i in 2..<max(2, frames) { raw.storeBytes(of: 0x5555_0000_2000 + UInt64(i), toByteOffset: 8 * i, as: UInt64.self) }
    }
    r.module_count = 1
    r.modules.0.bias = 0x5555_0000_0000
    r.modules.0.start = 0x5555_0000_0000
    r.modules.0.end = 0x5555_0010_0000
    withUnsafeMutableBytes(of: &r.modules.0.name) { $0.copyBytes(from: Array("tributary-sim".utf8)) }
    withUnsafeMutableBytes(of: &r.app_version) { $0.copyBytes(from: Array(appVersion.utf8)) }
    let offset = MemoryLayout<tributary_crash_record>.offset(of: \.checksum)!
    r.checksum = withUnsafeBytes(of: &r) { tributary_crash_checksum($0.baseAddress, UInt64(offset)) }
    return withUnsafeBytes(of: &r) { Array($0) }
}

/// The same record as a version 1 handler wrote it: no `app_version`, the checksum where it begins.
func crashRecordV1Bytes(_ v2: [UInt8]) -> [UInt8] {
    var bytes = Array(v2.prefix(CrashLog.appVersionOffset))
    withUnsafeBytes(of: UInt32(1)) { bytes.replaceSubrange(4..<8, with: $0) }
    withUnsafeBytes(of: UInt32(CrashLog.v1RecordSize)) { bytes.replaceSubrange(8..<12, with: $0) }
    let checksum = bytes.withUnsafeBytes { tributary_crash_checksum($0.baseAddress, UInt64($0.count)) }
    withUnsafeBytes(of: checksum) { bytes.append(contentsOf: $0) }
    return bytes
}

@Suite("Crash records", .serialized)
struct CrashRecordTests {
    @Test("a crash carries the crashed run's $app_version, in properties and lib, after an update; a version 1 record, this run's")
    func crashedRunsVersion() throws {
        try withTemporaryGroup { group in
            let clock = ManualClock()
            var config = Tracker.Configuration(groupDirectory: group)
            config.appVersion = "1.1.0"
            let auto = try AutoTracker(tracker: try Tracker(configuration: config), configuration: {
                var c = AutoTracker.Configuration()
                c.captureCrashes = false
                c.flushOnBackground = false
                c.monotonicNanos = { clock.now() }
                return c
            }())
            let crashedAt = BootClock.nowNanos()
            let current = crashRecordBytes(
                signal: SIGSEGV, foreground: true, activeSince: crashedAt - 5_000_000_000, crashedAt: crashedAt,
                wallMillis: 1_700_000_000_000, session: "s1", screen: "home", appVersion: "1.0.0")
            let old = crashRecordV1Bytes(crashRecordBytes(
                signal: SIGABRT, foreground: false, activeSince: 0, crashedAt: crashedAt, wallMillis: 1_700_000_000_500,
                session: "s0", screen: "", appVersion: "ignored"))
            #expect(old.count == CrashLog.v1RecordSize && current.count == CrashLog.recordSize)
            // A version 2 record cut short (a power cut mid-write) before a version 1 one: skipped, and the
            // reader finds the next record by its magic.
            try Data(old + current + current.prefix(4000) + old).write(to: URL(fileURLWithPath: auto.crashLog.path))
            let records = try auto.crashLog.read()
            #expect(records.map(\.appVersion) == [nil, "1.0.0", nil])

            try auto.start()
            let events = try storedEvents(group).filter { $0.event == "$AppCrashed" || $0.event == "$AppEnd" }
            #expect(events.map(\.event) == ["$AppCrashed", "$AppCrashed", "$AppEnd", "$AppCrashed"])
            #expect(events.map { $0["$app_version"] as? String } == ["1.1.0", "1.0.0", "1.0.0", "1.1.0"])
            let libVersions = try events.map { event in
                let body = try JSONSerialization.jsonObject(with: Data(event.record.body)) as? [String: Any]
                return (body?["lib"] as? [String: Any])?["$app_version"] as? String
            }
            #expect(libVersions == ["1.1.0", "1.0.0", "1.0.0", "1.1.0"])
        }
    }

    @Test(
        "the next start turns a record into $AppCrashed and the missing $AppEnd, dated at the crash; torn records are skipped"
    )
    func recovery() throws {
        try withTemporaryGroup { group in
            let clock = ManualClock()
            let auto = try makeAuto(group, clock: clock)
            let crashedAt = BootClock.nowNanos()
            let record = crashRecordBytes(
                signal: SIGSEGV, foreground: true, activeSince: crashedAt - 12_345_000_000, crashedAt: crashedAt,
                wallMillis: 1_700_000_000_123, session: "session-of-the-crash", screen: "product_detail")
            let torn = crashRecordBytes(
                signal: SIGILL, foreground: true, activeSince: 0, crashedAt: 1, wallMillis: 1,
                session: "x", screen: "y")
            let later = crashRecordBytes(
                signal: SIGABRT, foreground: false, activeSince: 0, crashedAt: 7,
                wallMillis: 1_700_000_100_000, session: "s2", screen: "")
            var corrupt = torn
            corrupt[40] ^= 0xff
            // A record cut short (power cut mid-write), a later intact one, and one whose checksum fails.
            let file = record + torn.prefix(1000) + later + corrupt
            try Data(file).write(to: URL(fileURLWithPath: auto.crashLog.path))
            #expect(try auto.crashLog.read().map(\.signal) == [SIGSEGV, SIGABRT])

            let receipts = try auto.start()
            #expect(receipts.count == 3)
            let events = try storedEvents(group)
            #expect(events.map(\.event) == ["$AppCrashed", "$AppEnd", "$AppCrashed"])
            let crashed = events[0]
            let reason = try #require(crashed["app_crashed_reason"] as? String)
            #expect(reason.hasPrefix("SIGSEGV (signal 11, code 1) at 0x0000000000000010, pc 0x0000555500001234"))
            #expect(reason.contains("#0 0x0000555500001234 tributary-sim + 0x1234"))
            #expect(reason.contains("#1 0x00007fff00000042"))
            #expect(crashed.time == 1_700_000_000_123)
            #expect(crashed["$session_id"] as? String == "session-of-the-crash")
            #expect(crashed["$screen_name"] as? String == "product_detail")
            #expect(crashed.record.bootTimeNanos == crashedAt)
            let end = events[1]
            #expect(end["$event_duration"] as? Double == 12.345)
            #expect(end["$app_end_reason"] as? String == "crash")
            #expect(end.time == 1_700_000_000_123)
            #expect(try auto.crashLog.read().isEmpty, "the crash file is cleared once the events are durable")

            // Killed after the commit but before the file was cleared: the next start records the same
            // events again with the same event ids, which the outbox and the collector dedup.
            try Data(record).write(to: URL(fileURLWithPath: auto.crashLog.path))
            let again = try makeAuto(group, clock: clock)
            try again.start()
            let all = try storedEvents(group)
            #expect(all.count == 5)
            #expect(all[3].eventID == all[0].eventID && all[4].eventID == all[1].eventID)
            #expect(all[0].eventID != all[1].eventID)
        }
    }

    static func size(_ path: String) -> Int? {
        (try? FileManager.default.attributesOfItem(atPath: path))?[.size] as? Int
    }

    // Tracking the records used to come before installing the handlers: a start that could not track
    // them (a full store, an event over the limit) threw with no handlers installed, so a crash in that
    // run was not recorded, and the records were read again, and failed again, at every start.
    @Test("a start that cannot track the crash records keeps them for the next start, and still installs the handlers")
    func startFailureKeepsRecords() throws {
        try withTemporaryGroup { group in
            let clock = ManualClock()
            let crashedAt = BootClock.nowNanos()
            let record = crashRecordBytes(
                signal: SIGSEGV, foreground: true, activeSince: crashedAt - 5_000_000_000, crashedAt: crashedAt,
                wallMillis: 1_700_000_000_000, session: "s1", screen: "cart")
            // A store at its quota (the agent not running): the refusal passes once the agent drains it.
            var trackerConfig = Tracker.Configuration(groupDirectory: group)
            trackerConfig.store.quota = SharedStore.minimumQuota
            trackerConfig.store.initialMapSize = SharedStore.minimumQuota
            trackerConfig.monotonicNanos = { clock.now() }
            let tracker = try Tracker(configuration: trackerConfig)
            for padding in [8000, 500, 0] {
                do {
                    while true { try tracker.track("Filler", properties: ["padding": .string(String(repeating: "x", count: padding))]) }
                } catch let error as StoreError where error.code == .storeFull {}
            }
            let filled = try tracker.store.status().newestSeq ?? 0
            var config = AutoTracker.Configuration()
            config.monotonicNanos = { clock.now() }
            let small = try AutoTracker(tracker: tracker, configuration: config)
            defer { tributary_crash_uninstall() }
            try Data(record).write(to: URL(fileURLWithPath: small.crashLog.path))
            let error = #expect(throws: StoreError.self) { try small.start() }
            #expect(error?.code == .storeFull)
            #expect(Self.size(small.crashLog.path) == 0, "the handlers were installed on a fresh crash file")
            #expect(Self.size(small.crashLog.pendingPath) == record.count, "the record was set aside")
            #expect(try storedEvents(in: tracker.store).count == Int(filled), "nothing of the crash stored")

            // This run crashes too: its handler appends to the fresh file. Once the agent has drained the
            // store, the next start reports both, once.
            let second = crashRecordBytes(
                signal: SIGABRT, foreground: false, activeSince: 0, crashedAt: crashedAt + 1_000_000_000,
                wallMillis: 1_700_000_001_000, session: "s2", screen: "")
            try Data(second).write(to: URL(fileURLWithPath: small.crashLog.path))
            #expect(try small.crashLog.read().map(\.signal) == [SIGSEGV, SIGABRT])
            _ = try tracker.store.deleteEvents(through: filled)
            let next = try AutoTracker(tracker: tracker, configuration: config)
            #expect(try next.start().count == 3)
            #expect(try storedEvents(in: tracker.store).map(\.event) == ["$AppCrashed", "$AppEnd", "$AppCrashed"])
            #expect(try next.crashLog.read().isEmpty)
            #expect(!FileManager.default.fileExists(atPath: next.crashLog.pendingPath))
        }
    }

    @Test("a crash file of torn bytes only is cleared at the next start; a record after 1 MB of garbage is found")
    func tornOnly() throws {
        try withTemporaryGroup { group in
            let auto = try makeAuto(group, clock: ManualClock())
            try Data(repeating: 0x54, count: 5000).write(to: URL(fileURLWithPath: auto.crashLog.path))
            #expect(try auto.start().isEmpty)
            #expect(try auto.crashLog.read().isEmpty)
            #expect(!FileManager.default.fileExists(atPath: auto.crashLog.pendingPath))
            #expect(Self.size(auto.crashLog.path) ?? 0 == 0, "torn bytes are not read again at every start")

            let record = crashRecordBytes(
                signal: SIGBUS, foreground: false, activeSince: 0, crashedAt: 5, wallMillis: 1_700_000_000_000,
                session: "s", screen: "")
            // Garbage that holds the magic number now and then (a record's first four bytes), then a record.
            var garbage = [UInt8](repeating: 0xFF, count: 1 << 20)
            for offset in stride(from: 1000, to: garbage.count - 8, by: 50_000) {
                withUnsafeBytes(of: TRIBUTARY_CRASH_MAGIC) { garbage.replaceSubrange(offset..<offset + 4, with: $0) }
            }
            try Data(garbage + record).write(to: URL(fileURLWithPath: auto.crashLog.path))
            #expect(try auto.crashLog.read().map(\.signal) == [SIGBUS])
        }
    }

    @Test("the crash file's name keeps a producer id with / or % in one file of the group, and a long id within 255 bytes")
    func fileNames() throws {
        #expect(CrashLog.fileName(producerID: "app") == "crash-app.records")
        #expect(CrashLog.fileName(producerID: "team/app") == "crash-team%2Fapp.records")
        #expect(CrashLog.fileName(producerID: "50%/x") == "crash-50%25%2Fx.records")
        // A combining mark after "/" or "%" makes one Character of the two: escaped all the same.
        #expect(CrashLog.fileName(producerID: "a/\u{301}b") == "crash-a%2F\u{301}b.records")
        #expect(CrashLog.fileName(producerID: "a%\u{301}b") == "crash-a%25\u{301}b.records")
        let long = String(repeating: "é", count: 120)  // 240 bytes
        let name = CrashLog.fileName(producerID: long)
        #expect((name + ".pending").utf8.count <= 255)
        #expect(name != CrashLog.fileName(producerID: long + "x"), "two long ids keep two files")
        try withTemporaryGroup { group in
            let auto = try makeAuto(group, clock: ManualClock(), producerID: "team/app")
            #expect((auto.crashLog.path as NSString).deletingLastPathComponent == group)
            let record = crashRecordBytes(
                signal: SIGSEGV, foreground: false, activeSince: 0, crashedAt: 5, wallMillis: 1_700_000_000_000,
                session: "s", screen: "")
            try Data(record).write(to: URL(fileURLWithPath: auto.crashLog.path))
            #expect(try auto.start().count == 1)
        }
    }

    @Test("the screen name and app version a crash record holds are cut at a character's end to fit its fields")
    func fieldsCutAtCharacters() {
        // The screen name's field holds 127 bytes: "é" (2 bytes) at bytes 126 and 127 was cut in two by the C copy.
        let screen = String(repeating: "a", count: 126) + "é" + "b"
        let fitted = clipped(screen, toBytes: Int(TRIBUTARY_CRASH_SCREEN_NAME) - 1)
        #expect(fitted == String(repeating: "a", count: 126))
        #expect(clipped("1.0.0", toBytes: Int(TRIBUTARY_CRASH_APP_VERSION) - 1) == "1.0.0")
        #expect(clipped("😀😀", toBytes: 7) == "😀" && clipped("😀😀", toBytes: 8) == "😀😀")
    }

    @Test("app_crashed_reason keeps whole frame lines within the 8,192-byte value limit")
    func reasonLimit() throws {
        var record = try #require(
            CrashLog.decode(
                Data(
                    crashRecordBytes(
                        signal: SIGBUS, foreground: false, activeSince: 0, crashedAt: 1, wallMillis: 1, session: "",
                        screen: ""))))
        let module = String(repeating: "m", count: 95)
        record.frames = (0..<64).map { CrashRecord.Frame(address: UInt64($0), module: module, offset: UInt64($0)) }
        let reason = record.reason()
        #expect(reason.utf8.count <= 8192)
        #expect(reason.split(separator: "\n").count > 40)
        #expect(reason.hasSuffix("+ 0x\(String(reason.split(separator: "\n").count - 2, radix: 16))"))
        #expect(record.reason(limit: 100).split(separator: "\n").count == 1)
    }

    @Test("a crash would record an open $AppStart only while the store holds one: not a refused one, and until its $AppEnd is stored")
    func crashContextFollowsTheStore() throws {
        try withTemporaryGroup { group in
            defer { tributary_crash_uninstall() }
            // 300 bytes: smaller than an $AppStart with its presets. The lifecycle goes on; the store has no start.
            let refusing = try makeAuto(group, clock: ManualClock(), maxEventBytes: 300, producerID: "small", captureCrashes: true)
            try refusing.start()
            try refusing.handle(.didFinishLaunching(inBackground: false))
            #expect(throws: TrackingError.self) { try refusing.handle(.didBecomeActive) }
            #expect(refusing.phase == .active)
            #expect(tributary_crash_context_foreground(nil) == 0, "a crash now would backfill an $AppEnd for no $AppStart")
            tributary_crash_uninstall()

            let clock = ManualClock()
            let auto = try makeAuto(group, clock: clock, producerID: "app", captureCrashes: true)
            try auto.start()
            try auto.handle(.didFinishLaunching(inBackground: false))
            try auto.handle(.didBecomeActive)
            var since: UInt64 = 0
            #expect(tributary_crash_context_foreground(&since) == 1, "the $AppStart is stored")
            #expect(since > 0)
            try auto.handle(.didEnterBackground)
            #expect(try storedEvents(group).map(\.event).suffix(2) == ["$AppStart", "$AppEnd"])
            #expect(tributary_crash_context_foreground(nil) == 0, "its $AppEnd is stored")
        }
    }

    @Test("the start stays open to a crash until its $AppEnd is stored, and the $AppEnd has the id its backfill would have")
    func crashContextUntilAppEndStored() throws {
        try withTemporaryGroup { group in
            defer { tributary_crash_uninstall() }
            let auto = try makeAuto(group, clock: ManualClock(), captureCrashes: true)
            try auto.start()
            // What a crash would record while each event is prepared (in the tracking call, before the commit).
            let seen = Mutex<[UInt32]>([])
            auto.tracker.registerDynamicSuperProperties {
                seen.withLock { $0.append(tributary_crash_context_foreground(nil)) }
                return [:]
            }
            try auto.handle(.didFinishLaunching(inBackground: false))
            try auto.handle(.didBecomeActive)
            var since: UInt64 = 0
            #expect(tributary_crash_context_foreground(&since) == 1)
            seen.withLock { $0 = [] }
            try auto.handle(.didEnterBackground)
            #expect(seen.withLock { $0 } == [1], "a crash while the $AppEnd commits would backfill it")
            #expect(tributary_crash_context_foreground(nil) == 0, "stored: no backfill")
            let end = try #require(try storedEvents(group).last)
            #expect(end.event == "$AppEnd")
            #expect(end.eventID == CrashRecord.appEndEventID(pid: getpid(), activeSince: since, bootID: .current))
        }
    }

    @Test("an $AppEnd the store refused closes the start for the crash handler, also when the next $AppStart is refused too")
    func refusedAppEndClosesStart() throws {
        try withTemporaryGroup { group in
            defer { tributary_crash_uninstall() }
            let auto = try makeAuto(group, clock: ManualClock(), maxEventBytes: 4096, captureCrashes: true)
            try auto.start()
            let oversized = Atomic<Bool>(false)
            auto.tracker.registerDynamicSuperProperties {
                oversized.load(ordering: .relaxed) ? ["padding": .string(String(repeating: "x", count: 5000))] : [:]
            }
            try auto.handle(.didFinishLaunching(inBackground: false))
            try auto.handle(.didBecomeActive)
            #expect(tributary_crash_context_foreground(nil) == 1)
            oversized.store(true, ordering: .relaxed)
            #expect(throws: TrackingError.self) { try auto.handle(.didEnterBackground) }
            #expect(tributary_crash_context_foreground(nil) == 0)
            #expect(throws: TrackingError.self) { try auto.handle(.didBecomeActive) }
            // A crash now would backfill an $AppEnd for the first start, counting the time in the background.
            #expect(tributary_crash_context_foreground(nil) == 0)
        }
    }

    @Test("a crash record whose event is over the size limit is reported with a shorter backtrace, and one never storable does not hold the others back")
    func oversizedCrashRecord() throws {
        try withTemporaryGroup { group in
            // 4,096 bytes: an $AppCrashed with 64 frames does not fit, one with the signal's line alone does.
            let auto = try makeAuto(group, clock: ManualClock(), maxEventBytes: 4096)
            let deep = crashRecordBytes(
                signal: SIGSEGV, foreground: false, activeSince: 0, crashedAt: 5, wallMillis: 1_700_000_000_000,
                session: "s1", screen: "", frames: 64)
            let shallow = crashRecordBytes(
                signal: SIGABRT, foreground: false, activeSince: 0, crashedAt: 9, wallMillis: 1_700_000_001_000,
                session: "s2", screen: "")
            try Data(deep + shallow).write(to: URL(fileURLWithPath: auto.crashLog.path))
            #expect(try auto.start().count == 2)
            let reasons = try storedEvents(group).filter { $0.event == "$AppCrashed" }.compactMap { $0["app_crashed_reason"] as? String }
            #expect(reasons.count == 2)
            #expect(reasons.first?.hasPrefix("SIGSEGV (signal 11") == true && reasons.first!.split(separator: "\n").count < 65)
            #expect(reasons.last?.contains("#1 0x00007fff00000042") == true, "the other record whole")
            #expect(!FileManager.default.fileExists(atPath: auto.crashLog.pendingPath))
        }
        try withTemporaryGroup { group in
            // 300 bytes: no $AppCrashed fits at all. Given up, said once; the next start has nothing to redo.
            let auto = try makeAuto(group, clock: ManualClock(), maxEventBytes: 300)
            try Data(crashRecordBytes(
                signal: SIGSEGV, foreground: false, activeSince: 0, crashedAt: 5, wallMillis: 1, session: "s", screen: "")
            ).write(to: URL(fileURLWithPath: auto.crashLog.path))
            let error = #expect(throws: TrackingError.self) { try auto.start() }
            #expect(error?.code == .eventTooLarge)
            #expect(try auto.start().isEmpty)
        }
    }

    @Test("a crash in the background gives $AppCrashed only")
    func backgroundCrash() throws {
        try withTemporaryGroup { group in
            let auto = try makeAuto(group, clock: ManualClock())
            let record = crashRecordBytes(
                signal: SIGABRT, foreground: false, activeSince: 0, crashedAt: 99,
                wallMillis: 1_700_000_000_000, session: "s", screen: "")
            try Data(record).write(to: URL(fileURLWithPath: auto.crashLog.path))
            try auto.start()
            let events = try storedEvents(group)
            #expect(events.map(\.event) == ["$AppCrashed"])
            #expect((events[0]["app_crashed_reason"] as? String)?.hasPrefix("SIGABRT") == true)
        }
    }

    @Test("the frame-pointer walk sees the Swift call chain")
    func framePointers() {
        @inline(never) func depth(_ n: Int) -> UInt32 {
            if n == 0 {
                var frames = [UInt64](repeating: 0, count: 256)
                return tributary_crash_capture_current(&frames, 256)
            }
            return depth(n - 1) &+ 0
        }
        // The frames below the test are the same for both calls: the walk must see exactly the five
        // recursive ones more (the frames of the test runner alone would pass a bound like >= 6).
        let shallow = depth(0)
        #expect(shallow < 250, "the walk must end at the bottom of the stack, not at the buffer's end")
        #expect(depth(5) == shallow + 5)
    }
}
