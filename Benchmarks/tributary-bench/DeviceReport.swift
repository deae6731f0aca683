import Foundation

/// An idle agent over its window.
struct IdleSample {
    var seconds: Double
    var wakeups: Int
    var writtenBytes: Int
    var cpuSeconds: Double
    var wakeupsPerSecond: Double { Double(wakeups) / seconds }
    var cpuPercent: Double { 100 * cpuSeconds / seconds }
}

/// The store's writer lock as the agent's deletes held it: the `tributary_store_lock_hold_seconds`
/// histogram of its metrics (cumulative counts per upper bound, in seconds), its count and sum.
struct LockHolds {
    var buckets: [(le: Double, count: Int)] = []
    var count = 0
    var sum = 0.0

    init(metrics: String) throws {
        let name = "tributary_store_lock_hold_seconds"
        for line in metrics.split(separator: "\n") where line.hasPrefix(name) {
            let parts = line.split(separator: " ")
            guard parts.count >= 2, let value = Double(parts[1]) else { continue }
            if line.hasPrefix(name + "_bucket"), let start = line.range(of: "le=\""),
                let end = line[start.upperBound...].firstIndex(of: "\"")
            {
                let bound = String(line[start.upperBound..<end])
                buckets.append((bound == "+Inf" ? .infinity : Double(bound) ?? .infinity, Int(value)))
            } else if line.hasPrefix(name + "_count") {
                count = Int(value)
            } else if line.hasPrefix(name + "_sum") {
                sum = value
            }
        }
        guard count > 0 else { throw BenchFailure("the agent's metrics have no store-lock hold times.") }
        buckets.sort { $0.le < $1.le }
    }

    /// The smallest bound that `share` of the holds are within.
    func bound(holding share: Double) -> Double {
        buckets.first { Double($0.count) >= share * Double(count) }?.le ?? .infinity
    }

    var mean: Double { sum / Double(count) }

    /// `n holds, mean x ms, p50 ≤ a ms, p99 ≤ b ms, all ≤ c ms` (bounds are the histogram's buckets).
    var text: String {
        func ms(_ seconds: Double) -> String { seconds.isInfinite ? "inf" : Report.decimal(seconds * 1000, seconds < 0.01 ? 1 : 0) }
        return "\(count) holds, mean \(ms(mean)) ms, p50 <= \(ms(bound(holding: 0.5))) ms, "
            + "p99 <= \(ms(bound(holding: 0.99))) ms, all <= \(ms(bound(holding: 1))) ms"
    }
}

/// One latency repetition: the producer's `track()` latencies (ns) with no agent, beside the agent's
/// drain, and beside the C floor's drain of the same backlog.
struct LatencySample {
    var idle: [UInt64]
    var draining: [UInt64]
    var floorDraining: [UInt64]
    /// Whether both backlogs were still being drained when the producer's last call returned.
    var overlapped: Bool
    var holds: LockHolds
    /// The agent's drain in events a second: while the producer ran beside it, and after (alone).
    var drainRate: (beside: Double, alone: Double)

    static let percentiles = [50.0, 99, 99.9, 100]

    static func text(_ latencies: [UInt64]) -> String {
        percentiles.map { Report.decimal(Double(Statistics.percentile($0, of: latencies)) / 1e3, 0) }
            .joined(separator: "/")
    }
}

/// One energy repetition: the agent's CPU and disk bytes per delivered event with requests of the
/// floor's chunk, its CPU with the default batch size, and the C floor's CPU.
struct EnergySample {
    var agentCPUSeconds: Double
    var delivered: Int
    var agentWrittenBytes: Int
    var defaultCPUSeconds: Double
    var defaultDelivered: Int
    var floorCPUSeconds: Double
    var floorEvents: Int
    /// The stored size of one event (record header and body).
    var eventBytes: Double

    var agentMicros: Double { agentCPUSeconds * 1e6 / Double(max(delivered, 1)) }
    var floorMicros: Double { floorCPUSeconds * 1e6 / Double(max(floorEvents, 1)) }
    var ratio: Double { agentMicros / floorMicros }
    var defaultMicros: Double { defaultCPUSeconds * 1e6 / Double(max(defaultDelivered, 1)) }
    var defaultRatio: Double { defaultMicros / floorMicros }
    var bytesPerEvent: Double { Double(agentWrittenBytes) / Double(max(delivered, 1)) }
    var writeAmplification: Double { bytesPerEvent / eventBytes }
}

/// The device benchmark's tables of medians, and its rows of the summary.
struct DeviceReport {
    var idle: IdleSample?
    var latency: [LatencySample] = []
    var latencyEvents = 0
    var latencyBacklog = 0
    var energy: [EnergySample] = []
    var energyEvents = 0
    /// Events per request in the like-for-like energy runs (the floor's chunk).
    var energyChunk = 0

    /// Median over the repetitions of `p`-th percentile latencies, in µs.
    func latencyMicros(_ p: Double, draining: Bool) -> Double {
        latencyMicros(p) { draining ? $0.draining : $0.idle }
    }

    /// Median over the repetitions of `p`-th percentile latencies of one run of each, in µs.
    func latencyMicros(_ p: Double, of run: (LatencySample) -> [UInt64]) -> Double {
        Statistics.median(latency.map { Double(Statistics.percentile(p, of: run($0))) / 1e3 })
    }

    /// Median over the repetitions of the ratio of two runs' `p`-th percentiles.
    func latencyRatio(_ p: Double, _ run: (LatencySample) -> [UInt64], to baseline: (LatencySample) -> [UInt64]) -> Double {
        Statistics.median(latency.map {
            Double(Statistics.percentile(p, of: run($0))) / Double(max(Statistics.percentile(p, of: baseline($0)), 1))
        })
    }

