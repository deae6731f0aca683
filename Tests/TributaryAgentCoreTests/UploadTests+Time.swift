import Foundation
import Testing
import Tributary
import TributaryCollector
import TributaryStore
import TributaryTestSupport

@testable import TributaryAgentCore

// Times on the wire: the Date header, and event times corrected (or not) for the wall clock.
extension UploadTests {
    @Test("the Date header is an IMF-fixdate, the same as DateFormatter writes", arguments: [
        Int64(784_111_777_000), 0, -1, 951_782_400_999, 1_767_225_599_500, 1_795_480_394_571, 253_402_300_799_000,
    ])
    func httpDateMatchesFormatter(millis: Int64) {
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = TimeZone(identifier: "GMT")
        formatter.dateFormat = "EEE, dd MMM yyyy HH:mm:ss 'GMT'"
        let seconds = (Double(millis) / 1000).rounded(.down)
        #expect(httpDate(millis) == formatter.string(from: Date(timeIntervalSince1970: seconds)))
        if millis == 784_111_777_000 { #expect(httpDate(millis) == "Sun, 06 Nov 1994 08:49:37 GMT") }
    }

    @Test("a hybrid page's time from before this boot or from the future arrives as given; a native event's is still corrected")
    func pageTimeOffThisBoot() async throws {
        try await withTemporaryGroup { group in
            let now = BootClock.wallMillis()
            let uptime = Int64(BootClock.nowNanos() / 1_000_000)
            // A page's backfilled $time from an hour before this boot began, and one an hour ahead: no
            // CLOCK_BOOTTIME reading of this boot matches either.
            let times = ["Backfilled": now - uptime - 3_600_000, "Ahead": now + 3_600_000]
            let page = try Tracker(configuration: .init(groupDirectory: group, producerKind: .hybrid))
            for (name, time) in times {
                try await page.trackFromPage(
                    PageEvent(type: .track, event: name, timeMillis: time, lib: ["$lib": "js"], properties: [:]))
            }
            // A native event tracked while the wall clock was an hour behind: its time is corrected.
            var behind = Tracker.Configuration(groupDirectory: group, producerKind: .app)
            behind.wallMillis = { BootClock.wallMillis() - 3_600_000 }
            try await Tracker(configuration: behind).track("Native")
            let outbox = try Outbox(path: group + "-state/outbox.sqlite")
            #expect(try Drainer(store: page.store, outbox: outbox, logger: Self.logger).drainAvailable() == 3)
            try await Collector.withRunning(CollectorConfiguration()) { collector in
                let step = try await withHTTPClient { client in
                    try await UploadSession(
                        outbox: outbox, client: client, configuration: UploadConfiguration(serverURL: collector.url + "/sa"),
                        logger: Self.logger
                    ).step()
                }
                #expect(step == .progressed(delivered: 3))
                var arrived: [String: [String: Any]] = [:]
                for event in try await collector.events() { arrived[event.event ?? "?"] = try event.jsonObject() }
                for (name, time) in times {
                    let event = try #require(arrived[name], "\(name) arrived")
                    #expect(event["time"] as? Int64 == time, "\(name): the page's time as given")
                    #expect((event["properties"] as? [String: Any])?["$time_adjustment_ms"] == nil, "\(name) not adjusted")
                }
                let native = try #require(arrived["Native"]?["properties"] as? [String: Any])
                let adjustment = try #require(native["$time_adjustment_ms"] as? Int64, "the native event is corrected")
                #expect(abs(adjustment - 3_600_000) < 1000)
            }
        }
    }

    @Test("an event's time is corrected when the wall clock moved between trigger and upload")
    func timeCorrection() throws {
        let now = BootClock.wallMillis()
        let boot = BootClock.nowNanos()
        // Recorded 10 s ago by the monotonic clock, but with a wall clock then 1 h behind.
        let recordedWall = now - 10_000 - 3_600_000
        let row = Outbox.Row(
            id: 1, seq: 1, eventID: "e", producer: "app", producerKind: .app, producerSeq: 1, wallMillis: recordedWall,
            bootNanos: boot - 10_000_000_000, bootID: .current,
            body: Array(#"{"type":"track","event":"E","time":\#(recordedWall),"properties":{"a":1}}"#.utf8), batchID: "b")
        let client = HTTPClientFactory.make()
        defer { try? client.syncShutdown() }
        try withTemporaryGroup { dir in
            let session = UploadSession(
                outbox: try Outbox(path: dir + "/o.sqlite"), client: client, configuration: UploadConfiguration(serverURL: "http://127.0.0.1:9"),
                logger: Self.logger)
            let sent = session.wireEvent(row, nowWall: now, nowBoot: boot)
            let body = try #require(try JSONSerialization.jsonObject(with: Data(sent)) as? [String: Any])
            #expect(body["time"] as? Int64 == now - 10_000)
            #expect((body["properties"] as? [String: Any])?["$time_adjustment_ms"] as? Int64 == 3_600_000)
            #expect(body["_flush_time"] as? Int64 == now)

            var other = row
            other.bootID = BootID(bytes: [UInt8](repeating: 9, count: 16))
            let untouched = try #require(try JSONSerialization.jsonObject(with: Data(session.wireEvent(other, nowWall: now, nowBoot: boot))) as? [String: Any])
            #expect(untouched["time"] as? Int64 == recordedWall, "another boot's events are sent as recorded")
        }
    }
}
