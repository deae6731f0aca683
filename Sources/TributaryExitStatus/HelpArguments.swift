/// What the four executables do with their command line before ArgumentParser reads it.
public enum CommandLineArguments {
    /// `arguments` (without the program name) with a `--help` or `-h` never taken as the value of the
    /// option before it: that option is dropped, and the help is shown.
    ///
    /// The tools' numeric options parse `.unconditional`, so that `--deadline -1` reaches the tool's own
    /// check and message (a value starting with `-` is otherwise taken for an option: "Missing value").
    /// Such an option takes whatever follows it, and `--deadline --help` was refused as a bad number
    /// instead of showing the help. Nothing after a `--` is looked at (it is all positional).
    public static func helpFirst(_ arguments: [String]) -> [String] {
        let end = arguments.firstIndex(of: "--") ?? arguments.endIndex
        var kept = arguments
        for index in arguments[..<end].indices.reversed()
        where index > 0 && ["--help", "-h"].contains(arguments[index]) {
            let before = arguments[index - 1]
            if before.hasPrefix("-"), !before.contains("="), !["--help", "-h"].contains(before) {
                kept.remove(at: index - 1)
            }
        }
        return kept
    }
}
