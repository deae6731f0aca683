import AsyncHTTPClient
import Foundation
import Logging
import NIOCore
import NIOHTTP1
import Synchronization
import TributaryStore
import TributaryWire


extension UploadSession {
    /// POSTs one encoded batch, running `whileWaiting` while the request is out; returns the answer
    /// and what `whileWaiting` came to. `cancelWhen` (see ``step(maxEvents:timeout:cancelWhen:)``)
    /// cancels the request when it returns first.
    ///
    /// The request is handed to the HTTP client before anything else, and `whileWaiting` (reading the
    /// next batch ahead: an SQLite read and gzip, several ms) runs beside it. The other way round, the
    /// request waited for a thread of the cooperative pool, which is as wide as the machine has CPUs:
    /// on 2 CPUs, one thread held by the loop's drain and the other by the read-ahead, the request left
    /// only once the read-ahead was done, and the collector idled meanwhile (a 2,000-event batch every
    /// 16.4–18.0 ms, medians, against 14.5–15.9 ms with this change alone: docs/performance.md,
    /// "Seventeenth round"). So the request's task is started first, before `whileWaiting`'s and the
    /// watcher's.
    func post<Aside: Sendable>(
        _ encoded: EncodedBatch, batchID: String, sentAt nowWall: Int64, timeout: Duration,
        cancelWhen: (@Sendable () async -> Void)? = nil, whileWaiting: @escaping @Sendable () -> Aside
    ) async -> (UploadOutcome, Aside) {
        guard let serverURL = configuration.serverURL else {
            // The loop uploads only with a server URL; this is the same rule where the request is made.
            // What was to run meanwhile (a deferred acknowledgement among it) still runs.
            return (.retry(reason: "no collector URL is configured", retryAfter: nil), whileWaiting())
        }
        var request = HTTPClientRequest(url: serverURL)
        request.method = .POST
        for header in encoded.headers { request.headers.add(name: header.name, value: header.value) }
        request.headers.add(name: "Idempotency-Key", value: batchID)
        request.headers.add(name: "User-Agent", value: "tributary-agent/\(TributaryAgentVersion.current)")
        if let date = httpDate(nowWall) { request.headers.add(name: "Date", value: date) }
        if let token = configuration.bearerToken { request.headers.add(name: "Authorization", value: "Bearer \(token)") }
        request.body = .bytes(ByteBuffer(bytes: encoded.body))
        if let refused = await checkPins(serverURL, timeout: timeout) { return (refused, whileWaiting()) }
        requestsSent += 1
        let (client, sent, tls) = (clients.client(for: serverURL), request, tlsCheck)
        let (outcome, aside) = await withTaskGroup(of: UploadOutcome?.self) { group in
            group.addTask { await Self.send(sent, with: client, timeout: timeout, tls: tls, serverURL: serverURL) }
            async let aside = whileWaiting()
            if let cancelWhen {
                group.addTask {
                    await cancelWhen()
                    return nil
                }
            }
            // The first to end ends the other: the answer the watcher, the watcher the request (which then
            // returns at once, cancelled). What runs beside is synchronous and not cancelled.
            var outcome = UploadOutcome.retry(reason: "cancelled", retryAfter: nil)
            while let next = await group.next() {
                group.cancelAll()
                if let next {
                    outcome = next
                    break
                }
            }
            return (outcome, await aside)
        }
        if outcome != .delivered { pinnedAt = nil }
        return (outcome, aside)
    }

    /// How long a pin check holds while every answer is a delivery: a little under the HTTP client's
    /// 60 s idle timeout, after which its next request opens a new connection.
    static let pinCheckInterval: Duration = .seconds(50)

