/// A process's exit status, as `sysexits.h` names them: what Tributary's executables end with, and
/// what systemd's `RestartPreventExitStatus=` and scripts read.
public struct ExitStatus: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    public let rawValue: Int32
    public init(rawValue: Int32) { self.rawValue = rawValue }

    /// 0: done.
    public static let success = ExitStatus(rawValue: 0)
    /// 1: a run that found what it checks to be wrong (a demo whose events did not all arrive).
    public static let failure = ExitStatus(rawValue: 1)
    /// 64 `EX_USAGE`: a bad command line, or a group path that is no directory.
    public static let usage = ExitStatus(rawValue: 64)
    /// 65 `EX_DATAERR`: an event, property, id or setting refused; nothing was written.
    public static let dataError = ExitStatus(rawValue: 65)
    /// 66 `EX_NOINPUT`: no group directory, or no store in it, where one must be.
    public static let noInput = ExitStatus(rawValue: 66)
    /// 69 `EX_UNAVAILABLE`: a service needed is not there (no agent listening, another agent holds
    /// the group, no browser).
    public static let unavailable = ExitStatus(rawValue: 69)
    /// 70 `EX_SOFTWARE`: an internal error.
    public static let software = ExitStatus(rawValue: 70)
    /// 74 `EX_IOERR`: an I/O error (the fail-stop rule), or a store or outbox that cannot be used.
    public static let ioError = ExitStatus(rawValue: 74)
    /// 75 `EX_TEMPFAIL`: try again later (a store at its quota, a store replaced while open).
    public static let tempFail = ExitStatus(rawValue: 75)
    /// 77 `EX_NOPERM`: a group directory this user may not use, or that every user may write.
    public static let noPermission = ExitStatus(rawValue: 77)
    /// 78 `EX_CONFIG`: a configuration error a restart would meet again.
    public static let configuration = ExitStatus(rawValue: 78)

    public var description: String { String(rawValue) }
}