    var text: String {
        var lines = ["Agent on a device (tributary-bench device): medians of \(max(latency.count, energy.count)) repetitions"]
        var rows = [["figure", "value", "baseline (same run)", "ratio"]]
        rows += summaryRows.map { Array($0.prefix(4)) }
        lines += AgentReport.format(rows)
        if let holds = latency.last?.holds {
            lines.append("store-lock hold times of the last latency run (the agent's deletes): \(holds.text)")
            lines.append(
                "  histogram (cumulative): "
                    + holds.buckets.map { "<= \($0.le.isInfinite ? "inf" : Report.decimal($0.le * 1000, 0)) ms: \($0.count)" }
                    .joined(separator: ", "))
        }
        if latency.contains(where: { !$0.overlapped }) {
            lines.append("NOTE: in some latency runs the drain ended before the producer did.")
        }
        return lines.joined(separator: "\n")
    }

    /// Rows of the summary: figure, value, baseline, ratio, target, met.
    var summaryRows: [[String]] {
        var rows: [[String]] = []
        if let idle {
            let seconds = Report.decimal(idle.seconds, 0)
            rows.append([
                "idle agent, wake-ups (\(seconds) s, watchdog on)", "\(Report.decimal(idle.wakeupsPerSecond, 2))/s", "-", "-",
                "< 1/s", idle.wakeupsPerSecond < 1 ? "yes" : "no",
            ])
            rows.append([
                "idle agent, bytes written to disk", "\(idle.writtenBytes) in \(seconds) s", "-", "-", "0",
                idle.writtenBytes == 0 ? "yes" : "no",
            ])
            rows.append([
                "idle agent, CPU", "\(Report.decimal(idle.cpuPercent, 3)) %", "-", "-", "< 0.05 %",
                idle.cpuPercent < 0.05 ? "yes" : "no",
            ])
        }
        if !latency.isEmpty {
            let idle99 = latencyMicros(99, draining: false)
            let drain99 = latencyMicros(99, draining: true)
            let ratio = latencyRatio(99, \.draining, to: \.idle)
            rows.append([
                "track() p99 while the agent drains \(Report.grouped(Double(latencyBacklog)))", "\(Report.decimal(drain99, 0)) µs",
                "no agent: \(Report.decimal(idle99, 0)) µs", Report.decimal(ratio, 2), "<= 2x", ratio <= 2 ? "yes" : "no",
            ])
            let floor99 = latencyMicros(99, of: \.floorDraining)
            rows.append([
                "  same, beside the C floor's drain instead", "\(Report.decimal(floor99, 0)) µs",
                "no agent: \(Report.decimal(idle99, 0)) µs", Report.decimal(latencyRatio(99, \.floorDraining, to: \.idle), 2),
                "-", "-",
            ])
            rows.append([
                "  the agent's drain against the C floor's, p99", "\(Report.decimal(drain99, 0)) µs",
                "C floor: \(Report.decimal(floor99, 0)) µs", Report.decimal(latencyRatio(99, \.draining, to: \.floorDraining), 2),
                "-", "-",
            ])
            let drainMax = latencyMicros(100, draining: true)
            rows.append([
                "track() max while the agent drains", "\(Report.decimal(drainMax / 1000, 1)) ms",
                "no agent: \(Report.decimal(latencyMicros(100, draining: false) / 1000, 1)) ms", "-", "< 20 ms",
                drainMax < 20_000 ? "yes" : "no",
            ])
            let beside = Statistics.median(latency.map(\.drainRate.beside))
            let alone = Statistics.median(latency.map(\.drainRate.alone))
            rows.append([
                "  the agent's drain beside the producer (it rests)", "\(Report.grouped(beside))/s",
                "alone: \(Report.grouped(alone))/s", Report.decimal(Statistics.median(latency.map { $0.drainRate.beside / max($0.drainRate.alone, 1) }), 2),
                "-", "-",
            ])
            rows.append([
                "  (p50 / p99.9 while draining)",
                "\(Report.decimal(latencyMicros(50, draining: true), 0)) / \(Report.decimal(latencyMicros(99.9, draining: true), 0)) µs",
                "\(Report.decimal(latencyMicros(50, draining: false), 0)) / \(Report.decimal(latencyMicros(99.9, draining: false), 0)) µs",
                "-", "-", "-",
            ])
        }
        if !energy.isEmpty {
            let ratio = Statistics.median(energy.map(\.ratio))
            let floor = "C drain + gzip: \(Report.decimal(Statistics.median(energy.map(\.floorMicros)), 1)) µs"
            rows.append([
                "agent CPU per delivered event, requests of \(Report.grouped(Double(energyChunk)))",
                "\(Report.decimal(Statistics.median(energy.map(\.agentMicros)), 1)) µs", floor,
                Report.decimal(ratio, 2), "<= 1.5x", ratio <= 1.5 ? "yes" : "no",
            ])
            rows.append([
                "  same, the default batches (500 events)", "\(Report.decimal(Statistics.median(energy.map(\.defaultMicros)), 1)) µs",
                floor, Report.decimal(Statistics.median(energy.map(\.defaultRatio)), 2), "-", "-",
            ])
            rows.append([
                "agent bytes written per event", "\(Report.decimal(Statistics.median(energy.map(\.bytesPerEvent)), 0)) B",
                "event: \(Report.decimal(energy[0].eventBytes, 0)) B", Report.decimal(Statistics.median(energy.map(\.writeAmplification)), 2),
                "report", "-",
            ])
        }
        return rows
    }
}
