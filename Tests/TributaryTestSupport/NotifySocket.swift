import Foundation
import Synchronization

/// A fake systemd `NOTIFY_SOCKET`: a Unix datagram socket that records every message with the time
/// it arrived, as systemd's service manager would receive them.
public final class NotifySocket: Sendable {
    /// One datagram.
    public struct Message: Sendable {
        /// Seconds since the socket was opened.
        public var at: Double
        /// When it arrived, stamped by the socket's own reading thread (never held up by a busy Swift
        /// concurrency pool): compare it with ``ChildProcess/exitedAt``.
        public var instant: ContinuousClock.Instant
        /// The `KEY=VALUE` lines.
        public var text: String
    }

    public let path: String
    private let fd: Int32
    private final class Inbox: Sendable {
        let messages = Mutex<[Message]>([])
        let stopped = Atomic<Bool>(false)
    }

    private let inbox = Inbox()

    public init(path: String) throws {
        self.path = path
        fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8)
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            raw.copyBytes(from: bytes)
            raw[bytes.count] = 0
        }
        let rc = withUnsafePointer(to: &address) { p in
            p.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        guard fd >= 0, rc == 0 else { throw CocoaError(.fileWriteUnknown) }
        let start = Date()
        Thread.detachNewThread { [fd, inbox] in
            var buffer = [UInt8](repeating: 0, count: 4096)
            while !inbox.stopped.load(ordering: .acquiring) {
                var pfd = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
                guard poll(&pfd, 1, 50) > 0 else { continue }
                let n = recv(fd, &buffer, buffer.count, Int32(MSG_DONTWAIT))
                if n > 0 {
                    let text = String(decoding: buffer[0..<n], as: UTF8.self)
                    inbox.messages.withLock { $0.append(Message(at: Date().timeIntervalSince(start), instant: .now, text: text)) }
                }
            }
            close(fd)
        }
    }

    deinit {
        inbox.stopped.store(true, ordering: .releasing)
        unlink(path)
    }

    /// Everything received so far.
    public var received: [Message] { inbox.messages.withLock { $0 } }

    /// Waits until a message containing `line` arrives (or the timeout passes); returns it.
    public func wait(for line: String, timeout: Double = 10) async -> Message? {
        let end = Date().addingTimeInterval(timeout)
        while Date() < end {
            if let m = received.first(where: { $0.text.split(separator: "\n").contains(Substring(line)) }) { return m }
            try? await Task.sleep(for: .milliseconds(10))
        }
        return nil
    }
}
