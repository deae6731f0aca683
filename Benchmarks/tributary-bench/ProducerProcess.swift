import Foundation

/// One producer child process and the driver's side of its protocol: it prints `READY <pid>` once
/// its store is open, starts on a `GO` line on stdin, and ends with one JSON report line.
///
/// Foundation's `Process` starts children with `posix_spawn`, never `fork` (lmdb.h: "Use an MDB_env*
/// in the process which opened it, without fork()ing").
final class ProducerProcess {
    let name: String
    /// The child's process id.
    var pid: Int32 { process.processIdentifier }
    private let process = Process()
    private let input = Pipe()
    private let output = Pipe()
    private var buffered = Data()

    /// Starts `executable` with `arguments`; its stderr goes to ours.
    init(name: String, executable: String, arguments: [String]) throws {
        self.name = name
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = arguments
        process.standardInput = input
        process.standardOutput = output
        process.standardError = FileHandle.standardError
        try process.run()
    }

    deinit {
        // Only reached with a live child when the driver is failing: do not leave it waiting for GO.
        if process.isRunning {
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
        }
    }

    /// Waits until the child printed `READY`.
    func waitUntilReady() throws {
        _ = try waitForLine(prefix: "READY")
    }

    /// Waits for the first line starting with `prefix` (earlier lines are skipped) and returns it.
    func waitForLine(prefix: String) throws -> String {
        while true {
            if let newline = buffered.firstIndex(of: UInt8(ascii: "\n")) {
                let line = String(decoding: buffered[..<newline], as: UTF8.self)
                buffered.removeSubrange(...newline)
                if line.hasPrefix(prefix) { return line }
                continue
            }
            let chunk = output.fileHandleForReading.availableData
            if chunk.isEmpty { throw BenchFailure("\(name) exited before it printed \(prefix) (see its error above).") }
            buffered.append(chunk)
        }
    }

    /// SIGKILL, then waits for the child to be gone.
    func killNow() {
        kill(process.processIdentifier, SIGKILL)
        process.waitUntilExit()
    }

    /// Sends the start signal.
    func start() throws {
        try input.fileHandleForWriting.write(contentsOf: Data("GO\n".utf8))
        try input.fileHandleForWriting.close()
    }

    /// Reads the child's report, waits for it to exit, and checks that it succeeded.
    func finish() throws -> WorkerReport {
        if let rest = try output.fileHandleForReading.readToEnd() { buffered.append(rest) }
        process.waitUntilExit()
        guard process.terminationReason == .exit, process.terminationStatus == 0 else {
            let how = process.terminationReason == .exit ? "exit status" : "signal"
            throw BenchFailure("\(name) failed (\(how) \(process.terminationStatus)); see its error above.")
        }
        guard let line = buffered.split(separator: UInt8(ascii: "\n")).last else {
            throw BenchFailure("\(name) exited without a report.")
        }
        do {
            return try JSONDecoder().decode(WorkerReport.self, from: Data(line))
        } catch {
            throw BenchFailure("\(name) printed a report that is not valid JSON: \(error)")
        }
    }
}

/// A benchmark run that cannot be trusted (a process failed, or the store does not hold what it should).
struct BenchFailure: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}
