import Foundation
import Tributary
import TributaryStore

#if canImport(Glibc)
import Glibc
#endif

/// A page on screen from its `$AppViewScreen` to its `$AppPageLeave`: what the leave will say, and when
/// the visit began. A visit ends when another page appears, when the app enters the background or
/// terminates, or, when the process crashes, at the next start (from its visit file and the crash
/// record). Time in the background never counts: the visit ends on the way there, and the page view sent
/// when the app comes back begins another.
struct PageVisit: Sendable {
    /// The page's properties, as on its page view (without the load time).
    var properties: [String: PropertyValue]
    /// The visit's start on the configured monotonic clock.
    var startedAt: UInt64
    /// The same moment on `CLOCK_BOOTTIME`, the clock of crash records.
    var startedBoot: UInt64

    /// The `event_id` of the visit's `$AppPageLeave`: the live one and one backfilled after a crash are
    /// the same event, which the collector keeps once.
    var eventID: String { CrashRecord.pageLeaveEventID(pid: getpid(), visitStart: startedBoot, bootID: .current) }

    /// The `$AppPageLeave` properties at `now`: the page's, and `event_duration` (seconds, 3 decimals;
    /// absent unless 0 < duration < 24 h, as for `$AppEnd`).
    func leaveProperties(at now: UInt64) -> [String: PropertyValue] {
        var p = properties
        if let duration = LifecycleMachine.duration(from: startedAt, to: now) {
            p["event_duration"] = .double(duration)
        }
        return p
    }
}

/// The visit file of one process: `page-<producer id>-<pid>.visit` in the group directory, written
/// when a visit begins and removed when it ends, so the next start can backfill the `$AppPageLeave` a
/// crash kept from being sent. A crash leaves the page cache intact: the file is not fsynced.
struct VisitFile: Sendable {
    /// What the file holds.
    struct Content: Sendable {
        var pid: Int32
        var bootID: BootID
        var startedBoot: UInt64
        var properties: [String: PropertyValue]
    }

    let groupDirectory: String
    /// The producer id as crash files write it (`/` and `%` escaped, a long id shortened).
    let producerPart: String

    init(groupDirectory: String, producerID: String) {
        self.groupDirectory = groupDirectory
        let crashName = CrashLog.fileName(producerID: producerID)
        producerPart = String(crashName.dropFirst("crash-".count).dropLast(".records".count))
    }

    private var prefix: String { "page-" + producerPart + "-" }

    func path(pid: Int32) -> String { groupDirectory + "/" + prefix + String(pid) + ".visit" }

    /// Records the visit of this process (replacing the last one). Best effort: without the file, only a
    /// crash's backfill is missed.
    func write(_ visit: PageVisit) {
        var w = JSONWriter()
        w.raw("{\"pid\":")
        w.int(Int64(getpid()))
        w.raw(",\"boot_id\":")
        w.string(BootID.current.description)
        w.raw(",\"started_boot_ns\":")
        w.string(String(visit.startedBoot))
        w.raw(",\"properties\":{")
        var first = true
        w.members(visit.properties, first: &first)
        w.raw("}}")
        let target = path(pid: getpid())
        let temporary = target + ".tmp"
        guard FileManager.default.createFile(atPath: temporary, contents: Data(w.bytes)) else { return }
        _ = rename(temporary, target)
    }

    /// Removes this process's visit file.
    func remove() { _ = unlink(path(pid: getpid())) }

    /// The visit files of this producer's processes, by pid (unreadable ones left out).
    func all() -> [Int32: Content] {
        let names = (try? FileManager.default.contentsOfDirectory(atPath: groupDirectory)) ?? []
        var found: [Int32: Content] = [:]
        for name in names where name.hasPrefix(prefix) && name.hasSuffix(".visit") {
            let digits = name.dropFirst(prefix.count).dropLast(".visit".count)
            guard let pid = Int32(digits), let content = read(path(pid: pid)) else { continue }
            found[pid] = content
        }
        return found
    }

    private func read(_ path: String) -> Content? {
        guard let data = FileManager.default.contents(atPath: path),
            let object = try? JSONSerialization.jsonObject(with: data) as? [String: Any],
            let pid = (object["pid"] as? NSNumber)?.int32Value, let boot = object["boot_id"] as? String,
            let bootID = BootID(uuidString: boot),
            let started = (object["started_boot_ns"] as? String).flatMap(UInt64.init),
            let propertiesObject = object["properties"],
            let propertiesData = try? JSONSerialization.data(withJSONObject: propertiesObject),
            let properties = try? PropertyValue.properties(
                fromJSON: String(decoding: propertiesData, as: UTF8.self), checkingDuplicateKeys: false)
        else { return nil }
        return Content(pid: pid, bootID: bootID, startedBoot: started, properties: properties)
    }

    /// Removes the visit files no running process of this producer owns: those of another boot, of a
    /// process that is gone (or is this one: a start comes before this process's first visit), and of
    /// the processes in `ended` (their crash ended the visit; the pid may belong to another process now).
    func removeStale(alsoOf ended: Set<Int32> = []) {
        for (pid, content) in all() {
            let alive = pid != getpid() && (kill(pid, 0) == 0 || errno == EPERM)
            if content.bootID != .current || !alive || ended.contains(pid) { _ = unlink(path(pid: pid)) }
        }
    }
}
