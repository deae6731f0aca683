/// How many events a batch may hold after the collector's 413s, as a state machine with no I/O.
///
/// A 413 halves the size (to half the refused batch) and remembers the halved size as a ceiling;
/// each delivered batch doubles the size again, up to the configured batch size and no further than
/// the ceiling, so that a collector whose limit lies between the two sizes does not answer every
/// other batch with 413. The ceiling is forgotten after ``ceilingDeliveries`` batches delivered, so
/// that a raised limit is found again, and when the event the 413s halved down to was refused alone
/// (dead-lettered: the 413s were its own, and the size may grow again).
struct BatchSizePolicy: Equatable {
    /// How many deliveries a ceiling lasts.
    static let ceilingDeliveries = 100

    /// The configured batch size: the most a batch ever holds.
    let configured: Int
    /// The batch size now.
    private(set) var limit: Int
    /// The size a 413 halved to, while it holds.
    private(set) var ceiling: Int?
    /// Batches delivered since the last 413.
    private var deliveriesUnderCeiling = 0

    init(configured: Int) {
        self.configured = configured
        limit = configured
    }

    /// A batch was delivered: the size grows back.
    mutating func delivered() {
        if ceiling != nil {
            deliveriesUnderCeiling += 1
            if deliveriesUnderCeiling >= Self.ceilingDeliveries { ceiling = nil }
        }
        limit = min(configured, limit.doubledSaturating, ceiling ?? .max)
    }

    /// The collector refused a batch of `count` events as too large (413): half of it is the new size
    /// and its ceiling.
    mutating func tooLarge(count: Int) {
        limit = max(1, count / 2)
        ceiling = limit
        deliveriesUnderCeiling = 0
    }

    /// A single event was refused as too large even alone: the 413s were its own.
    mutating func forgetCeiling() { ceiling = nil }

    /// Another destination: what the old one's 413s taught says nothing about it.
    mutating func reset() {
        limit = configured
        ceiling = nil
        deliveriesUnderCeiling = 0
    }
}
