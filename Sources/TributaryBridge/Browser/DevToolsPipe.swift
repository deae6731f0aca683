import Foundation
import Logging
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// One DevTools protocol message from the browser: a reply (`id`) or an event (`method`).
public struct DevToolsMessage: Sendable {
    /// The command id this replies to, for a reply.
    public var id: Int?
    /// The event name, for an event (`Runtime.bindingCalled`, …).
    public var method: String?
    /// The flattened session the message belongs to (nil for the browser target).
    public var sessionID: String?
    /// `params` of an event, `result` of a reply.
    public var body: JSON
    /// `error.message` of a failed command.
    public var error: String?
}

/// The DevTools protocol over Chromium's pipe: NUL-terminated JSON messages, commands with ids.
///
/// One reader thread (blocking `read` must not occupy a Swift concurrency thread) splits the byte
/// stream and hands every message, in order, to `onMessage`. Replies also resume whoever awaits them.
/// Commands are written in order by a serial queue of their own, never by the caller: a browser that
/// stops reading its pipe (stopped, hung) blocks that queue's write, not the app's concurrency threads,
/// and a call to it still times out. What waits to be written is bounded (``maxQueuedCommandBytes``).
final class DevToolsPipe: Sendable {
    private struct State {
        var nextID = 1
        var waiting: [Int: CheckedContinuation<JSON, any Error>] = [:]
        /// The commands sent without waiting (``send(_:_:session:failureLevel:)``) whose reply has not
        /// come, by id: a failure is logged with the command's name, at the level it was sent with.
        var unanswered: [Int: (method: String, failureLevel: Logger.Level)] = [:]
        var closed = false
    }

    private let browser: ChromiumProcess
    private let state = Mutex(State())
    /// Writes the commands, in the order they were sent.
    private let writer = DispatchQueue(label: "tributary.devtools.writer")
    /// Bytes of commands handed to ``writer`` and not written yet.
    private let queuedBytes = Atomic<Int>(0)

    /// The most bytes of commands waiting to be written; a command beyond it fails at once. The host
    /// sends a few kilobytes per target: 16 MiB waiting means the browser has stopped reading.
    static let maxQueuedCommandBytes = 16 << 20

    /// How many commands sent without waiting have had no reply yet.
    var unansweredCount: Int { state.withLock { $0.unanswered.count } }
    private let logger: Logger

    /// - Parameter maxFrameBytes: the largest frame read; a longer one is skipped up to its NUL and
    ///   reported as a ``frameTooLargeEvent`` (see ``FrameSplitter``).
    init(
        browser: ChromiumProcess, maxFrameBytes: Int, logger: Logger = Logger(label: "tributary.devtools"),
        onMessage: @escaping @Sendable (DevToolsMessage) -> Void
    ) {
        self.browser = browser
        self.logger = logger
        let fd = browser.replyFD
        let thread = Thread { [self] in
            self.readLoop(fd: fd, maxFrameBytes: maxFrameBytes, onMessage: onMessage)
        }
        thread.name = "tributary.devtools"
        thread.start()
    }

    /// Sends a command without waiting for its reply; a reply that says it failed is logged at
    /// `failureLevel` (a warning by default: a target the bridge's binding or script could not be set up
    /// in misses page events). A command to a browser that is gone is dropped: the reader reports the
    /// end (``closedEvent``). Returns the command's id (0 for one dropped so).
    @discardableResult
    func send(
        _ method: String, _ params: [String: JSON] = [:], session: String? = nil,
        failureLevel: Logger.Level = .warning
    ) -> Int {
        let id: Int? = state.withLock { state in
            // After the pipe closed no reply comes, and nothing would forget the entry.
            guard !state.closed else { return nil }
            defer { state.nextID += 1 }
            state.unanswered[state.nextID] = (method, failureLevel)
            return state.nextID
        }
        guard let id else { return 0 }
        write(id: id, method: method, params: params, session: session) { [self] error in
            guard state.withLock({ $0.unanswered.removeValue(forKey: id) }) != nil else { return }  // no reply will come
            // Not when the browser is gone: the reader reports that once. A browser that stopped reading
            // (too much waits unwritten) is a warning whatever the command.
            if error.code != .browserExited {
                logger.log(level: error.code == .timedOut ? .warning : failureLevel, "DevTools command not sent", metadata: [
                    "tributary.devtools.method": "\(method)", "tributary.devtools.error": "\(error)",
                    "tributary.devtools.session": "\(session ?? "browser")",
                ])
            }
        }
        return id
    }

