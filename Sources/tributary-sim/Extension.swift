import ArgumentParser

/// A short-lived app extension process.
struct Extension: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "A short-lived app extension: tracks a few events and exits.")
    @OptionGroup var options: ProducerOptions

    func run() async throws {
        try await produceLoad(options, kind: .extension, event: "SimEvent", concurrency: 0, pause: options.pauseNanos)
    }
}
