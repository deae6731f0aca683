import ArgumentParser
import Foundation
import Tributary
import TributaryStore
import TributaryErrors
import TributaryExitStatus

struct Simulator: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "tributary-sim",
        abstract: "Simulated producer processes that write events into an app group's shared store.",
        discussion: """
            Each subcommand is one producer process. With --ledger, every event acknowledged as durable \
            is appended to a file (producer_seq, seq, event_id per line), so tests can check that \
            nothing acknowledged was lost even when the process is killed. Exit codes: 0 done; 1 a run-time \
            failure (demo; hybrid: its page servers could not start); 64 bad usage, or a group path that is not a \
            directory; 65 an invalid event; 66 no group directory where one must be; 69 hybrid: the browser could not start or does not answer; 74 an I/O \
            error; 75 the store is at its quota or was deleted or created anew while open (retry), or the hybrid \
            pages did not finish in time; 77 a group directory this user may not use, or that every user may write.
            """,
        subcommands: [App.self, Extension.self, Hybrid.self, Load.self, Demo.self, Judge.self]
    )
}

/// Ends a producer run that `error` stopped, after saying why on stderr: exit 65 for an invalid event, and
/// for a store error the `tributary` CLI's status (the one table, `ExitStatus.of(_:as:)`: 75 when the store is at its
/// quota or was deleted or created anew while open, 77 for a group directory this user may not use or
/// every user may write, …); 74 for any other error (I/O).
func producerFailure(_ error: any Error) -> ExitCode {
    FileHandle.standardError.write(Data("tributary-sim: \(error)\n".utf8))
    return ExitCode(ExitStatus.of(error, as: .command).rawValue)
}

/// A failure at run time (not a bad option): `message` goes to stderr, and the exit code is 1 (or
/// `exitCode`), so that ArgumentParser does not print the usage text and exit 64 as it does for a
/// `ValidationError`.
func runFailure(_ message: String, exitCode: Int32 = 1) -> ExitCode {
    FileHandle.standardError.write(Data("tributary-sim: \(message)\n".utf8))
    return ExitCode(exitCode)
}

/// The entry point: descriptors 0–2 taken first (``StandardDescriptors``), then the command.
@main
enum SimulatorMain {
    static func main() async {
        StandardDescriptors.takeClosed()
        await Simulator.main(CommandLineArguments.helpFirst(Array(CommandLine.arguments.dropFirst())))
    }
}
