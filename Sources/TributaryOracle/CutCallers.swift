import Foundation

/// How many `track()` callers a cut producer had at once, by producer id: `tributary-sim judge
/// --cut-callers PATTERN=N`, where PATTERN is a shell pattern over producer ids (`pl-*-2=4`).
///
/// A producer's callers each write their own ledger line once their `track()` returned. When the power
/// went, a caller's event could be stored with its line not out yet while another caller's line, for a
/// later event, had left: up to one fewer than its callers of a cut producer's unlisted events may lie
/// below the last line its ledger lists. See ``Oracle/cutCallers``.
public struct CutCallersRule: Sendable, Equatable {
    /// A shell pattern (`fnmatch`) the producer id must match.
    public var pattern: String
    /// The callers of a producer it matches: at least one.
    public var callers: Int

    public init(pattern: String, callers: Int) {
        self.pattern = pattern
        self.callers = callers
    }

    /// Parses `PATTERN=N`; nil unless N is a positive integer and PATTERN is not empty.
    public init?(argument: String) {
        guard let equals = argument.lastIndex(of: "=") else { return nil }
        let pattern = String(argument[..<equals])
        guard !pattern.isEmpty, let callers = Int(argument[argument.index(after: equals)...]), callers > 0 else {
            return nil
        }
        self.init(pattern: pattern, callers: callers)
    }

    /// The callers of each of `producers` that a rule names: the first rule whose pattern matches.
    /// Producers no rule matches are left out (one caller).
    public static func resolve(_ rules: [CutCallersRule], producers: some Sequence<String>) -> [String: Int] {
        var callers: [String: Int] = [:]
        for producer in producers {
            if let rule = rules.first(where: { fnmatch($0.pattern, producer, 0) == 0 }) {
                callers[producer] = rule.callers
            }
        }
        return callers
    }
}
