import Foundation
import Synchronization
import TributaryCollector

#if canImport(Glibc)
import Glibc
#endif

/// A TCP proxy on loopback that injects the transport faults the reference collector cannot produce
/// itself, between a real client (the agent) and a real server (the collector).
///
/// It listens on `127.0.0.1:0` (see ``url``) and forwards every accepted connection to
/// `127.0.0.1:upstreamPort`, copying bytes both ways. HTTP/1.1 without pipelining takes turns, so an
/// *exchange* starts with the client's first bytes after the server last spoke; for each exchange a
/// seeded generator decides, with the mode's `rate`, whether to inject the fault:
///
/// - ``Mode/resetMidBody(rate:)``: forward the request headers and half the body (`Content-Length / 2`,
///   at least one byte), then reset both sides (`SO_LINGER {1, 0}`): the client gets an RST in the
///   middle of its request and the server a truncated request.
/// - ``Mode/slowBody(bytesPerTick:tickMillis:rate:)``: forward the server's whole response, status line
///   included, `bytesPerTick` bytes every `tickMillis` ms, so it outlasts the client's request timeout
///   although the server has already answered (and committed).
///
/// Everything runs on threads of its own with blocking POSIX calls, never on Swift's cooperative pool:
/// one accepting thread and one thread per connection, each polling with a short timeout so
/// ``stop()`` (a flag; each thread closes its own sockets) ends them promptly.
public final class FaultProxy: Sendable {
    /// The fault to inject.
    public enum Mode: Sendable, CustomStringConvertible {
        /// Reset both sides after the request headers and half the body, in `rate` of the exchanges.
        case resetMidBody(rate: Double)
        /// Dribble the response, `bytesPerTick` every `tickMillis` ms, in `rate` of the exchanges.
        case slowBody(bytesPerTick: Int, tickMillis: Int, rate: Double)
        /// Forward the response's status line and headers at once, then dribble its body,
        /// `bytesPerTick` every `tickMillis` ms, in `rate` of the exchanges: a timeout that ends at the
        /// response head does not end this.
        case slowBodyAfterHead(bytesPerTick: Int, tickMillis: Int, rate: Double)

        var rate: Double {
            switch self {
            case .resetMidBody(let rate), .slowBody(_, _, let rate), .slowBodyAfterHead(_, _, let rate): rate
            }
        }

        public var description: String {
            switch self {
            case .resetMidBody(let rate): "reset mid-body (rate \(rate))"
            case .slowBody(let bytes, let millis, let rate): "slow body (\(bytes) B / \(millis) ms, rate \(rate))"
            case .slowBodyAfterHead(let bytes, let millis, let rate):
                "slow body after the head (\(bytes) B / \(millis) ms, rate \(rate))"
            }
        }
    }

    /// What the threads share.
    private final class State: Sendable {
        let stopped = Atomic<Bool>(false)
        let liveThreads = Atomic<Int>(0)
        let faulted = Atomic<Int>(0)
        let exchanges = Atomic<Int>(0)
        /// The collector's fault generator: the same seed gives the same sequence of decisions.
        let random: Mutex<SplitMix64>

        init(seed: UInt64) { random = Mutex(SplitMix64(seed: seed)) }

        func roll(_ rate: Double) -> Bool {
            random.withLock { $0.nextUnitInterval() } < rate
        }
    }

    public let mode: Mode
    /// The port the proxy listens on.
    public let port: Int
    /// `http://127.0.0.1:PORT`, to give the client instead of the server's URL.
    public var url: String { "http://127.0.0.1:\(port)" }
    private let state: State

    /// Exchanges that got the fault (connections reset, responses slowed).
    public var faulted: Int { state.faulted.load(ordering: .acquiring) }
    /// Exchanges seen (requests that started through the proxy).
    public var exchanges: Int { state.exchanges.load(ordering: .acquiring) }

