import Foundation
import Testing
import Tributary
import TributaryTestSupport

@testable import TributaryAgentCore

/// The agent's side of ``LoopPacing`` (whose decisions `LoopPacingTests` covers): the loop's run as the
/// agent makes it, and its drain, on a real store and outbox.
@Suite("The agent giving way to producers")
struct AgentPacingTests {
    @Test("a run looks at the store before its first turn: a producer's commit after that ends the first drain after one chunk; a one-shot run, which does not pace, drains ten")
    func firstLook() async throws {
        try await withTemporaryGroup { group in
            try await UploadTests.produce(group, count: 1_500)
            let agent = try UploadTests.agent(group, serverURL: nil) { $0.drainChunk = 100 }
            var limits = LoopMachine<ContinuousClock>.Limits(agent.configuration)
            var paced = agent.newLoopRun(limits: limits)
            limits.once = true
            var once = agent.newLoopRun(limits: limits)
            // A producer commits after the runs were made, before their first drain.
            try await Tracker(configuration: .init(groupDirectory: group, producerKind: .app)).track("Beside")
            #expect(try agent.drainWhile({ true }, &paced) == 100, "the paced run saw the commit after its first chunk")
            #expect(try agent.drainWhile({ true }, &once) == 1_000, "a one-shot run drains its ten chunks")
            #expect(try agent.outbox.pending().count == 1_100)
        }
    }
}
