import Foundation

/// The table of medians printed at the end of a benchmark.
struct Report {
    let text: String

    init(run: Run, configurations: [Configuration], samples: [Configuration: [Sample]], workDirectory: String) {
        let fileSystem = (try? FileSystemInfo(path: workDirectory))?.name ?? "?"
        let recordSizes = samples.values.flatMap { $0.map(\.swift.meanRecordSize) }
        var lines = [
            "Tributary producer benchmark, \(ISO8601DateFormatter().string(from: Date())), "
                + "\(ProcessInfo.processInfo.activeProcessorCount) CPUs, stores in \(workDirectory) (\(fileSystem))",
            "medians of \(run.reps) reps; single: \(Self.grouped(Double(run.singleEvents))) events/process, "
                + "group: \(Self.grouped(Double(run.groupEvents))) events/process, "
                + "Swift with \(run.callers) concurrent callers/process (group: \(run.window) enqueued events "
                + "in flight each; awaited: each awaits every track); "
                + "records \(Int(Statistics.median(recordSizes).rounded())) B",
            "ev/s: all processes' events, all durable / (last process done - common start). Swift µs: per "
                + "event, from track or enqueue to its durable receipt. C µs: per transaction (begin to commit return).",
            "",
        ]
        let header = [
            "config", "ev/txn S/C", "Swift ev/s", "C ev/s", "Swift/C", "Swift p50/p99/max µs", "C p50/p99/max µs", "overlap S/C",
        ]
        var rows = [header]
        for configuration in configurations {
            let runs = samples[configuration] ?? []
            func median(_ value: (Sample) -> Double) -> Double { Statistics.median(runs.map(value)) }
            rows.append([
                configuration.label,
                "\(Self.decimal(median { $0.swift.meanBatch }, 1))/\(Self.decimal(median { Double($0.cBatch) }, 0))",
                Self.grouped(median { $0.swift.eventsPerSecond }),
                Self.grouped(median { $0.c.eventsPerSecond }),
                Self.decimal(median { $0.swift.eventsPerSecond / $0.c.eventsPerSecond }, 2),
                Self.latencies(runs.map(\.swift)),
                Self.latencies(runs.map(\.c)),
                configuration.processes == 1
                    ? "-" : "\(Self.decimal(median { $0.swift.overlap }, 2))/\(Self.decimal(median { $0.c.overlap }, 2))",
            ])
        }
        let widths = header.indices.map { column in rows.map { $0[column].count }.max() ?? 0 }
        for row in rows {
            let cells = row.enumerated().map { column, cell in
                let pad = String(repeating: " ", count: widths[column] - cell.count)
                return column == 0 ? cell + pad : pad + cell
            }
            lines.append(cells.joined(separator: "   "))
        }
        lines.append("")
        lines.append("Swift/C is the median of the per-rep ratios (each Swift run against the C run right after it).")
        lines.append(
            "overlap: when the first process finished / when the last did; 1.00 = the processes shared the writer "
                + "lock all along, 1/P = they took turns, one whole process after another.")
        text = lines.joined(separator: "\n")
    }

    /// `p50 / p99 / max` in µs, each the median over the runs.
    static func latencies(_ runs: [RunResult]) -> String {
        [\RunResult.p50Micros, \.p99Micros, \.maxMicros]
            .map { figure in grouped(Statistics.median(runs.map { $0[keyPath: figure] })) }
            .joined(separator: " / ")
    }

    /// A whole number with thousands separators: 12,345.
    static func grouped(_ value: Double) -> String {
        let digits = String(Int(value.rounded()))
        let negative = digits.hasPrefix("-")
        var body = Array(negative ? digits.dropFirst() : digits[...])
        var index = body.count - 3
        while index > 0 {
            body.insert(",", at: index)
            index -= 3
        }
        return (negative ? "-" : "") + String(body)
    }

    /// `value` with `places` decimals.
    static func decimal(_ value: Double, _ places: Int) -> String {
        String(format: "%.\(places)f", value)
    }
}