    /// Starts listening and forwarding to `127.0.0.1:upstreamPort`.
    public init(upstreamPort: Int, mode: Mode, seed: UInt64) throws {
        self.mode = mode
        let state = State(seed: seed)
        self.state = state
        let listener = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard listener >= 0 else { throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO) }
        var address = Self.loopback(port: 0)
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) { p in
            p.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(listener, $0, length) == 0 && listen(listener, 64) == 0 && getsockname(listener, $0, &length) == 0
            }
        }
        guard bound else {
            let code = errno
            close(listener)
            throw POSIXError(POSIXErrorCode(rawValue: code) ?? .EIO)
        }
        port = Int(UInt16(bigEndian: address.sin_port))
        state.liveThreads.add(1, ordering: .relaxed)
        Thread.detachNewThread {
            defer { close(listener); state.liveThreads.subtract(1, ordering: .releasing) }
            while !state.stopped.load(ordering: .acquiring) {
                var pfd = pollfd(fd: listener, events: Int16(POLLIN), revents: 0)
                guard poll(&pfd, 1, 50) > 0 else { continue }
                let client = accept(listener, nil, nil)
                guard client >= 0 else { continue }
                _ = fcntl(client, F_SETFD, FD_CLOEXEC)  // the agent processes we start must not inherit it
                var one: Int32 = 1  // dribbled bytes leave at once, not held by Nagle's algorithm
                setsockopt(client, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
                let server = Self.connectLoopback(port: upstreamPort)
                guard server >= 0 else { close(client); continue }
                state.liveThreads.add(1, ordering: .relaxed)
                Thread.detachNewThread {
                    defer { state.liveThreads.subtract(1, ordering: .releasing) }
                    Self.forward(client: client, server: server, mode: mode, state: state)
                }
            }
        }
    }

    /// Stops accepting, ends every connection and waits until every thread has closed its sockets.
    public func stop() async {
        state.stopped.store(true, ordering: .releasing)
        while state.liveThreads.load(ordering: .acquiring) > 0 { try? await Task.sleep(for: .milliseconds(5)) }
    }

    /// Runs a proxy for the duration of `body`, then stops it, even when `body` throws.
    public static func withRunning<T: Sendable>(
        upstreamPort: Int, mode: Mode, seed: UInt64, _ body: (FaultProxy) async throws -> T
    ) async throws -> T {
        let proxy = try FaultProxy(upstreamPort: upstreamPort, mode: mode, seed: seed)
        do {
            let result = try await body(proxy)
            await proxy.stop()
            return result
        } catch {
            await proxy.stop()
            throw error
        }
    }

    // MARK: One connection

    /// Copies bytes both ways until either side closes, injecting the mode's fault per exchange.
    private static func forward(client: Int32, server: Int32, mode: Mode, state: State) {
        var buffer = [UInt8](repeating: 0, count: 64 << 10)
        var serverSpoke = true  // the next client bytes start an exchange
        var faulty = false  // whether the current exchange gets the fault
        var request: [UInt8] = []  // the current faulty request so far (reset mode)
        var forwarded = 0  // how much of `request` went to the server
        var fds = [pollfd(fd: client, events: Int16(POLLIN), revents: 0), pollfd(fd: server, events: Int16(POLLIN), revents: 0)]
        loop: while !state.stopped.load(ordering: .acquiring) {
            guard poll(&fds, 2, 50) > 0 else { continue }
            for (index, from) in [(0, client), (1, server)] where fds[index].revents != 0 {
                let n = read(from, &buffer, buffer.count)
                guard n > 0 else { break loop }
                let chunk = buffer[0..<n]
                if from == client {
                    if serverSpoke {
                        serverSpoke = false
                        state.exchanges.add(1, ordering: .relaxed)
                        faulty = state.roll(mode.rate)
                        request = []
                        forwarded = 0
                    }
                    guard faulty, case .resetMidBody = mode else {
                        guard sendAll(server, chunk) else { break loop }
                        continue
                    }
                    request += chunk
                    guard let cut = cutPoint(request) else { continue }  // headers not complete yet
                    let end = min(cut, request.count)
                    guard sendAll(server, request[forwarded..<end]) else { break loop }
                    forwarded = end
                    if forwarded >= cut {
                        usleep(20_000)  // let the server read the truncated request before the reset
                        state.faulted.add(1, ordering: .relaxed)
                        reset(server)
                        reset(client)
                        return
                    }
                } else {
                    let dribble: (bytesPerTick: Int, tickMillis: Int, afterHead: Bool)?
                    switch mode {
                    case .slowBody(let bytes, let millis, _): dribble = (bytes, millis, false)
                    case .slowBodyAfterHead(let bytes, let millis, _): dribble = (bytes, millis, true)
                    case .resetMidBody: dribble = nil
                    }
                    if !serverSpoke, faulty, dribble != nil { state.faulted.add(1, ordering: .relaxed) }
                    let startsAnswer = !serverSpoke
                    serverSpoke = true
                    guard faulty, let (bytesPerTick, tickMillis, afterHead) = dribble else {
                        guard sendAll(client, chunk) else { break loop }
                        continue
                    }
                    var offset = chunk.startIndex
                    // The head at once (an answer's first chunk holds it: the collector's are small).
                    if afterHead, startsAnswer, let headEnd = Self.headerEnd(Array(chunk)) {
                        guard sendAll(client, chunk[offset..<(offset + headEnd)]) else { break loop }
                        offset += headEnd
                    }
                    while offset < chunk.endIndex {
                        if state.stopped.load(ordering: .acquiring) { break loop }
                        let next = min(offset + max(1, bytesPerTick), chunk.endIndex)
                        guard sendAll(client, chunk[offset..<next]) else { break loop }
                        offset = next
                        usleep(UInt32(tickMillis) * 1000)
                    }
                }
            }
        }
        close(client)
        close(server)
    }

    /// Where a message's headers end (just past the blank line), or nil while they are incomplete.
    static func headerEnd(_ message: [UInt8]) -> Int? {
        let separator: [UInt8] = Array("\r\n\r\n".utf8)
        guard message.count >= 4,
            let start = (0...(message.count - 4)).first(where: { message[$0..<($0 + 4)].elementsEqual(separator) })
        else { return nil }
        return start + 4
    }

    /// Where to cut a request: after its headers and half its body (at least one byte); nil until the
    /// headers are complete.
    static func cutPoint(_ request: [UInt8]) -> Int? {
        guard let headerEnd = headerEnd(request) else { return nil }
        let head = String(decoding: request[0..<headerEnd], as: UTF8.self).lowercased()
        let length = head.split(separator: "\r\n")
            .first { $0.hasPrefix("content-length:") }
            .flatMap { Int($0.dropFirst("content-length:".count).trimmingCharacters(in: .whitespaces)) } ?? 2
        return headerEnd + max(1, length / 2)
    }

    /// Writes everything (never raising SIGPIPE); false when the peer is gone.
    private static func sendAll(_ fd: Int32, _ bytes: ArraySlice<UInt8>) -> Bool {
        var offset = bytes.startIndex
        while offset < bytes.endIndex {
            let n = bytes[offset...].withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            if n < 0, errno == EINTR { continue }
            guard n > 0 else { return false }
            offset += n
        }
        return true
    }

    /// Closes `fd` with an RST instead of a FIN (`SO_LINGER` on, timeout 0).
    private static func reset(_ fd: Int32) {
        var option = linger(l_onoff: 1, l_linger: 0)
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &option, socklen_t(MemoryLayout<linger>.size))
        close(fd)
    }

    private static func loopback(port: UInt16) -> sockaddr_in {
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = port.bigEndian
        address.sin_addr = in_addr(s_addr: UInt32(0x7F00_0001).bigEndian)
        return address
    }

    /// A blocking connection to `127.0.0.1:port`; -1 on failure.
    private static func connectLoopback(port: Int) -> Int32 {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return -1 }
        var address = loopback(port: UInt16(port))
        let connected = withUnsafePointer(to: &address) { p in
            p.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0 }
        }
        guard connected else { close(fd); return -1 }
        return fd
    }
}
