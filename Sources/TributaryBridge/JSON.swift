import TributaryJSON

/// The bridge's name for ``JSONValue`` (TributaryJSON), the one JSON value of every module: bridge
/// messages and DevTools protocol traffic are read into it.
public typealias JSON = JSONValue
