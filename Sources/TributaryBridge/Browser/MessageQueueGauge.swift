import Synchronization

/// A value behind a lock, for the few settings written once and read from the event loop.
final class SendableBox<Value: Sendable>: Sendable {
    private let value: Mutex<Value>
    init(_ value: Value) { self.value = Mutex(value) }
    func get() -> Value { value.withLock { $0 } }
    func set(_ new: Value) { value.withLock { $0 = new } }
    func update<Result>(_ body: (inout Value) -> Result) -> Result { value.withLock { body(&$0) } }
}

/// The page messages waiting between the DevTools reader and ``WebViewHost/run(bridge:)``: their bytes,
/// bounded, and how many were dropped for want of room since the host last counted them.
final class MessageQueueGauge: Sendable {
    private let limit: Int
    private let state = Mutex((bytes: 0, dropped: 0, foreign: [String: Int]()))

    init(limit: Int) { self.limit = limit }

    /// Takes `bytes` into the queue if they fit, or if the queue is empty; otherwise counts the
    /// message dropped. An empty queue takes any message: one larger than the bound but within the
    /// frame limit (up to 6 × `maxMessageBytes`) is then refused by the bridge for what it is
    /// (`message_too_large`), not dropped as `overloaded` by a queue with nothing in it.
    func admit(_ bytes: Int) -> Bool {
        state.withLock { state in
            guard state.bytes == 0 || state.bytes + bytes <= limit else {
                state.dropped += 1
                return false
            }
            state.bytes += bytes
            return true
        }
    }

    /// Takes `bytes` into the queue if they fit (or the queue is empty), without counting a refusal: for
    /// the browser's events the host may go without (a frame's end of loading), which no page sent.
    func admitUncounted(_ bytes: Int) -> Bool {
        state.withLock { state in
            guard state.bytes == 0 || state.bytes + bytes <= limit else { return false }
            state.bytes += bytes
            return true
        }
    }

    /// A message of `bytes` was handled.
    func release(_ bytes: Int) { state.withLock { $0.bytes -= bytes } }

    /// The messages dropped since the last call.
    func takeDropped() -> Int {
        state.withLock { state in
            defer { state.dropped = 0 }
            return state.dropped
        }
    }

    /// Counts a page message of `origin` (not trusted) refused unread; true for the first since the last
    /// ``takeForeign()``. At most ``HybridBridge/maxCountedOrigins`` origins are told apart, the rest
    /// counted under ``HybridBridge/otherOrigins``.
    func countForeign(_ origin: String) -> Bool {
        state.withLock { state in
            let first = state.foreign.isEmpty
            let named = state.foreign[origin] != nil || state.foreign.count < HybridBridge.maxCountedOrigins
            state.foreign[named ? origin : HybridBridge.otherOrigins, default: 0] += 1
            return first
        }
    }

    /// The page messages refused unread since the last call, by origin.
    func takeForeign() -> [String: Int] {
        state.withLock { state in
            defer { state.foreign = [:] }
            return state.foreign
        }
    }
}