    /// Sends a command and returns its result; throws ``BrowserError/Code-swift.struct/timedOut`` when
    /// no answer comes within `timeout`.
    func call(
        _ method: String, _ params: [String: JSON] = [:], session: String? = nil, timeout: Duration = .seconds(30)
    ) async throws -> JSON {
        try await withCheckedThrowingContinuation { continuation in
            let id: Int? = state.withLock { state in
                guard !state.closed else { return nil }
                defer { state.nextID += 1 }
                state.waiting[state.nextID] = continuation
                return state.nextID
            }
            guard let id else {
                continuation.resume(throwing: BrowserError(.browserExited, "The browser closed its DevTools pipe."))
                return
            }
            // A browser that hangs (or an executable that is no Chromium) must not hold the caller for ever.
            Task { [weak self] in
                try? await Task.sleep(for: timeout)
                guard let waiting = self?.state.withLock({ $0.waiting.removeValue(forKey: id) }) else { return }
                waiting.resume(
                    throwing: BrowserError(
                        .timedOut, "The browser did not answer DevTools command \(method) within \(timeout)."))
            }
            write(id: id, method: method, params: params, session: session) { [self] error in
                // Unless the reader, seeing the pipe close, or the timeout has failed it already.
                let waiting = state.withLock { $0.waiting.removeValue(forKey: id) }
                waiting?.resume(throwing: error)
            }
        }
    }

    /// Hands command `id` to ``writer``; calls `failed` (on the writer's queue, or here when too much
    /// waits already) when it cannot be written.
    private func write(
        id: Int, method: String, params: [String: JSON], session: String?,
        failed: @escaping @Sendable (BrowserError) -> Void
    ) {
        var message: [String: JSON] = ["id": .number(Double(id)), "method": .string(method), "params": .object(params)]
        if let session { message["sessionId"] = .string(session) }
        let bytes = Array(JSON.object(message).text.utf8) + [0]
        let waiting = queuedBytes.add(bytes.count, ordering: .relaxed).newValue
        guard waiting - bytes.count == 0 || waiting <= Self.maxQueuedCommandBytes else {
            queuedBytes.subtract(bytes.count, ordering: .relaxed)
            failed(
                BrowserError(
                    .timedOut,
                    "The browser has not read \(waiting - bytes.count) bytes of DevTools commands; it is not answering."))
            return
        }
        writer.async { [self] in
            defer { queuedBytes.subtract(bytes.count, ordering: .relaxed) }
            do throws(BrowserError) {
                try browser.commands.write(bytes)
            } catch {
                failed(error)
            }
        }
    }

    private func readLoop(fd: Int32, maxFrameBytes: Int, onMessage: @Sendable (DevToolsMessage) -> Void) {
        var frames = FrameSplitter(maxFrameBytes: maxFrameBytes)
        var chunk = [UInt8](repeating: 0, count: 64 << 10)
        while true {
            let n = chunk.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
            if n < 0 && errno == EINTR { continue }
            if n <= 0 { break }
            chunk.withUnsafeBytes { bytes in
                frames.consume(UnsafeRawBufferPointer(rebasing: bytes[0..<n])) { frame in
                    switch frame {
                    case .complete(let text):
                        if let json = JSON.parse(text) {
                            dispatch(json, onMessage)
                        } else {
                            logger.warning("DevTools frame that is not JSON skipped", metadata: [
                                "tributary.devtools.bytes": "\(text.count)",
                            ])
                        }
                    case .tooLarge(let skipped):
                        dispatchTooLarge(skipped, onMessage)
                    }
                }
            }
        }
        close(fd)
        let waiting = state.withLock { state in
            state.closed = true
            state.unanswered = [:]
            defer { state.waiting = [:] }
            return state.waiting
        }
        for continuation in waiting.values {
            continuation.resume(throwing: BrowserError(.browserExited, "The browser closed its DevTools pipe."))
        }
        onMessage(DevToolsMessage(id: nil, method: Self.closedEvent, sessionID: nil, body: .null, error: nil))
    }

