import CTributaryBridge
import Foundation
import Synchronization
import TributaryStore
import TributaryErrors

#if canImport(Glibc)
    import Glibc
#endif

/// Why the headless browser could not be started or driven.
public struct BrowserError: TributaryError {
    /// What went wrong.
    public struct Code: ErrorCode {
        private enum Kind: String { case chromiumNotFound, spawnFailed, browserExited, protocolError, timedOut }
        private let kind: Kind
        private init(_ kind: Kind) { self.kind = kind }
        public init?(rawValue: String) {
            guard let kind = Kind(rawValue: rawValue) else { return nil }
            self.kind = kind
        }
        public var rawValue: String { kind.rawValue }

        /// No Chromium executable was found (install Debian's `chromium`, or set `TRIBUTARY_CHROMIUM`).
        public static let chromiumNotFound = Code(.chromiumNotFound)
        /// `posix_spawn` or `pipe2` failed.
        public static let spawnFailed = Code(.spawnFailed)
        /// The browser closed its DevTools pipe (it exited or crashed).
        public static let browserExited = Code(.browserExited)
        /// The browser answered a DevTools command with an error.
        public static let protocolError = Code(.protocolError)
        /// The browser did not answer a DevTools command in time (it hangs, or is not a Chromium).
        public static let timedOut = Code(.timedOut)
    }

    /// What went wrong.
    public var code: Code
    /// A sentence saying what and what to do.
    public var message: String
    /// The underlying error, if any.
    public var cause: (any Error & Sendable)?
    /// Where the error was raised, for bug reports.
    public var location: SourceLocation

    /// Creates an error.
    public init(
        _ code: Code, _ message: String, cause: (any Error & Sendable)? = nil, file: String = #fileID, line: Int = #line
    ) {
        self.code = code
        self.message = message
        self.cause = cause
        self.location = SourceLocation(file: file, line: line)
    }
}

/// A headless Chromium child process driven over `--remote-debugging-pipe`.
///
/// Chromium reads DevTools commands on its fd 3 and writes replies and events on its fd 4, each
/// message a JSON text followed by a NUL byte. The process is spawned with `posix_spawn` (never a
/// plain `fork`: this process may have the LMDB environment open, and lmdb.h says "do not have open
/// an MDB database in a process that forks").
public final class ChromiumProcess: Sendable {
    /// The child's process id.
    public let pid: pid_t
    /// The parent's end of the command pipe (Chromium's fd 3).
    let commands: CommandPipe
    /// The parent's end of the reply pipe (Chromium's fd 4).
    let replyFD: Int32
    /// The browser's profile, a fresh directory under the temporary directory, removed by ``terminate()``.
    let userDataDirectory: String
    private let reaped = Mutex(false)

    /// The Chromium executable: `$TRIBUTARY_CHROMIUM`, else the first of `chromium`, `chromium-browser`,
    /// `google-chrome` on `PATH`.
    public static func executable() throws(BrowserError) -> String {
        let environment = ProcessInfo.processInfo.environment
        if let given = environment["TRIBUTARY_CHROMIUM"], !given.isEmpty { return given }
        let path = environment["PATH"] ?? "/usr/bin:/bin"
        for name in ["chromium", "chromium-browser", "google-chrome"] {
            for dir in path.split(separator: ":") where access("\(dir)/\(name)", X_OK) == 0 {
                return "\(dir)/\(name)"
            }
        }
        throw BrowserError(
            .chromiumNotFound,
            "No chromium on PATH (\(path)); install Debian's chromium (make deps) or set TRIBUTARY_CHROMIUM.")
    }