    /// With pins: a halt when the collector's certificate key (on a handshake of the agent's own:
    /// ``TLSProbe``) is none of them; nil when it matches, or the last check still holds.
    private func checkPins(_ serverURL: String, timeout: Duration) async -> UploadOutcome? {
        guard !tlsCheck.loaded.pins.isEmpty else { return nil }
        let now = clock.now
        if let pinnedAt, pinnedAt.serverURL == serverURL, now - pinnedAt.at < Self.pinCheckInterval { return nil }
        if let refused = await tlsCheck.verifyPins(serverURL: serverURL, timeout: min(timeout, .seconds(10))) {
            pinnedAt = nil
            return refused
        }
        pinnedAt = (serverURL, now)
        return nil
    }

    /// Sends `request` and classifies its answer; a certificate problem halts (``TLSCheck``), any other
    /// transport error or a cancellation is a retry.
    static func send(
        _ request: HTTPClientRequest, with client: HTTPClient, timeout: Duration, tls: TLSCheck, serverURL: String
    ) async -> UploadOutcome {
        do {
            let response = try await client.execute(request, timeout: .init(timeout))
            CrashPoint.hit("upload.after-send")
            let status = Int(response.status.code)
            // Cancelled (deadline, or the answer not read a second after its timeout) while reading the
            // body, the status line still decides, with no reason: a 2xx is the collector's
            // acknowledgement however slowly the rest comes (taken as a retry, a collector that always
            // dribbles its body got the same batch for ever), a 401 still halts, a 429's Retry-After
            // still holds.
            let reason = (try? await Self.reason(of: response.body)) ?? ""
            return UploadOutcome.classify(
                status: status, retryAfter: response.headers.first(name: "Retry-After"),
                date: response.headers.first(name: "Date"), body: reason)
        } catch is CancellationError {
            return .retry(reason: "cancelled", retryAfter: nil)
        } catch {
            if let halt = await tls.outcome(for: error, serverURL: serverURL) { return halt }
            return .retry(reason: "transport error: \(error)", retryAfter: nil)
        }
    }

    /// The start of a response body (the reason a collector gives for its answer), read to its end so
    /// that the connection can be used again. The status decides what the answer means, never the
    /// body's length: a 2xx with a long body is still an acknowledgement, a 400 with an HTML error page
    /// still a rejection. A body that breaks off after the status line only shortens the reason.
    static func reason(of body: HTTPClientResponse.Body) async throws(CancellationError) -> String {
        var head = ByteBuffer()
        do {
            for try await part in body where head.readableBytes < reasonBytes {
                var part = part
                head.writeImmutableBuffer(part.readSlice(length: min(part.readableBytes, reasonBytes - head.readableBytes))!)
            }
        } catch {
            if Task.isCancelled { throw CancellationError() }
        }
        return String(decoding: head.readableBytesView, as: UTF8.self)
    }

    /// How much of a response body ``reason(of:)`` keeps.
    static let reasonBytes = 1024

    /// The event as sent: `_flush_time` added, and `time` corrected if the wall clock moved.
    func wireEvent(_ row: Outbox.Row, nowWall: Int64, nowBoot: UInt64) -> [UInt8] {
        var body = BatchBodyBuilder(format: .sensors)
        Self.append(row, at: WireClock(wallMillis: nowWall, bootNanos: nowBoot), to: &body)
        return Array(body.text.dropFirst())  // the builder's text is "[" and the event
    }

    /// Appends an outbox row as sent, as the event form below does.
    static func append(_ row: Outbox.Row, at clock: WireClock, to body: inout BatchBodyBuilder) {
        row.body.withUnsafeBytes { bytes in
            row.bootID.bytes.withUnsafeBytes { bootID in
                append(
                    Outbox.BatchEvent(wallMillis: row.wallMillis, bootNanos: row.bootNanos, bootID: bootID, body: bytes),
                    at: clock, to: &body)
            }
        }
    }

    /// Whether the kernel gave this boot an id: with the unknown (all-zero) one, which also marks a
    /// reading that cannot be compared, no event is taken for this boot's (decided once, not per event).
    static let bootKnown = BootID.current != .unknown

