import Foundation
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
final class DevToolsPipe: Sendable {
    private struct State {
        var nextID = 1
        var waiting: [Int: CheckedContinuation<JSON, any Error>] = [:]
        var closed = false
    }

    private let browser: ChromiumProcess
    private let state = Mutex(State())
    private let writeLock = Mutex(())

    init(browser: ChromiumProcess, onMessage: @escaping @Sendable (DevToolsMessage) -> Void) {
        self.browser = browser
        let fd = browser.replyFD
        let thread = Thread { [self] in
            self.readLoop(fd: fd, onMessage: onMessage)
        }
        thread.name = "tributary.devtools"
        thread.start()
    }

    /// Sends a command without waiting for its reply.
    @discardableResult
    func send(_ method: String, _ params: [String: JSON] = [:], session: String? = nil) -> Int {
        let id = state.withLock { state in
            defer { state.nextID += 1 }
            return state.nextID
        }
        write(id: id, method: method, params: params, session: session)
        return id
    }

    /// Sends a command and returns its result.
    func call(_ method: String, _ params: [String: JSON] = [:], session: String? = nil) async throws -> JSON {
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
            write(id: id, method: method, params: params, session: session)
        }
    }

    private func write(id: Int, method: String, params: [String: JSON], session: String?) {
        var message: [String: JSON] = ["id": .number(Double(id)), "method": .string(method), "params": .object(params)]
        if let session { message["sessionId"] = .string(session) }
        let bytes = Array(JSON.object(message).text.utf8) + [0]
        writeLock.withLock { _ in
            var offset = 0
            while offset < bytes.count {
                let n = bytes[offset...].withUnsafeBytes { Glibc.write(browser.commandFD, $0.baseAddress, $0.count) }
                if n < 0 && errno == EINTR { continue }
                if n <= 0 { return }  // the browser is gone; the reader reports it
                offset += n
            }
        }
    }

    private func readLoop(fd: Int32, onMessage: @Sendable (DevToolsMessage) -> Void) {
        var pending: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 64 << 10)
        while true {
            let n = chunk.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
            if n < 0 && errno == EINTR { continue }
            if n <= 0 { break }
            pending.append(contentsOf: chunk[0..<n])
            while let end = pending.firstIndex(of: 0) {
                if let json = JSON.parse(pending[..<end]) { dispatch(json, onMessage) }
                pending.removeSubrange(...end)
            }
        }
        close(fd)
        let waiting = state.withLock { state in
            state.closed = true
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

    private func dispatch(_ json: JSON, _ onMessage: (DevToolsMessage) -> Void) {
        let id = json["id"]?.number.map { Int($0) }
        let message = DevToolsMessage(
            id: id, method: json["method"]?.string, sessionID: json["sessionId"]?.string,
            body: json["params"] ?? json["result"] ?? .null, error: json["error"]?["message"]?.string)
        if let id {
            let continuation = state.withLock { $0.waiting.removeValue(forKey: id) }
            if let error = message.error {
                continuation?.resume(throwing: BrowserError(.protocolError, "DevTools command \(id) failed: \(error)"))
            } else {
                continuation?.resume(returning: message.body)
            }
        }
        onMessage(message)
    }
}
