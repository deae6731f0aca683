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
    public convenience init(_ executable: String, _ arguments: [String], environment: [String: String] = [:]) throws {
        try self.init(path: productsDirectory.appendingPathComponent(executable).path, arguments, environment: environment)
    }

    /// Starts the program at `path` (a system tool such as `/usr/bin/strace`) with `arguments`.
    public init(path: String, _ arguments: [String], environment: [String: String] = [:]) throws {
        process.executableURL = URL(fileURLWithPath: path)
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

    /// Reads stdout until a line starting with `prefix` appears (or EOF); returns it. Blocking reads run
    /// on a thread of their own, never on a Swift concurrency thread.
    public func waitForLine(startingWith prefix: String) async -> String? {
        let handle = stdoutPipe.fileHandleForReading
        return await offPool {
            var buffer = Data()
            while true {
                let chunk = handle.availableData
                if chunk.isEmpty { return nil }
                buffer.append(chunk)
                let text = String(decoding: buffer, as: UTF8.self)
                if let line = text.split(separator: "\n").first(where: { $0.hasPrefix(prefix) }) { return String(line) }
            }
        }
    }

    /// Sends `signal` to the process.
    public func send(_ signal: Int32) { kill(process.processIdentifier, signal) }

    /// Waits for exit and returns (status, stdout, stderr).
    ///
    /// The waiting happens on a dedicated thread: blocking a Swift concurrency thread here could starve
    /// an in-process server (the reference collector) that the child is talking to, on a 2-core machine.
    @discardableResult
    public func finish() async -> (status: Int32, stdout: String, stderr: String) {
        let process = self.process
        let out = stdoutPipe.fileHandleForReading
        let err = stderrPipe.fileHandleForReading
        return await offPool {
            let errData = Mutex(Data())
            let errReader = Thread { errData.withLock { $0 = err.readDataToEndOfFile() } }
            errReader.start()
            let outData = out.readDataToEndOfFile()
            process.waitUntilExit()
            while !errReader.isFinished { usleep(1000) }
            return (process.terminationStatus, String(decoding: outData, as: UTF8.self),
                    String(decoding: errData.withLock { $0 }, as: UTF8.self))
        }
    }

    /// Runs an executable to completion.
    public static func run(_ executable: String, _ arguments: [String], environment: [String: String] = [:]) async throws
        -> (status: Int32, stdout: String, stderr: String)
    {
        try await ChildProcess(executable, arguments, environment: environment).finish()
    }
}

/// Runs blocking work on a fresh thread and resumes the caller when it is done.
func offPool<T: Sendable>(_ work: @escaping @Sendable () -> T) async -> T {
    await withCheckedContinuation { continuation in
        Thread.detachNewThread { continuation.resume(returning: work()) }
    }
}

import Synchronization
