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
    /// Stdout read by ``waitForLine(startingWith:)`` past the line it returned: the next wait starts
    /// there, and ``finish()`` returns it ahead of the rest.
    private let unread = Mutex(Data())
    private let skipped = Mutex<[String]>([])
    /// The stdout lines ``waitForLine(startingWith:)`` read and passed over.
    public var linesSkipped: [String] { skipped.withLock { $0 } }
    private let exitInstant = Mutex<ContinuousClock.Instant?>(nil)
    /// When the process exited, as seen by ``finish()``'s own thread: once `finish()` has returned, time
    /// a stop or a deadline up to here, not up to `finish()`'s return. That return waits for a Swift
    /// concurrency thread, and on 2 cores the rest of the suite can hold both for seconds (a deadline
    /// test once measured 5.3 s for an agent that had exited within its 3 s).
    public var exitedAt: ContinuousClock.Instant? { exitInstant.withLock { $0 } }

    /// Seconds from `start` to ``exitedAt``; call it once ``finish()`` has returned.
    public func secondsToExit(from start: ContinuousClock.Instant) -> Double {
        let exit = exitedAt ?? .now
        let span = exit - start
        return Double(span.components.seconds) + Double(span.components.attoseconds) / 1e18
    }

    /// Starts `executable` (a product name such as `tributary-sim`) with `arguments`, in `directory`
    /// (default: the test's own working directory).
    public convenience init(
        _ executable: String, _ arguments: [String], environment: [String: String] = [:], directory: String? = nil
    ) throws {
        try self.init(
            path: productsDirectory.appendingPathComponent(executable).path, arguments, environment: environment,
            directory: directory)
    }

    /// Starts the program at `path` (a system tool such as `/usr/bin/strace`) with `arguments`.
    public init(path: String, _ arguments: [String], environment: [String: String] = [:], directory: String? = nil) throws {
        process.executableURL = URL(fileURLWithPath: path)
        process.arguments = arguments
        if let directory { process.currentDirectoryURL = URL(fileURLWithPath: directory, isDirectory: true) }
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
    /// Only whole lines count (a line still being written could be cut short); the lines before the
    /// one returned are passed over (``linesSkipped``).
    public func waitForLine(startingWith prefix: String) async -> String? {
        let handle = stdoutPipe.fileHandleForReading
        return await offPool {
            var buffer = self.unread.withLock { data in
                defer { data = Data() }
                return data
            }
            while true {
                while let newline = buffer.firstIndex(of: UInt8(ascii: "\n")) {
                    let line = String(decoding: buffer[buffer.startIndex..<newline], as: UTF8.self)
                    buffer = Data(buffer[(newline + 1)...])
                    if line.hasPrefix(prefix) {
                        self.unread.withLock { $0 = buffer }
                        return line
                    }
                    self.skipped.withLock { $0.append(line) }
                }
                let chunk = handle.availableData
                if chunk.isEmpty { return nil }
                buffer.append(chunk)
            }
        }
    }

    /// Sends `signal` to the process.
    public func send(_ signal: Int32) { kill(process.processIdentifier, signal) }

    /// SIGKILLs the process after `limit` unless the returned task is cancelled first: a process that
    /// should have ended and did not is then ended, and its status (9) tells, instead of the test
    /// waiting for ever. Cancel it when done (`defer { limit.cancel() }`).
    public func killAfter(_ limit: Duration) -> Task<Void, any Error> {
        Task {
            try await Task.sleep(for: limit)
            // Not a pid the system may have given another process since this one was reaped.
            if self.process.isRunning { self.send(SIGKILL) }
        }
    }

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
            let outData = self.unread.withLock { $0 } + out.readDataToEndOfFile()
            // Waits for the exit without reaping (Foundation reaps); if Foundation has reaped it already,
            // it exited before its stdout's end was read, just now.
            var info = siginfo_t()
            _ = waitid(P_PID, id_t(process.processIdentifier), &info, WEXITED | WNOWAIT)
            self.exitInstant.withLock { $0 = .now }
            process.waitUntilExit()
            while !errReader.isFinished { usleep(1000) }
            return (process.terminationStatus, String(decoding: outData, as: UTF8.self),
                    String(decoding: errData.withLock { $0 }, as: UTF8.self))
        }
    }

    /// Runs an executable to completion.
    public static func run(
        _ executable: String, _ arguments: [String], environment: [String: String] = [:], directory: String? = nil
    ) async throws -> (status: Int32, stdout: String, stderr: String) {
        try await ChildProcess(executable, arguments, environment: environment, directory: directory).finish()
    }
}

/// Runs blocking work on a fresh thread and resumes the caller when it is done.
func offPool<T: Sendable>(_ work: @escaping @Sendable () -> T) async -> T {
    await withCheckedContinuation { continuation in
        Thread.detachNewThread { continuation.resume(returning: work()) }
    }
}

import Synchronization
