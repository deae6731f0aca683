import Foundation
import Testing
import TributaryCollector  // SplitMix64, the seeded generator the collector's faults use
@testable import TributaryAgentCore

@Suite("Backoff")
struct BackoffTests {
    let policy = Backoff(base: .seconds(1), cap: .seconds(30), maxRetryAfter: .seconds(120))

    @Test("ceilings double from the base up to the cap")
    func ceilings() {
        #expect((0..<8).map { policy.ceiling(attempt: $0) } == [1, 2, 4, 8, 16, 30, 30, 30].map { .seconds($0) })
        #expect(policy.ceiling(attempt: 10_000) == .seconds(30))
    }

    @Test("full jitter stays within [0, ceiling] and spreads over it", arguments: [1 as UInt64, 42, 7777])
    func jitterBounds(seed: UInt64) {
        var rng = SplitMix64(seed: seed)
        for attempt in 0..<12 {
            let ceiling = policy.ceiling(attempt: attempt)
            let draws = (0..<200).map { _ in policy.delay(attempt: attempt, using: &rng) }
            #expect(draws.allSatisfy { $0 >= .zero && $0 <= ceiling })
            #expect(draws.min()! < ceiling * 0.2 && draws.max()! > ceiling * 0.8, "not full jitter")
        }
    }

    @Test("Retry-After is honoured but clamped, and never shortens the backoff")
    func retryAfter() {
        var rng = SplitMix64(seed: 9)
        #expect(policy.delay(attempt: 0, retryAfter: .seconds(5), using: &rng) == .seconds(5))
        #expect(policy.delay(attempt: 0, retryAfter: .seconds(100_000), using: &rng) == .seconds(120))
        // A Retry-After of 0 (or in the past) leaves the jittered backoff as it is: draw by draw the
        // same waits as without one, from generators with the same seed.
        var withZero = SplitMix64(seed: 11)
        var without = SplitMix64(seed: 11)
        let zeroes = (0..<100).map { _ in policy.delay(attempt: 3, retryAfter: .zero, using: &withZero) }
        let plain = (0..<100).map { _ in policy.delay(attempt: 3, using: &without) }
        #expect(zeroes == plain)
        #expect(zeroes.max()! > .seconds(4), "a Retry-After of 0 must not turn the backoff into a tight loop")
        // A Retry-After below the ceiling is a floor: never less, but the jitter still reaches above it.
        let floored = (0..<100).map { _ in policy.delay(attempt: 3, retryAfter: .seconds(1), using: &rng) }
        #expect(floored.allSatisfy { $0 >= .seconds(1) && $0 <= .seconds(8) })
        #expect(floored.max()! > .seconds(4))
    }

    @Test("Retry-After parsing", arguments: [
        ("120", 120.0 as Double?), ("0", 0), ("  7 ", 7), ("-5", nil), ("soon", nil), ("", nil),
        ("Wed, 21 Oct 2015 07:28:00 GMT", 0),  // in the past
        ("99999999999999999999", Double(Int64.max)),  // beyond Int64: a long wait, which the policy clamps
    ])
    func parse(header: String, seconds: Double?) {
        #expect(Backoff.parseRetryAfter(header).map(\.seconds) == seconds)
    }

    @Test("a Retry-After date is read against the collector's Date header, not the device's clock")
    func retryAfterAgainstServerDate() {
        // The device's clock is years off (today's date against a collector's of 2015): the wait is still
        // the 60 s between the collector's two dates.
        let outcome = UploadOutcome.classify(
            status: 429, retryAfter: "Wed, 21 Oct 2015 07:28:00 GMT", date: "Wed, 21 Oct 2015 07:27:00 GMT", body: "")
        guard case .retry(_, let wait) = outcome else {
            Issue.record("429 is a retry: \(outcome)")
            return
        }
        #expect(wait == .seconds(60))
        // Without a Date, the device's clock: a date in its past is no wait.
        let withoutDate = UploadOutcome.classify(status: 429, retryAfter: "Wed, 21 Oct 2015 07:28:00 GMT", body: "")
        guard case .retry(_, let fallback) = withoutDate else {
            Issue.record("429 without a Date is a retry too: \(withoutDate)")
            return
        }
        #expect(fallback == .zero)
    }

    @Test("Retry-After as an HTTP date in the future")
    func parseFutureDate() throws {
        let now = Date(timeIntervalSince1970: 1_445_412_400)  // 2015-10-21 07:26:40 GMT
        let d = try #require(Backoff.parseRetryAfter("Wed, 21 Oct 2015 07:28:00 GMT", now: now))
        #expect(d == .seconds(80))
    }

    @Test("a collector's answer becomes a one-line reason: whitespace runs one space, other control characters escaped")
    func reasonOneLine() {
        let page = "<html>\r\n<head><title>400 Bad Request</title></head>\r\n\t<body>\u{1B}[2Jbad\u{7F}</body>\r\n"
        let outcome = UploadOutcome.classify(status: 400, retryAfter: nil, body: page)
        guard case .rejected(400, let reason) = outcome else {
            Issue.record("a 400 is a rejection, not \(outcome)")
            return
        }
        #expect(reason == #"HTTP 400: <html> <head><title>400 Bad Request</title></head> <body>\u{1b}[2Jbad\u{7f}</body>"#)
        #expect(UploadOutcome.classify(status: 503, retryAfter: nil, body: " \r\n ") == .retry(reason: "HTTP 503", retryAfter: nil))
    }

    @Test("status classification", arguments: [
        (200, "delivered"), (204, "delivered"), (408, "retry"), (429, "retry"), (500, "retry"), (503, "retry"),
        (413, "tooLarge"), (400, "rejected"), (422, "rejected"), (401, "halt"), (403, "halt"), (404, "halt"),
        (415, "halt"),
    ])
    func classification(status: Int, kind: String) {
        let outcome = UploadOutcome.classify(status: status, retryAfter: nil, body: "")
        let actual = switch outcome {
        case .delivered: "delivered"
        case .retry: "retry"
        case .tooLarge: "tooLarge"
        case .rejected: "rejected"
        case .halt: "halt"
        }
        #expect(actual == kind)
    }
}