    /// Appends an event as sent: `_flush_time` added, and `time` corrected if the wall clock moved.
    ///
    /// If the event was recorded in this boot and the wall-clock time since then disagrees with the
    /// `CLOCK_BOOTTIME` time since then by more than a second, the clock was changed in between: `time`
    /// is recomputed from the monotonic reading and `$time_adjustment_ms` records the change (in an
    /// event's properties; not in a profile record's, which are the user's profile). The
    /// unknown (all-zero) boot id is never taken for this boot: it marks a reading that cannot be
    /// compared (no boot id from the kernel, or a hybrid page's time before this boot or after its
    /// recording), so such an event is sent as recorded.
    static func append(_ event: Outbox.BatchEvent, at clock: WireClock, to body: inout BatchBodyBuilder) {
        clock.flushTimeMember.withUnsafeBytes { member in
            if Self.bootKnown, clock.bootNanos >= event.bootNanos, event.bootID.elementsEqual(BootID.current.bytes) {
                let expected = clock.wallMillis - Int64((clock.bootNanos - event.bootNanos) / 1_000_000)
                let adjustment = expected - event.wallMillis
                if abs(adjustment) > 1000, let corrected = correctTime(Array(event.body), to: expected, adjustment: adjustment) {
                    corrected.withUnsafeBytes { body.append($0, member: member) }
                    return
                }
            }
            body.append(event.body, member: member)
        }
    }

    static func correctTime(_ body: [UInt8], to time: Int64, adjustment: Int64) -> [UInt8]? {
        guard var event = try? JSONSerialization.jsonObject(with: Data(body)) as? [String: Any] else { return nil }
        event["time"] = time
        // A profile record's properties are the user's profile: the correction is not one of them.
        if !Enricher.isProfile(event) {
            var properties = event["properties"] as? [String: Any] ?? [:]
            properties["$time_adjustment_ms"] = adjustment
            event["properties"] = properties
        }
        return (try? JSONSerialization.data(withJSONObject: event, options: [.withoutEscapingSlashes])).map(Array.init)
    }
}

/// The moment a batch is sent: what each event's `_flush_time` and time correction use.
struct WireClock {
    var wallMillis: Int64
    var bootNanos: UInt64
    /// `"_flush_time":<wallMillis>`.
    let flushTimeMember: [UInt8]

    init(wallMillis: Int64, bootNanos: UInt64) {
        self.wallMillis = wallMillis
        self.bootNanos = bootNanos
        flushTimeMember = Array("\"_flush_time\":\(wallMillis)".utf8)
    }
}

/// The agent's version, sent in `User-Agent`.
public enum TributaryAgentVersion {
    public static let current = "0.1.0"
}

/// An IMF-fixdate (RFC 9110 §5.6.7), e.g. `Sun, 06 Nov 1994 08:49:37 GMT`, of `millis` since the
/// epoch; nil for an instant `gmtime_r` cannot break down (its year overflows).
///
/// Built from `gmtime_r`: a `DateFormatter` per request (ICU's setup) cost 1.7 % of the agent's CPU.
func httpDate(_ millis: Int64) -> String? {
    var seconds = time_t(millis >= 0 ? millis / 1000 : (millis - 999) / 1000)
    var parts = tm()
    guard gmtime_r(&seconds, &parts) != nil else { return nil }
    func two(_ value: Int32) -> String { value < 10 ? "0\(value)" : "\(value)" }
    let year = String(parts.tm_year + 1900)
    return "\(httpDays[Int(parts.tm_wday)]), \(two(parts.tm_mday)) \(httpMonths[Int(parts.tm_mon)]) "
        + String(repeating: "0", count: max(0, 4 - year.count)) + year + " "
        + "\(two(parts.tm_hour)):\(two(parts.tm_min)):\(two(parts.tm_sec)) GMT"
}

/// `tm_wday` and `tm_mon` as an IMF-fixdate names them.
private let httpDays = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"]
private let httpMonths = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