    /// Starts headless Chromium with a fresh profile and the DevTools pipe.
    ///
    /// - Parameter extraArguments: more command-line switches (for example `--user-agent=…`).
    public init(executable: String? = nil, extraArguments: [String] = []) throws(BrowserError) {
        let binary: String
        if let executable { binary = executable } else { binary = try Self.executable() }
        let profile = FileManager.default.temporaryDirectory
            .appendingPathComponent("tributary-chromium-\(UUID().uuidString.prefix(8))").path
        var commands: [Int32] = [-1, -1]
        var replies: [Int32] = [-1, -1]
        // Close-on-exec from their creation, so no other child this process spawns inherits the
        // browser's pipes: set afterwards (fcntl), a spawn on another thread in between would.
        guard tributary_pipe2(&commands, O_CLOEXEC) == 0 else {
            throw BrowserError(.spawnFailed, "pipe2 failed: \(String(cString: strerror(errno))).")
        }
        guard tributary_pipe2(&replies, O_CLOEXEC) == 0 else {
            close(commands[0])
            close(commands[1])
            throw BrowserError(.spawnFailed, "pipe2 failed: \(String(cString: strerror(errno))).")
        }
        // In a container there is no user namespace for Chromium's sandbox and no GPU.
        let arguments =
            [
                binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                "--no-default-browser-check", "--disable-background-networking", "--disable-extensions",
                "--disable-component-update", "--mute-audio", "--remote-debugging-pipe", "--user-data-dir=\(profile)",
            ] + extraArguments + ["about:blank"]

        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        // dup2 clears FD_CLOEXEC on the target; every fd from 5 up is closed, so only fds 3 and 4 (and
        // stdio) reach the browser, whatever the app opened without close-on-exec.
        posix_spawn_file_actions_adddup2(&actions, commands[0], 3)
        posix_spawn_file_actions_adddup2(&actions, replies[1], 4)
        tributary_spawn_addclosefrom(&actions, 5)
        let log = ProcessInfo.processInfo.environment["TRIBUTARY_CHROMIUM_LOG"] ?? "/dev/null"
        posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 2, log, O_WRONLY | O_CREAT | O_APPEND, 0o644)
        // Every signal at its default and none blocked, whatever the app set (an app that ignores SIGTERM
        // for its own handling gave a browser that ignored the stop); a process group of its own, which
        // its helpers (zygote, renderers, network service) join, so that a stop reaches them too.
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var defaults = sigset_t()
        sigfillset(&defaults)
        sigdelset(&defaults, SIGKILL)
        sigdelset(&defaults, SIGSTOP)
        posix_spawnattr_setsigdefault(&attributes, &defaults)
        var unblocked = sigset_t()
        sigemptyset(&unblocked)
        posix_spawnattr_setsigmask(&attributes, &unblocked)
        posix_spawnattr_setpgroup(&attributes, 0)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETPGROUP))
        var child: pid_t = 0
        let argv = arguments.map { strdup($0) } + [nil]
        defer { for p in argv { free(p) } }
        let rc = posix_spawn(&child, binary, &actions, &attributes, argv, environ)
        close(commands[0])
        close(replies[1])
        guard rc == 0 else {
            close(commands[1])
            close(replies[0])
            throw BrowserError(.spawnFailed, "posix_spawn \(binary) failed: \(String(cString: strerror(rc))).")
        }
        pid = child
        self.commands = CommandPipe(fd: commands[1])
        replyFD = replies[0]
        userDataDirectory = profile
    }

    /// Stops the browser and its helpers (SIGTERM to its process group, then SIGKILL after 2 s), reaps
    /// it and removes its profile.
    public func terminate() {
        let first = reaped.withLock { done in
            defer { done = true }
            return !done
        }
        guard first else { return }
        // The browser first: a write blocked on a browser that stopped reading holds the command pipe's
        // lock, and is released only when the browser's end closes (EPIPE). Closing first would wait on
        // that lock for ever, and the browser would never be signalled.
        kill(-pid, SIGTERM)
        // Waits for the browser's exit without reaping it: until it is reaped, its pid (the group's id)
        // is given to no other process, so the group's SIGKILL below reaches only its helpers. Helpers
        // left running wrote into the profile after its removal and left it behind.
        var waited = 0
        var unreaped = true
        while true {
            var info = siginfo_t()
            let rc = waitid(P_PID, id_t(pid), &info, WEXITED | WNOHANG | WNOWAIT)
            if rc == 0 && info._sifields._sigchld.si_pid == pid { break }
            if rc != 0 && errno != EINTR {
                unreaped = false  // reaped elsewhere (ECHILD): its pid may be another process's by now
                break
            }
            if waited == 200 { kill(-pid, SIGKILL) }
            usleep(10_000)
            waited += 1
        }
        if unreaped {
            kill(-pid, SIGKILL)
            var status: Int32 = 0
            _ = waitpid(pid, &status, 0)
        }
        commands.close()
        let singleton = singletonDirectory
        Self.removeProfile(userDataDirectory)
        if let singleton { Self.removeProfile(singleton) }
    }

    /// The directory of the browser's process-singleton socket, or nil before the browser made it.
    ///
    /// Chromium makes it outside the profile, as `org.chromium.Chromium.XXXXXX` in the temporary
    /// directory, points the profile's `SingletonSocket` link at the socket inside it, and removes it only
    /// on a shutdown of its own: after a SIGTERM it stays, one directory per browser run. Only an
    /// absolute link into a directory of that name is reported, so a link that points elsewhere is never
    /// followed.
    var singletonDirectory: String? {
        let link = (userDataDirectory as NSString).appendingPathComponent("SingletonSocket")
        guard let target = try? FileManager.default.destinationOfSymbolicLink(atPath: link) else { return nil }
        let directory = (target as NSString).deletingLastPathComponent
        guard target.hasPrefix("/"), (target as NSString).lastPathComponent == "SingletonSocket",
            (directory as NSString).lastPathComponent.hasPrefix("org.chromium.Chromium.")
        else { return nil }
        return directory
    }

    deinit { terminate() }

    /// Removes a profile (or singleton) directory. The browser's helper processes (the network service, the GPU process)
    /// end a moment after the browser and may still write there: a removal that meets their files fails
    /// part way ("directory not empty") and left whole profiles behind. So it is tried again, for up to 2 s.
    static func removeProfile(_ path: String) {
        for _ in 0..<40 {
            guard FileManager.default.fileExists(atPath: path) else { return }
            if (try? FileManager.default.removeItem(atPath: path)) != nil { return }
            usleep(50_000)
        }
    }
}

