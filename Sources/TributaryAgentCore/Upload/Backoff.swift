import Foundation
import TributaryStore

/// Exponential backoff with full jitter (AWS "Exponential Backoff and Jitter"):
/// the n-th retry waits a uniformly random time in [0, min(cap, base·2ⁿ)].
///
/// A `Retry-After` from the collector is honoured, clamped to ``maxRetryAfter``: the wait is the
/// larger of the jittered backoff and the clamped `Retry-After` (as the OpenTelemetry exporter does),
/// so a `Retry-After` in the past or of 0 never turns into a tight retry loop.
public struct Backoff: Sendable, Hashable {
    /// The first retry's upper bound. Default 1 s.
    public var base: Duration
    /// The largest upper bound. Default 60 s.
    public var cap: Duration
    /// The longest `Retry-After` honoured. Default 300 s.
    public var maxRetryAfter: Duration

    /// A backoff policy.
    public init(base: Duration = .seconds(1), cap: Duration = .seconds(60), maxRetryAfter: Duration = .seconds(300)) {
        self.base = base
        self.cap = cap
        self.maxRetryAfter = maxRetryAfter
    }

    /// The upper bound of the wait before retry number `attempt` (0-based).
    public func ceiling(attempt: Int) -> Duration {
        let factor = Double(1 << min(max(attempt, 0), 30))
        let seconds = min(cap.seconds, base.seconds * factor)
        return .seconds(seconds)
    }

    /// The wait before retry number `attempt`, given an optional `Retry-After`.
    public func delay<G: RandomNumberGenerator>(
        attempt: Int, retryAfter: Duration? = nil, using generator: inout G
    ) -> Duration {
        let jittered = Duration.seconds(Double.random(in: 0...1, using: &generator) * ceiling(attempt: attempt).seconds)
        guard let retryAfter else { return jittered }
        return max(jittered, clamped(retryAfter))
    }

    /// A `Retry-After` as honoured: at least 0, at most ``maxRetryAfter``.
    public func clamped(_ retryAfter: Duration) -> Duration { min(max(retryAfter, .zero), maxRetryAfter) }

    /// Parses a `Retry-After` header: delta-seconds, or an HTTP-date relative to the response's `Date`
    /// header `date` when there is one (the collector's own clock: a device clock that is off would
    /// otherwise turn every date into no wait, or into the whole `maxRetryAfter`), else to `now`.
    /// Garbage yields nil (and the plain backoff applies).
    public static func parseRetryAfter(
        _ value: String?, date: String? = nil,
        now: Date = Date(timeIntervalSince1970: Double(BootClock.wallMillis()) / 1000)
    ) -> Duration? {
        guard let text = value?.trimmingCharacters(in: .whitespaces), !text.isEmpty else { return nil }
        if let seconds = Int64(text) { return seconds >= 0 ? .seconds(seconds) : nil }
        // delta-seconds has no upper bound (RFC 9110 §10.2.3): more digits than an Int64 holds is a long
        // wait, clamped by `maxRetryAfter` like any other, not garbage to retry after at once.
        if text.utf8.allSatisfy({ $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") }) { return .seconds(Int64.max) }
        guard let until = httpDate(text) else { return nil }
        return .seconds(max(0, until.timeIntervalSince(date.flatMap(httpDate) ?? now)))
    }

    /// An HTTP-date (RFC 9110 §5.6.7: IMF-fixdate, or the obsolete RFC 850 and asctime forms), or nil.
    static func httpDate(_ text: String) -> Date? {
        let text = text.trimmingCharacters(in: .whitespaces)
        for format in ["EEE, dd MMM yyyy HH:mm:ss zzz", "EEEE, dd-MMM-yy HH:mm:ss zzz", "EEE MMM d HH:mm:ss yyyy"] {
            let formatter = DateFormatter()
            formatter.locale = Locale(identifier: "en_US_POSIX")
            formatter.timeZone = TimeZone(identifier: "GMT")
            formatter.dateFormat = format
            if let date = formatter.date(from: text) { return date }
        }
        return nil
    }
}

extension Duration {
    /// The duration in seconds, as a Double.
    public var seconds: Double {
        let (s, attoseconds) = components
        return Double(s) + Double(attoseconds) / 1e18
    }
}
