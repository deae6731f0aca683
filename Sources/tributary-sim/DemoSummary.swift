import Foundation

/// The demo's table of what the collector stored, by producer kind and by record type: the whole design
/// card at a glance (app, extensions, hybrid page, autotracked session and its crash).
enum DemoSummary {
    /// How many events of each kind the table names by type; the rest of a kind are summed as "other".
    static let typesPerKind = 12

    /// Lines of the table for `stored` (the collector's events, as JSON objects).
    static func lines(_ stored: [[String: Any]]) -> [String] {
        var byKind: [String: [String: Int]] = [:]
        for event in stored {
            let kind = (event["_tributary"] as? [String: Any])?["producer_kind"] as? String ?? "?"
            let type = event["event"] as? String ?? event["type"] as? String ?? "?"
            byKind[kind, default: [:]][type, default: 0] += 1
        }
        var lines = ["  events by producer kind and type"]
        for kind in byKind.keys.sorted() {
            let types = byKind[kind]!.sorted { $0.value != $1.value ? $0.value > $1.value : $0.key < $1.key }
            lines.append("  \(kind.padding(toLength: 28, withPad: " ", startingAt: 0)) \(types.reduce(0) { $0 + $1.value })")
            for (type, count) in types.prefix(typesPerKind) {
                lines.append("    \(type.padding(toLength: 26, withPad: " ", startingAt: 0)) \(count)")
            }
            let rest = types.dropFirst(typesPerKind).reduce(0) { $0 + $1.value }
            if rest > 0 { lines.append("    \("other".padding(toLength: 26, withPad: " ", startingAt: 0)) \(rest)") }
        }
        return lines
    }
}
