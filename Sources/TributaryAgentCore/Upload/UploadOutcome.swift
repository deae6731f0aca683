/// What one request to the collector came to.
public enum UploadOutcome: Sendable, Equatable {
    /// 2xx: the batch is acknowledged.
    case delivered
    /// 408, 429, 5xx, timeout, reset, refused: send the same batch again later.
    case retry(reason: String, retryAfter: Duration?)
    /// 413: the batch is too large.
    case tooLarge(reason: String)
    /// 400 or 422: something in the batch is unacceptable.
    case rejected(status: Int, reason: String)
    /// 401, 403, 404 and other 4xx: keep everything, stop until the configuration is fixed.
    case halt(status: Int, reason: String)

    /// Classifies an HTTP status (with its Retry-After, the response's `Date`, and a snippet of the
    /// response body). A Retry-After date is read against the collector's `Date` when it sent one.
    static func classify(status: Int, retryAfter: String?, date: String? = nil, body: String) -> UploadOutcome {
        let snippet = oneLine(body.prefix(200))
        let reason = "HTTP \(status)" + (snippet.isEmpty ? "" : ": \(snippet)")
        switch status {
        case 200..<300: return .delivered
        case 408, 429, 500..<600:
            return .retry(reason: reason, retryAfter: Backoff.parseRetryAfter(retryAfter, date: date))
        case 413: return .tooLarge(reason: reason)
        case 400, 422: return .rejected(status: status, reason: reason)
        default: return .halt(status: status, reason: reason)
        }
    }
}

/// `text` as one line fit for a log line, a terminal and a tab-separated listing: its whitespace runs
/// (line breaks and tabs among them) become one space, any other control character its `\u{…}` escape,
/// and its ends are trimmed. A collector's answer is foreign text (an HTML error page of a proxy, say,
/// with CRLFs), and its reason is shown in `tributary status` and `tributary dead-letters`.
package func oneLine(_ text: some StringProtocol) -> String {
    var line = ""
    var pendingSpace = false
    for scalar in text.unicodeScalars {
        if scalar.properties.isWhitespace {
            pendingSpace = !line.isEmpty
            continue
        }
        if pendingSpace { line.append(" ") }
        pendingSpace = false
        if scalar.properties.generalCategory == .control {
            line += "\\u{\(String(scalar.value, radix: 16))}"
        } else {
            line.unicodeScalars.append(scalar)
        }
    }
    return line
}

/// What one upload step did (``UploadSession/step(maxEvents:timeout:cancelWhen:)``).
enum UploadStep: Equatable {
    /// Nothing to send.
    case empty
    /// Events were acknowledged or dead-lettered; go on.
    case progressed(delivered: Int, deadLettered: Int = 0)
    /// Wait this long before the next step (backoff, or the halted interval).
    case wait(Duration)
}
