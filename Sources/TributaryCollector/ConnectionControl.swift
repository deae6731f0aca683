import NIOCore
import Synchronization

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// Ways to end an HTTP connection without answering, for the reset, lost-acknowledgement and hang faults.
enum ConnectionControl {
    /// Aborts the connection with a TCP RST (`SO_LINGER` 0, then close): the client sees
    /// "connection reset by peer" rather than a clean end of stream.
    static func reset(_ channel: any Channel) async {
        if let options = channel as? any SocketOptionProvider {
            try? await options.setSoLinger(linger(l_onoff: 1, l_linger: 0)).get()
        }
        try? await channel.close().get()
    }
}

/// Requests that the hang fault holds without an answer.
///
/// A hanging request is released when the client closes or half-closes its connection (it gave up), when
/// its task is cancelled, or when the collector starts shutting down (``releaseAll()``), so a hang never
/// blocks a graceful shutdown and never outlives its client.
final class HangingRequests: Sendable {
    private enum Slot {
        /// Registered, not yet suspended.
        case pending
        /// Suspended on this continuation.
        case waiting(CheckedContinuation<Void, Never>)
        /// Released before it suspended: it must not suspend at all.
        case released
    }

    private struct State {
        var nextID = 0
        var slots: [Int: Slot] = [:]
        var shuttingDown = false
    }

    private let state = Mutex(State())

    /// Suspends until the connection closes, the task is cancelled or the collector shuts down.
    func hang(on channel: any Channel) async {
        let id = state.withLock { state in
            state.nextID += 1
            state.slots[state.nextID] = .pending
            return state.nextID
        }
        defer { state.withLock { _ = $0.slots.removeValue(forKey: id) } }
        // Hummingbird allows remote half-closure, so a client that gives up and closes its end shows up
        // as an `inputClosed` event rather than as the channel closing: watch for both.
        channel.pipeline.addHandler(ClientGoneObserver { self.release(id) }, position: .first)
            .whenFailure { _ in self.release(id) }
        channel.closeFuture.whenComplete { _ in self.release(id) }
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let resumeNow = state.withLock { state in
                    guard !state.shuttingDown, case .pending = state.slots[id] else { return true }
                    state.slots[id] = .waiting(continuation)
                    return false
                }
                if resumeNow { continuation.resume() }
            }
        } onCancel: {
            self.release(id)
        }
    }

    /// Releases every hanging request, and makes later hangs return at once.
    func releaseAll() {
        let waiters = state.withLock { state in
            state.shuttingDown = true
            var waiters: [CheckedContinuation<Void, Never>] = []
            for (id, slot) in state.slots {
                if case .waiting(let waiter) = slot {
                    waiters.append(waiter)
                    state.slots[id] = .released
                }
            }
            return waiters
        }
        for waiter in waiters { waiter.resume() }
    }

    private func release(_ id: Int) {
        let waiter: CheckedContinuation<Void, Never>? = state.withLock { state in
            switch state.slots[id] {
            case .pending:
                state.slots[id] = .released
                return nil
            case .waiting(let waiter):
                state.slots[id] = .released
                return waiter
            case .released, nil:
                return nil
            }
        }
        waiter?.resume()
    }
}

/// Calls `onGone` when the client closes its side of the connection, or the connection ends.
private final class ClientGoneObserver: ChannelInboundHandler, Sendable {
    typealias InboundIn = NIOAny

    private let onGone: @Sendable () -> Void

    init(onGone: @escaping @Sendable () -> Void) {
        self.onGone = onGone
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if let event = event as? ChannelEvent, event == .inputClosed { onGone() }
        context.fireUserInboundEventTriggered(event)
    }

    func channelInactive(context: ChannelHandlerContext) {
        onGone()
        context.fireChannelInactive()
    }
}
