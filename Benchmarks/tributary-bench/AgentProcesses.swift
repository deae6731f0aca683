import Foundation
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// A child process started with `posix_spawn` and reaped with `wait4`, which gives its own resource
/// usage: peak RSS (`ru_maxrss`, the kernel's VmHWM at exit) and CPU time. (lmdb.h: never `fork` a
/// process with an LMDB environment open; `posix_spawn` does not.)
final class SpawnedProcess {
    let name: String
    let pid: pid_t
    private let started: UInt64
    private var reaped = false

    /// How a spawned process ended.
    struct Exit {
        /// Exit status, or nil when a signal ended it.
        var status: Int32?
        var signal: Int32?
        /// From just before `posix_spawn` to `wait4` returning.
        var seconds: Double
        var cpuSeconds: Double
        /// Bytes it caused to be written to disk (`ru_oublock`, 512-byte units: `write_bytes` of
        /// /proc/PID/io), its threads' together.
        var writtenBytes: Int
    }

    /// Starts `executable` with `arguments` and, besides the driver's environment, `environment`;
    /// stdin is /dev/null, stdout and stderr are the driver's.
    init(name: String, executable: String, arguments: [String], environment: [String: String] = [:]) throws {
        self.name = name
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        let argv: [UnsafeMutablePointer<CChar>?] = ([executable] + arguments).map { strdup($0) } + [nil]
        defer { for pointer in argv { free(pointer) } }
        var variables = ProcessInfo.processInfo.environment
        variables.merge(environment) { $1 }
        let envp: [UnsafeMutablePointer<CChar>?] = variables.map { strdup("\($0.key)=\($0.value)") } + [nil]
        defer { for pointer in envp { free(pointer) } }
        var pid: pid_t = 0
        started = Monotonic.nanos()
        let rc = posix_spawn(&pid, executable, &actions, nil, argv, envp)
        guard rc == 0 else { throw BenchFailure("could not start \(executable): \(String(cString: strerror(rc))).") }
        self.pid = pid
    }

    deinit {
        // Only reached with a live child when the driver is failing.
        if !reaped {
            kill(pid, SIGKILL)
            var status: Int32 = 0
            _ = waitpid(pid, &status, 0)
        }
    }

    /// Waits for the process to end.
    func wait() throws -> Exit {
        var status: Int32 = 0
        var usage = rusage()
        var rc: pid_t
        repeat { rc = wait4(pid, &status, 0, &usage) } while rc == -1 && errno == EINTR
        guard rc == pid else { throw BenchFailure("wait4(\(name)): \(String(cString: strerror(errno))).") }
        reaped = true
        let seconds = Double(Monotonic.nanos() - started) / 1e9
        let signal = status & 0x7f
        let cpu = Double(ResourceUsage.nanos(usage.ru_utime) + ResourceUsage.nanos(usage.ru_stime)) / 1e9
        return Exit(
            status: signal == 0 ? (status >> 8) & 0xff : nil, signal: signal == 0 ? nil : signal, seconds: seconds,
            cpuSeconds: cpu, writtenBytes: Int(usage.ru_oublock) * 512)
    }
}

/// The reference collector (`tributary-collector --port 0`, in-memory database) for one run.
final class CollectorProcess {
    private let process = Process()
    private let output = Pipe()
    /// The port it listens on (127.0.0.1).
    let port: UInt16
    /// With TLS: its certificate, and the CA the agent and `/stats` trust.
    let tls: BenchTLS?
    /// The ingest URL the agent posts to.
    var ingestURL: String { tls == nil ? "http://127.0.0.1:\(port)/sa" : "https://localhost:\(port)/sa" }

    /// Starts `executable --port 0 --log-level warning` followed by `arguments` (faults, for instance),
    /// serving https with `tls`'s certificate when given.
    init(executable: String, arguments: [String] = [], tls: BenchTLS? = nil) throws {
        self.tls = tls
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments =
            ["--port", "0", "--log-level", "warning"] + arguments
            + (tls.map { ["--tls-cert", $0.certificateFile, "--tls-key", $0.keyFile] } ?? [])
        process.standardOutput = output
        process.standardError = FileHandle.standardError
        try process.run()
        var buffered = Data()
        while true {
            if let newline = buffered.firstIndex(of: UInt8(ascii: "\n")) {
                let line = String(decoding: buffered[..<newline], as: UTF8.self)
                buffered.removeSubrange(...newline)
                guard line.hasPrefix("LISTENING "), let url = URL(string: String(line.dropFirst(10))),
                    let port = url.port
                else { continue }
                self.port = UInt16(port)
                return
            }
            let chunk = output.fileHandleForReading.availableData
            if chunk.isEmpty {
                throw BenchFailure("tributary-collector exited before it listened (see its error above).")
            }
            buffered.append(chunk)
        }
    }