/// The parent's end of the browser's command pipe.
///
/// Writes and the close take one lock, and a write after the close throws instead of reaching the
/// fd number, which by then another file or socket of this process may have. A write to a browser
/// that died fails with `EPIPE` and does not raise SIGPIPE (see ``writeAll(_:_:)``).
final class CommandPipe: Sendable {
    private let fd: Mutex<Int32?>

    init(fd: Int32) { self.fd = Mutex(fd) }

    /// Writes `bytes` whole; throws ``BrowserError/Code-swift.struct/browserExited`` when the pipe was
    /// closed (``close()``, the browser stopped) or the browser is gone.
    func write(_ bytes: [UInt8]) throws(BrowserError) {
        try fd.withLock { fd throws(BrowserError) in
            guard let open = fd else {
                throw BrowserError(.browserExited, "The browser was stopped; its DevTools pipe is closed.")
            }
            let error = Self.writeAll(open, bytes)
            guard error == 0 else {
                throw BrowserError(
                    .browserExited,
                    "Writing to the browser's DevTools pipe failed (\(String(cString: strerror(error)))): "
                        + "the browser exited.")
            }
        }
    }

    /// Closes the pipe (once); later writes throw.
    func close() {
        fd.withLock { fd in
            if let open = fd { Glibc.close(open) }
            fd = nil
        }
    }

    /// Writes all of `bytes` to `fd`; returns 0, or the `errno` of the write that failed.
    ///
    /// A write to a pipe whose reader is gone (the browser died) fails with `EPIPE` and raises
    /// SIGPIPE, whose default action ends the whole app. `MSG_NOSIGNAL` exists only for sockets, and
    /// ignoring SIGPIPE (`SIG_IGN`) would change the process-wide disposition under an app that may
    /// rely on its own; so SIGPIPE is blocked in this thread for the write only, and the one the
    /// failed write raised is taken (`sigtimedwait`, without waiting) before the mask is restored,
    /// unless one was pending already (that one is not ours to take).
    static func writeAll(_ fd: Int32, _ bytes: [UInt8]) -> Int32 {
        var pipeSignal = sigset_t()
        sigemptyset(&pipeSignal)
        sigaddset(&pipeSignal, SIGPIPE)
        var previous = sigset_t()
        pthread_sigmask(SIG_BLOCK, &pipeSignal, &previous)
        defer { pthread_sigmask(SIG_SETMASK, &previous, nil) }
        var pending = sigset_t()
        sigpending(&pending)
        let pendingBefore = sigismember(&pending, SIGPIPE) == 1

        let failure = TributaryStore.writeAll(fd, bytes) ?? 0
        if failure == EPIPE && !pendingBefore {
            var noWait = timespec(tv_sec: 0, tv_nsec: 0)
            while sigtimedwait(&pipeSignal, nil, &noWait) < 0 && errno == EINTR {}
        }
        return failure
    }
}
