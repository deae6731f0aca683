/// When the agent's loop rests, so that producers' commits do not wait behind its work: a decision
/// with no I/O and no clock of its own, which the driver (``Agent/loopBody(session:loop:)``) consults
/// at the start of a turn and feeds at its end.
///
/// A producer's `track()` is an LMDB commit: the store's writer lock and an fsync. The agent's turns
/// write too: the drain's outbox commits and store deletes (under that same lock), the outbox's
/// checkpoints, the uploads' acknowledgements, on the same disk. Beside a
/// producer committing every millisecond, an agent draining a 1,000,000-event backlog at full speed
/// took that producer's p99 from about 1 ms to 4–5 ms, and so did the bare C drain
/// (`lmdb-baseline drain`), whatever the chunk size and the agent's CPU or I/O priority
/// (docs/performance-history.md, "Twenty-sixth round"). What moved it was the share of the time the
/// agent spent working.
///
/// So while producers are committing, a drain takes one chunk, not ten, and after a turn whose drains
/// or checkpoint took `busy` the loop rests `(1 / share − 1) × busy`, neither draining nor uploading:
/// the agent's disk work then takes about `share` of the time, and a producer's commit seldom meets
/// it. The rest follows that local work, not the turn's length: a request's wait for a distant
/// collector costs the producers nothing, and a rest that grew with it would slow the uploads to a
/// crawl. Producers are committing when the store's newest seq has moved since the loop last looked,
/// or was seen to move within the last second (a turn shorter than the time between two commits
/// sees none; the agent's own deletes take the oldest events, never the newest). With no producer
/// committing there is no rest. A stop does not rest, nor a one-shot run (`--once`, a timer's
/// background fetch, which has a budget to use).
///
/// Not when the producers append so fast that the agent at that pace would fall behind them (more
/// than half a chunk, at their rate, in a turn's work and its rest): then the store's room matters
/// more than their latency (producers get `storeFull` once it is full), and the loop goes at full
/// speed. A chunk, not what the turn drained: a drain kept short by the drain-ahead bound (the uploads
/// set the pace) or by catching up with the store could have moved a whole chunk.
struct LoopPacing: Sendable {
    typealias Instant = ContinuousClock.Instant

    /// The share of the time the agent may work while producers commit, in (0, 1]; 1: it never rests.
    let share: Double
    /// The most events one drain chunk moves.
    let chunk: Int
    /// The store's newest seq when the loop last looked (the last one seen: an empty store's is kept).
    private(set) var seenNewest: UInt64?
    /// When the loop last looked at the store's newest seq.
    private(set) var lookedAt: Instant?
    /// No drain nor upload before this: the rest after a turn's work beside committing producers.
    private(set) var restUntil: Instant?
    /// When the loop last saw the store's newest seq move.
    private(set) var appendSeenAt: Instant?

    /// How long producers count as committing after the newest seq was last seen to move.
    static let recently: Duration = .seconds(1)

    /// A chunk must hold at least this many times what the producers append in a turn's work and its
    /// rest, or the loop does not rest.
    static let headroom = 2.0

    init(share: Double, chunk: Int) {
        self.share = share
        self.chunk = chunk
    }

    /// Whether the loop paces itself at all (`share` under 1): when not, the driver need not look at
    /// the store.
    var paces: Bool { share < 1 }

    /// Whether a turn may drain and upload at `now`: not during a rest.
    func mayWork(at now: Instant) -> Bool {
        restUntil.map { now >= $0 } ?? true
    }

    /// Whether producers are committing at `now`, the store's newest seq being `newest`: it moved since
    /// the loop last looked, or was seen to move within ``recently``. A drain then ends after its first
    /// chunk. Never while pacing is off (`share` 1), nor before a first look.
    func producersCommitting(newest: UInt64?, at now: Instant) -> Bool {
        guard paces, lookedAt != nil else { return false }
        if let newest, newest != seenNewest { return true }
        return appendSeenAt.map { $0.duration(to: now) < Self.recently } ?? false
    }

    /// A turn whose drains and checkpoint took `took` ended at `now`, the store's newest seq then
    /// `newest`: the loop rests if producers are committing, and at their rate append less than a
    /// chunk's ``headroom``-th part during that work and its rest; a rest already longer stays. A turn
    /// that did no such work (`took` nil) only looks. Records the look.
    mutating func turnEnded(worked took: Duration?, newest: UInt64?, at now: Instant) {
        let committing = producersCommitting(newest: newest, at: now)
        defer {
            if let newest {
                if lookedAt != nil && newest != seenNewest { appendSeenAt = now }
                seenNewest = newest
            }
            lookedAt = now
        }
        guard let took, took > .zero, committing, let lookedAt, let newest else { return }
        // In whole microseconds: a Duration times a Double carries the Double's rounding into attoseconds.
        let rest = Duration.microseconds(Int64((took.seconds * (1 - share) / share * 1e6).rounded()))
        // A store made anew numbers from 1 again: producers committed, at a rate not known.
        let appended = newest > (seenNewest ?? 0) ? Double(newest - (seenNewest ?? 0)) : 0
        let producerRate = appended / max(lookedAt.duration(to: now).seconds, 1e-9)
        guard producerRate * (took + rest).seconds * Self.headroom <= Double(chunk) else { return }
        restUntil = max(restUntil ?? now, now.advanced(by: rest))
    }
}
