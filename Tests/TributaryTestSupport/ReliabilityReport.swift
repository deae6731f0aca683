import Foundation
import Synchronization
import Testing
@_exported import TributaryOracle

/// The knobs and the output of the reliability scenarios: seeds, the soak multiplier and the table.
public enum Reliability {
    /// `TRIBUTARY_SOAK` (default 1): `make soak` multiplies every scenario's iterations by it.
    public static var soak: Int {
        ProcessInfo.processInfo.environment["TRIBUTARY_SOAK"].flatMap(Int.init).map { max(1, $0) } ?? 1
    }

    /// The seed of a randomized scenario: `TRIBUTARY_SEED` when set (a replay), else a fresh one.
    public static func seed() -> UInt64 {
        ProcessInfo.processInfo.environment["TRIBUTARY_SEED"].flatMap(UInt64.init) ?? UInt64.random(in: 1...999_999)
    }

    /// The command that replays `test` (a `swift test --filter` pattern) with `seed`.
    public static func replay(_ test: String, seed: UInt64) -> String {
        "TRIBUTARY_SEED=\(seed) swift test --filter '\(test)'"
    }

    /// The table file: `TRIBUTARY_RELIABILITY_REPORT`, else `.build/reliability/table.tsv`.
    public static var reportPath: String {
        if let path = ProcessInfo.processInfo.environment["TRIBUTARY_RELIABILITY_REPORT"], !path.isEmpty { return path }
        var dir = productsDirectory
        while dir.lastPathComponent != ".build", dir.path != "/" { dir.deleteLastPathComponent() }
        if dir.path == "/" { dir = productsDirectory }
        return dir.appendingPathComponent("reliability/table.tsv").path
    }

    private static let writeLock = Mutex(())

    /// Appends one row to the table: the verdict's figures, and "pass", "FAIL (seed …: replay …)" or
    /// the reason the scenario could not run ("skipped: …").
    public static func record(
        _ scenario: String, iterations: Int, verdict: Oracle.Verdict?, seed: UInt64? = nil, test: String? = nil,
        skipped: String? = nil
    ) {
        var result: String
        if let skipped {
            result = "skipped: " + skipped
            // Where every scenario must run (CI), a skip fails the test itself too, not only the table.
            if ProcessInfo.processInfo.environment["TRIBUTARY_NO_SKIPS"] == "1" {
                Issue.record("\(scenario) was skipped, and TRIBUTARY_NO_SKIPS=1: \(skipped)")
            }
        } else if let verdict, verdict.passed {
            result = "pass"
        } else {
            result = "FAIL"
            if let verdict, !verdict.healthProblems.isEmpty { result += " (" + verdict.healthProblems.joined(separator: "; ") + ")" }
            if let seed, let test { result += " — replay: " + replay(test, seed: seed) }
        }
        if let seed, result == "pass" { result += " (seed \(seed))" }
        let line = ReliabilityRow.line(scenario, iterations: iterations, verdict: verdict ?? Oracle.Verdict(), result: result)
        writeLock.withLock { _ in
            let path = reportPath
            try? FileManager.default.createDirectory(
                atPath: (path as NSString).deletingLastPathComponent, withIntermediateDirectories: true)
            if !FileManager.default.fileExists(atPath: path) {
                _ = FileManager.default.createFile(atPath: path, contents: Data(ReliabilityRow.header.utf8))
            }
            if let handle = FileHandle(forWritingAtPath: path) {
                handle.seekToEndOfFile()
                handle.write(Data(line.utf8))
                try? handle.close()
            }
        }
    }
}
