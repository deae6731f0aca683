import Foundation

/// The folder holding this package's built executables (next to the test bundle).
public let productsDirectory: URL = {
    let testBinary = URL(fileURLWithPath: CommandLine.arguments[0]).resolvingSymlinksInPath()
    var dir = testBinary.deletingLastPathComponent()
    // On Linux the test binary is `<products>/<Package>PackageTests.xctest`; on macOS it is inside a bundle.
    while !FileManager.default.fileExists(atPath: dir.appendingPathComponent("tributary").path),
        dir.path != "/"
    {
        dir.deleteLastPathComponent()
    }
    return dir
}()

/// A real child process running one of this package's executables, killed when the handle goes away.
public final class ChildProcess: @unchecked Sendable {
    public let process = Process()
    private let stdoutPipe = Pipe()
    private let stderrPipe = Pipe()

    /// Starts `executable` (a product name such as `tributary-sim`) with `arguments`.
    public init(_ executable: String, _ arguments: [String], environment: [String: String] = [:]) throws {
        process.executableURL = productsDirectory.appendingPathComponent(executable)
        process.arguments = arguments
        var env = ProcessInfo.processInfo.environment
        env.merge(environment) { _, new in new }
        process.environment = env
        process.standardOutput = stdoutPipe
        process.standardError = stderrPipe
        try process.run()
    }

    deinit {
        if process.isRunning {
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
        }
    }

    public var pid: Int32 { process.processIdentifier }

    /// Reads stdout until a line starting with `prefix` appears (or EOF); returns it.
    public func waitForLine(startingWith prefix: String) -> String? {
        var buffer = Data()
        let handle = stdoutPipe.fileHandleForReading
        while true {
            let chunk = handle.availableData
            if chunk.isEmpty { return nil }
            buffer.append(chunk)
            let text = String(decoding: buffer, as: UTF8.self)
            if let line = text.split(separator: "\n").first(where: { $0.hasPrefix(prefix) }) { return String(line) }
        }
    }

    /// Sends `signal` to the process.
    public func send(_ signal: Int32) { kill(process.processIdentifier, signal) }

    /// Waits for exit and returns (status, stdout, stderr).
    @discardableResult
    public func finish() -> (status: Int32, stdout: String, stderr: String) {
        let out = stdoutPipe.fileHandleForReading.readDataToEndOfFile()
        let err = stderrPipe.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return (process.terminationStatus, String(decoding: out, as: UTF8.self), String(decoding: err, as: UTF8.self))
    }

    /// Runs an executable to completion.
    public static func run(_ executable: String, _ arguments: [String]) throws -> (status: Int32, stdout: String, stderr: String) {
        try ChildProcess(executable, arguments).finish()
    }
}