    deinit {
        if process.isRunning {
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
        }
    }

    /// What `GET /stats` says.
    struct Stats {
        var unique: Int
        var received: Int
        var duplicates: Int
        var seqViolations: Int
        var orderViolations: Int
    }

    func stats() throws -> Stats {
        let body = try tls.map { try $0.get("https://localhost:\(port)/stats") } ?? HTTP.get(port: port, path: "/stats")
        guard let object = try JSONSerialization.jsonObject(with: body) as? [String: Any],
            let unique = object["unique"] as? Int, let received = object["received"] as? Int,
            let duplicates = object["duplicates"] as? Int, let seq = object["seq_violations"] as? Int
        else { throw BenchFailure("GET /stats answered \(String(decoding: body, as: UTF8.self)).") }
        let order = (object["order_violations"] as? [String: Any])?.count ?? 0
        return Stats(
            unique: unique, received: received, duplicates: duplicates, seqViolations: seq, orderViolations: order)
    }

    /// User + system CPU seconds the collector has used so far (/proc/PID/stat).
    func cpuSeconds() -> Double {
        guard let text = try? String(contentsOfFile: "/proc/\(process.processIdentifier)/stat", encoding: .utf8),
            let close = text.lastIndex(of: ")")
        else { return 0 }
        // Fields after "(comm)": state is field 3, utime 14, stime 15.
        let fields = text[text.index(after: close)...].split(separator: " ")
        guard fields.count > 12, let user = Double(fields[11]), let system = Double(fields[12]) else { return 0 }
        return (user + system) / Double(sysconf(Int32(_SC_CLK_TCK)))
    }

    /// What `GET /count` says: events the counting endpoint received under `name`.
    func countedEvents(_ name: String) throws -> Int {
        let body = try HTTP.get(port: port, path: "/count")
        guard let object = try JSONSerialization.jsonObject(with: body) as? [String: Any] else {
            throw BenchFailure("GET /count answered \(String(decoding: body, as: UTF8.self)).")
        }
        return (object[name] as? [String: Any])?["events"] as? Int ?? 0
    }

    /// SIGTERM, then waits; a graceful shutdown exits 0.
    func stop() throws {
        process.terminate()
        process.waitUntilExit()
        guard process.terminationReason == .exit, process.terminationStatus == 0 else {
            throw BenchFailure("tributary-collector did not shut down cleanly (status \(process.terminationStatus)).")
        }
    }
}

