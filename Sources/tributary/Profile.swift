import ArgumentParser
import Tributary
import TributaryStore

/// `tributary profile OPERATION`: one user-profile operation for the group's current user.
struct Profile: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Record one user-profile operation; prints its event id once it is durably stored.",
        discussion: """
            OPERATION is set, set-once, increment, append, unset or delete (the Sensors records \
            profile_set, profile_set_once, …). The profile is the user the group's identity names (its login \
            id, else its anonymous id). increment takes numbers, append lists of strings; unset takes the \
            property names as arguments; delete takes nothing. Examples:
              tributary profile set --group DIR --properties '{"name": "Ada", "plan": "pro"}'
              tributary profile increment --group DIR --properties '{"visits": 1}'
              tributary profile unset --group DIR plan
            A rejected operation (exit 65) writes nothing; the group directory must exist (exit 66).
            """)

    @OptionGroup var options: GroupOption

    @Argument(help: ArgumentHelp("set, set-once, increment, append, unset or delete.", valueName: "operation"))
    var operation: String

    @Argument(help: ArgumentHelp("For unset: the property names to remove.", valueName: "name"))
    var names: [String] = []

    @Option(help: ArgumentHelp("The profile properties as a JSON object, e.g. '{\"visits\": 1}'.", valueName: "json"))
    var properties: String?

    /// The operations by their command-line name.
    static let operations: [String: ProfileOperation] = [
        "set": .set, "set-once": .setOnce, "increment": .increment, "append": .append, "unset": .unset,
        "delete": .delete,
    ]

    func validate() throws {
        guard let operation = Self.operations[operation] else {
            throw ValidationError("OPERATION must be set, set-once, increment, append, unset or delete, not '\(operation)'.")
        }
        if operation == .unset {
            guard properties == nil, !names.isEmpty else {
                throw ValidationError("unset takes the property names to remove as arguments, not --properties.")
            }
        } else if !names.isEmpty {
            throw ValidationError("Only unset takes property names as arguments; give \(operation) --properties.")
        }
    }

    func run() throws {
        try reportingErrors {
            let operation = Self.operations[operation]!
            var props = try properties.map { try PropertyValue.properties(fromJSON: $0) } ?? [:]
            for name in names { props[name] = .bool(true) }
            // Before the Tracker opens the store: a refused operation leaves the group as it was.
            try ProfileRules.validate(operation, props)
            var config = Tracker.Configuration(groupDirectory: options.group)
            config.publishesAppPresets = false
            let receipt = try Tracker(configuration: config).profile(operation, properties: props)
            say(receipt.eventID, done: "\(operation) \(receipt.eventID) is stored")
        }
    }
}
