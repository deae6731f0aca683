import ArgumentParser
import Foundation

@main
struct Simulator: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "tributary-sim",
        abstract: "Simulated producer processes that write events into an app group's shared store.",
        discussion: """
            Each subcommand is one producer process. With --ledger, every event acknowledged as durable \
            is appended to a file (producer_seq, seq, event_id per line), so tests can check that \
            nothing acknowledged was lost even when the process is killed.
            """,
        subcommands: [App.self, Extension.self, Hybrid.self, Load.self, Demo.self]
    )
}

/// A failure at run time (not a bad option): `message` goes to stderr, and the exit code is 1, so that
/// ArgumentParser does not print the usage text and exit 64 as it does for a `ValidationError`.
func runFailure(_ message: String) -> ExitCode {
    FileHandle.standardError.write(Data("tributary-sim: \(message)\n".utf8))
    return ExitCode(1)
}
