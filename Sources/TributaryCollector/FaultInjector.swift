import Synchronization

/// The random fault decisions for one ingest request.
struct FaultDecision: Sendable, Equatable {
    var hang = false
    var reset = false
    var fail = false
    var loseAck = false
}

/// Holds the fault configuration in force and the seeded generator its decisions come from.
///
/// Every request that reaches the fault step draws exactly four numbers, in a fixed order (hang, reset,
/// failure, lost acknowledgement), whatever the rates: so a given seed yields the same decisions for the
/// same sequence of requests, and changing one rate does not shift the others' decisions.
final class FaultInjector: Sendable {
    private struct State {
        var configuration: FaultConfiguration
        var generator: SplitMix64
    }

    private let state: Mutex<State>

    init(_ configuration: FaultConfiguration) {
        state = Mutex(State(configuration: configuration, generator: SplitMix64(seed: configuration.seed)))
    }

    /// The fault configuration in force.
    var configuration: FaultConfiguration {
        state.withLock { $0.configuration }
    }

    /// Replaces the configuration and restarts the generator from its seed.
    func replace(with configuration: FaultConfiguration) {
        state.withLock { $0 = State(configuration: configuration, generator: SplitMix64(seed: configuration.seed)) }
    }

    /// Draws the decisions for the next request, with the configuration they were drawn under.
    func nextDecision() -> (FaultConfiguration, FaultDecision) {
        state.withLock { state in
            let faults = state.configuration
            var decision = FaultDecision()
            decision.hang = state.generator.nextUnitInterval() < faults.hangRate
            decision.reset = state.generator.nextUnitInterval() < faults.resetRate
            decision.fail = state.generator.nextUnitInterval() < faults.failureRate
            decision.loseAck = state.generator.nextUnitInterval() < faults.lostAckRate
            return (faults, decision)
        }
    }
}

/// SplitMix64 (Steele, Lea, Flood 2014): a tiny, fast, well-distributed seeded generator.
package struct SplitMix64: RandomNumberGenerator, Sendable {
    private var state: UInt64

    package init(seed: UInt64) { state = seed }

    package mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }

    /// A uniform value in `0..<1` (53 random bits), so that a rate of 1 always fires and 0 never does.
    package mutating func nextUnitInterval() -> Double {
        Double(next() >> 11) * 0x1p-53
    }
}