    /// The pseudo-event delivered once when the pipe closes.
    static let closedEvent = "Tributary.pipeClosed"

    /// The pseudo-event delivered for a frame over the bound, which was skipped unread. Its body has
    /// `bytes` (the frame's length) and, as far as the frame's first and last bytes tell, the frame's
    /// `method` and `executionContextId`; its session is the frame's `sessionId`.
    static let frameTooLargeEvent = "Tributary.frameTooLarge"

    private func dispatchTooLarge(_ skipped: FrameSplitter.SkippedFrame, _ onMessage: (DevToolsMessage) -> Void) {
        var body: [String: JSON] = ["bytes": .number(Double(skipped.byteCount))]
        let method = skipped.string(after: #""method":""#)
        if let method { body["method"] = .string(method) }
        // A frame attached with a huge creation stack: its parent link still matters (who may navigate it).
        if method == "Page.frameAttached" {
            if let frame = skipped.string(after: #""frameId":""#) { body["frameId"] = .string(frame) }
            if let parent = skipped.string(after: #""parentFrameId":""#) { body["parentFrameId"] = .string(parent) }
        }
        if let context = skipped.integer(after: #""executionContextId":"#) {
            body["executionContextId"] = .integer(Int64(context))
        }
        // A reply starts with its id: its caller learns it was too large instead of waiting for ever.
        if skipped.head.starts(with: Array(#"{"id":"#.utf8)), let id = skipped.integer(after: #"{"id":"#) {
            let continuation = state.withLock { $0.waiting.removeValue(forKey: id) }
            continuation?.resume(
                throwing: BrowserError(
                    .protocolError,
                    "The reply to DevTools command \(id) has \(skipped.byteCount) bytes; it was not read."))
        }
        onMessage(
            DevToolsMessage(
                id: nil, method: Self.frameTooLargeEvent, sessionID: skipped.string(after: #""sessionId":""#),
                body: .object(body), error: nil))
    }

    private func dispatch(_ json: JSON, _ onMessage: (DevToolsMessage) -> Void) {
        // An id no command of ours has (1e19, 1.5) answers none: read as no id, not trapped on.
        let id = json["id"]?.int
        let message = DevToolsMessage(
            id: id, method: json["method"]?.string, sessionID: json["sessionId"]?.string,
            body: json["params"] ?? json["result"] ?? .null, error: json["error"]?["message"]?.string)
        if let id {
            let (continuation, sent) = state.withLock { state in
                (state.waiting.removeValue(forKey: id), state.unanswered.removeValue(forKey: id))
            }
            if let sent, let error = message.error {
                logger.log(level: sent.failureLevel, "DevTools command failed", metadata: [
                    "tributary.devtools.method": "\(sent.method)", "tributary.devtools.error": "\(error)",
                    "tributary.devtools.session": "\(message.sessionID ?? "browser")",
                ])
            }
            if let error = message.error {
                continuation?.resume(throwing: BrowserError(.protocolError, "DevTools command \(id) failed: \(error)"))
            } else {
                continuation?.resume(returning: message.body)
            }
        }
        onMessage(message)
    }
}

/// Splits the browser's byte stream into its NUL-terminated frames, holding at most `maxFrameBytes`
/// of one.
///
/// A page decides how long some frames are: a `Runtime.bindingCalled` frame carries whatever string
/// the page passed, from any frame, foreign iframes included. So the NUL search resumes where the
/// last chunk's ended (every byte is looked at once, however the frame is cut into reads), and a frame
/// that outgrows the bound is skipped up to its NUL, keeping only its first and last
/// ``SkippedFrame/windowBytes`` bytes: enough for the keys the DevTools protocol writes before and
/// after a page's string (`method`; `executionContextId`, `sessionId`). A 256 MB string then costs
/// one pass over it, not a quadratic rescan, and never more than the bound in memory; the messages
/// behind it wait only for that pass.
struct FrameSplitter {
    /// A frame that was skipped: its length and its first and last bytes.
    struct SkippedFrame: Sendable {
        /// How many bytes of the first and of the last are kept.
        static let windowBytes = 512

        /// The frame's length in bytes, its NUL not counted.
        var byteCount: Int
        /// Its first ``windowBytes`` bytes.
        var head: [UInt8]
        /// Its last ``windowBytes`` bytes.
        var tail: [UInt8]

        /// The text after `key` up to the next `"`, in the head or else the tail. A key written with
        /// bare quotes (`"sessionId":"`) cannot occur inside a JSON string, where a quote is `\"`, so
        /// what a page put into a string is never read as one of the protocol's keys.
        func string(after key: String) -> String? {
            value(after: key) { $0 != UInt8(ascii: "\"") }.map { String(decoding: $0, as: UTF8.self) }
        }

        /// The decimal digits after `key`, in the head or else the tail.
        func integer(after key: String) -> Int? {
            value(after: key) { (UInt8(ascii: "0")...UInt8(ascii: "9")).contains($0) }
                .flatMap { Int(String(decoding: $0, as: UTF8.self)) }
        }

        private func value(after key: String, while accept: (UInt8) -> Bool) -> ArraySlice<UInt8>? {
            let pattern = Array(key.utf8)
            for window in [head, tail] {
                guard let start = window.firstRange(of: pattern)?.upperBound else { continue }
                let end = window[start...].firstIndex { !accept($0) }
                // A value running to the window's end may be cut short: not taken.
                guard let end, end > start else { continue }
                return window[start..<end]
            }
            return nil
        }
    }

    /// What ``consume(_:_:)`` found.
    enum Frame {
        /// A whole frame, its NUL removed.
        case complete(ArraySlice<UInt8>)
        /// A frame over the bound, skipped.
        case tooLarge(SkippedFrame)
    }

    /// The largest frame kept.
    let maxFrameBytes: Int
    private var frame: [UInt8] = []
    private var skipped: SkippedFrame?
    /// Bytes the NUL search has looked at: each byte read once (what the tests hold the splitter to).
    private(set) var scannedBytes = 0

    /// Bytes held of the frame being read: never more than ``maxFrameBytes``.
    var bufferedBytes: Int { frame.count }

    init(maxFrameBytes: Int) { self.maxFrameBytes = maxFrameBytes }

    /// Takes the next bytes of the stream; calls `emit` for every frame they end, in order.
    mutating func consume(_ bytes: UnsafeRawBufferPointer, _ emit: (Frame) -> Void) {
        guard let base = bytes.baseAddress else { return }
        var start = 0
        while start < bytes.count {
            let nul = memchr(base + start, 0, bytes.count - start).map { base.distance(to: UnsafeRawPointer($0)) }
            let end = nul ?? bytes.count
            scannedBytes += (nul.map { $0 + 1 } ?? end) - start
            take(UnsafeRawBufferPointer(rebasing: bytes[start..<end]))
            guard nul != nil else { return }
            if let done = skipped {
                emit(.tooLarge(done))
                skipped = nil
            } else {
                emit(.complete(frame[...]))
            }
            frame.removeAll(keepingCapacity: frame.capacity <= 1 << 20)
            start = end + 1
        }
    }

    /// Appends a piece of the current frame, or, past the bound, only notes its length and last bytes.
    private mutating func take(_ piece: UnsafeRawBufferPointer) {
        let window = SkippedFrame.windowBytes
        if var current = skipped {
            current.byteCount += piece.count
            current.tail = Array((current.tail + piece.suffix(window)).suffix(window))
            skipped = current
        } else if frame.count + piece.count <= maxFrameBytes {
            frame.append(contentsOf: piece)
        } else {
            skipped = SkippedFrame(
                byteCount: frame.count + piece.count,
                head: Array((frame.prefix(window) + piece.prefix(window)).prefix(window)),
                tail: Array((frame.suffix(window) + piece.suffix(window)).suffix(window)))
            frame.removeAll()
        }
    }
}
