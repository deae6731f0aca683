import ArgumentParser

/// The main app process.
struct App: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "The main app: tracks events as the user works.")
    @OptionGroup var options: ProducerOptions

    func run() async throws {
        try await produceLoad(options, kind: .app, event: "SimEvent", concurrency: 0, pause: options.pauseNanos)
    }
}