/// A minimal blocking HTTP/1.1 GET on loopback (the driver is synchronous and needs only /stats).
enum HTTP {
    static func get(port: UInt16, path: String) throws -> Data {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw BenchFailure("socket: \(String(cString: strerror(errno))).") }
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = port.bigEndian
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard connected == 0 else {
            throw BenchFailure("connect to port \(port): \(String(cString: strerror(errno))).")
        }
        let request = Array("GET \(path) HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\nConnection: close\r\n\r\n".utf8)
        var sent = 0
        while sent < request.count {
            let n = request[sent...].withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            guard n > 0 else { throw BenchFailure("send: \(String(cString: strerror(errno))).") }
            sent += n
        }
        var response = Data()
        var buffer = [UInt8](repeating: 0, count: 65_536)
        while true {
            let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if n < 0 && errno == EINTR { continue }
            guard n >= 0 else { throw BenchFailure("recv: \(String(cString: strerror(errno))).") }
            if n == 0 { break }
            response.append(contentsOf: buffer[..<n])
        }
        guard let split = response.range(of: Data("\r\n\r\n".utf8)) else {
            throw BenchFailure("GET \(path): no HTTP response.")
        }
        let head = String(decoding: response[..<split.lowerBound], as: UTF8.self)
        guard head.hasPrefix("HTTP/1.1 200") || head.hasPrefix("HTTP/1.0 200") else {
            throw BenchFailure("GET \(path): \(head.prefix(while: { $0 != "\r" })).")
        }
        var body = response[split.upperBound...]
        if head.lowercased().contains("transfer-encoding: chunked") { body = try dechunk(Data(body))[...] }
        return Data(body)
    }

    private static func dechunk(_ data: Data) throws -> Data {
        var out = Data()
        var rest = data[...]
        while let lineEnd = rest.range(of: Data("\r\n".utf8)) {
            let sizeText = String(decoding: rest[..<lineEnd.lowerBound], as: UTF8.self)
            guard let size = Int(sizeText.split(separator: ";").first ?? "", radix: 16) else {
                throw BenchFailure("bad chunk size \(sizeText).")
            }
            if size == 0 { return out }
            let start = lineEnd.upperBound
            guard rest.distance(from: start, to: rest.endIndex) >= size + 2 else {
                throw BenchFailure("truncated chunk.")
            }
            let end = rest.index(start, offsetBy: size)
            out.append(rest[start..<end])
            rest = rest[rest.index(end, offsetBy: 2)...]
        }
        throw BenchFailure("truncated chunked body.")
    }
}

/// Samples a child's memory from /proc/PID/status every few milliseconds on a thread of its own,
/// until stopped: the peak of its anonymous memory (`RssAnon`: heap, stacks; what would grow with a
/// backlog) and of its file-backed resident pages (`RssFile`: the binary and libraries, and the
/// pages of the LMDB map it touched, which the kernel can drop at any time). `ru_maxrss` (VmHWM)
/// is the peak of their sum.
final class MemorySampler: Sendable {
    struct Peaks: Sendable {
        var anonKB = 0
        var fileKB = 0
        /// The process's own peak RSS (VmHWM, the kernel's high-water mark of its address space, so
        /// nothing between samples is missed; only the last interval before exit can be). Use it
        /// rather than `wait4`'s `ru_maxrss`: after `posix_spawn` (vfork + exec) that also holds the
        /// spawning process's own peak at the exec.
        var hwmKB = 0
        var samples = 0

        /// `(anon 12.3, file 45.6)`, in MiB.
        var note: String {
            "(anon \(Report.decimal(Double(anonKB) / 1024, 1)), file \(Report.decimal(Double(fileKB) / 1024, 1)))"
        }
    }

    private final class State: Sendable {
        let peaks = Mutex(Peaks())
        let stopped = Atomic<Bool>(false)
        let done = DispatchSemaphore(value: 0)
    }

    private let state = State()

    init(pid: pid_t, interval: Duration = .milliseconds(10)) {
        let path = "/proc/\(pid)/status"
        let micros = useconds_t(interval.components.attoseconds / 1_000_000_000_000)
        let thread = Thread { [state] in
            while !state.stopped.load(ordering: .acquiring) {
                if let text = try? String(contentsOfFile: path, encoding: .utf8) {
                    let anon = Self.field("RssAnon:", in: text)
                    let file = Self.field("RssFile:", in: text)
                    let hwm = Self.field("VmHWM:", in: text)
                    state.peaks.withLock { peaks in
                        peaks.anonKB = max(peaks.anonKB, anon)
                        peaks.fileKB = max(peaks.fileKB, file)
                        peaks.hwmKB = max(peaks.hwmKB, hwm)
                        peaks.samples += 1
                    }
                }
                usleep(micros)
            }
            state.done.signal()
        }
        thread.start()
    }

    /// Stops sampling and returns the peaks seen.
    func stop() -> Peaks {
        state.stopped.store(true, ordering: .releasing)
        state.done.wait()
        return state.peaks.withLock { $0 }
    }

    /// The value in kB of a `/proc/PID/status` line such as `RssAnon:     1234 kB`; 0 when absent.
    static func field(_ name: String, in text: String) -> Int {
        guard let range = text.range(of: name) else { return 0 }
        let rest = text[range.upperBound...].drop(while: { $0 == " " || $0 == "\t" })
        return Int(rest.prefix(while: \.isNumber)) ?? 0
    }
}
