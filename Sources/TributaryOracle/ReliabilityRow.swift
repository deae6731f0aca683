/// One row of the reliability table (docs/reliability.md): the scenario, its iterations, the verdict's
/// figures and its result, tab-separated. Written by the test suite's scenarios (`make test`) and by
/// the system test's guest (`tributary-sim judge`), printed by `scripts/reliability-table.sh`.
public enum ReliabilityRow {
    /// The table's columns, in order.
    public static let columns = [
        "scenario", "iterations", "acknowledged", "delivered", "lost", "wire dups", "dups after dedup",
        "order violations", "misattributed", "result",
    ]

    /// The header line, ending in a line break.
    public static var header: String { columns.joined(separator: "\t") + "\n" }

    /// The row's line, ending in a line break; tabs and line breaks inside a field become spaces.
    public static func line(_ scenario: String, iterations: Int, verdict: Oracle.Verdict, result: String) -> String {
        let v = verdict
        let fields: [String] = [
            scenario, "\(iterations)", "\(v.acknowledged)", "\(v.delivered)", "\(v.lost)",
            "\(v.wireDuplicates)", "\(v.duplicatesAfterDedup)", "\(v.orderViolations)", "\(v.misattributed)", result,
        ]
        return fields.map { $0.replacing("\t", with: " ").replacing("\n", with: " ") }.joined(separator: "\t") + "\n"
    }
}
