import ArgumentParser
import CTributaryCrash
import Foundation
import Synchronization
import Tributary
import TributaryAutoTrack
import TributaryStore

#if canImport(Glibc)
import Glibc
#endif

/// The main app process: a seeded, scripted user session fed through automatic tracking.
struct App: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "The main app: a scripted user session (launches, pages, clicks, scrolls, backgrounding).",
        discussion: """
            Same seed, same session. Launches (some passive, as a background fetch), page views with load \
            times, clicks on buttons and cells, scrolls that expose list items, notification-centre \
            flickers, trips to the background (simulated time passes, so sessions change), request \
            timings, logins and logouts. Pages carry properties of their own; some navigations go back down the stack; each page \
            view ends in an $AppPageLeave; the product grid's items are exposed only half visible. With \
            --deep-link the launch is from that link, decided by the --aasa file (and --source-domain). \
            After --events events it goes to the background and terminates (a few more events). \
            With --crash-after K it crashes at the first moment the app is in front after K events; the \
            next run reports $AppCrashed and the $AppEnd the crash prevented.
            """)

    @OptionGroup var options: ProducerOptions

    @Option(
        name: .customLong("crash-after"), parsing: .unconditional, help: "Crash once this many events are durable (and the app is in front).")
    var crashAfter: Int?

    @Option(
        name: .customLong("crash-kind"),
        help: "How to crash: segv (null write), fatal (Swift fatalError), abort, threads (4 threads fault at once), breakpoint (the CPU's breakpoint trap).")
    var crashKind: String = "segv"

    @Option(
        name: .customLong("foreign-handler"),
        help: ArgumentHelp(
            "First install a crash handler as another SDK would; it appends a line to this file.",
            valueName: "path"))
    var foreignHandler: String?

    @Option(name: .customLong("session-timeout"), parsing: .unconditional, help: "Seconds in the background that end a session.")
    var sessionTimeout: Double = 30

    @Option(
        name: .customLong("deep-link"),
        help: ArgumentHelp("Launch from this link: $AppDeeplinkLaunch when the --aasa file lets it open the app.", valueName: "url"))
    var deepLink: String?

    @Option(
        name: .customLong("aasa"),
        help: ArgumentHelp("The apple-app-site-association file of the link's host (with --deep-link).", valueName: "path"))
    var aasa: String?

    @Option(
        name: .customLong("source-domain"),
        help: ArgumentHelp("The domain of the page the link is tapped on (the link's own: it opens in the browser).", valueName: "domain"))
    var sourceDomain: String?

    func validate() throws {
        guard ["segv", "fatal", "abort", "threads", "breakpoint"].contains(crashKind) else {
            throw ValidationError("--crash-kind must be segv, fatal, abort, threads or breakpoint, not '\(crashKind)'.")
        }
        if let crashAfter, crashAfter < 0 { throw ValidationError("--crash-after must not be negative.") }
        if (deepLink == nil) != (aasa == nil) { throw ValidationError("--deep-link and --aasa go together.") }
        guard sessionTimeout > 0, sessionTimeout <= 86_400 * 365 else {  // NaN and inf fail too
            throw ValidationError("--session-timeout must be more than 0 and at most a year of seconds; got \(sessionTimeout).")
        }
    }

    func run() async throws {
        if let foreignHandler { try ForeignSDK.install(tracePath: foreignHandler) }
        let association: AppSiteAssociation?
        do {
            association = try aasa.map { try AppSiteAssociation(json: String(contentsOfFile: $0, encoding: .utf8)) }
        } catch {
            throw producerFailure(error)
        }
        let tracker = try options.openTracker(kind: .app)
        let ledger = try Ledger(path: options.ledger)
        let clock = SimulatedClock()
        var config = AutoTracker.Configuration(pageIDs: Catalog.pageIDs)
        config.sessionTimeout = .nanoseconds(Int64(sessionTimeout * 1e9))
        config.monotonicNanos = { clock.now() }
        do {
            let auto = try AutoTracker(tracker: tracker, configuration: config)
            var session = ScriptedSession(
                auto: auto, clock: clock, rng: SplitMix64(seed: options.seed), ledger: ledger,
                pause: options.pauseNanos, crashAfter: crashAfter, crashKind: crashKind)
            try session.record(auto.start())
            if let deepLink, let association {
                let (decision, receipt) = try await tracker.trackDeepLinkLaunch(
                    deepLink, sourceDomain: sourceDomain, association: association)
                session.record(receipt)
                let pattern = decision.pattern.map { " pattern \($0)" } ?? ""
                FileHandle.standardOutput.write(
                    Data("DEEPLINK \(decision.opensApp ? "app" : "browser") matched \(decision.matched)\(pattern)\n".utf8))
            }
            FileHandle.standardOutput.write(Data("READY \(getpid())\n".utf8))
            try await session.run(events: options.events)
            FileHandle.standardOutput.write(Data("DONE \(session.committed)\n".utf8))
        } catch {
            throw producerFailure(error)
        }
    }
}

/// A monotonic clock that simulated time can be added to (time spent in the background).
final class SimulatedClock: Sendable {
    private let skipped = Atomic<UInt64>(0)
    func now() -> UInt64 { BootClock.nowNanos() &+ skipped.load(ordering: .relaxed) }
    func advance(seconds: Double) { skipped.add(UInt64(seconds * 1e9), ordering: .relaxed) }
}

/// A small, fast, seedable generator (same seed, same session on every machine).
struct SplitMix64: RandomNumberGenerator {
    private var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9e37_79b9_7f4a_7c15
        var z = state
        z = (z ^ (z >> 30)) &* 0xbf58_476d_1ce4_e5b9
        z = (z ^ (z >> 27)) &* 0x94d0_49bb_1331_11eb
        return z ^ (z >> 31)
    }
}

/// The script: one app process from launch to termination.
struct ScriptedSession {
    let auto: AutoTracker
    let clock: SimulatedClock
    var rng: SplitMix64
    let ledger: Ledger
    let pause: UInt64
    let crashAfter: Int?
    let crashKind: String
    private(set) var committed = 0
    private var page = Catalog.home
    /// The navigation stack: each page shown and its instance id, bottom first.
    private var stack: [(page: Catalog.Page, id: String)] = []
    private var scroll = 0.0
    private var touch: UInt64 = 0
    private var instance = 0

    init(
        auto: AutoTracker, clock: SimulatedClock, rng: SplitMix64, ledger: Ledger, pause: UInt64, crashAfter: Int?,
        crashKind: String
    ) {
        self.auto = auto
        self.clock = clock
        self.rng = rng
        self.ledger = ledger
        self.pause = pause
        self.crashAfter = crashAfter
        self.crashKind = crashKind
    }

    mutating func record(_ receipts: [TrackReceipt]) {
        for receipt in receipts { ledger.record(receipt) }
        committed += receipts.count
    }

    /// Records one receipt, if an event was tracked.
    mutating func record(_ receipt: TrackReceipt?) { record(receipt.map { [$0] } ?? []) }

    private static func chance(_ p: Double, _ rng: inout SplitMix64) -> Bool {
        Double.random(in: 0..<1, using: &rng) < p
    }

    mutating func run(events: Int) async throws {
        try launch()
        while committed < events {
            if let crashAfter, committed >= crashAfter, auto.phase == .active { Crash.now(crashKind) }
            let before = committed
            let roll = Double.random(in: 0..<1, using: &rng)
            switch roll {
            case ..<0.25: try navigate()
            case ..<0.55: try click()
            case ..<0.75: try scrollPage()
            case ..<0.83: try timing()
            case ..<0.87: try flicker()
            case ..<0.95: try backgroundTrip()
            case ..<0.98: try accountChange()
            default:
                auto.refresh()
                record(try auto.layoutChanged(viewport: Catalog.viewport, root: page.tree(scroll: scroll)))
            }
            // --rate is events per second: a step that tracked several events waits for all of them.
            if pause > 0 { try await Task.sleep(nanoseconds: pause * UInt64(max(1, committed - before))) }
        }
        if let crashAfter, committed >= crashAfter {
            // Not crashed yet: the app was in the background; bring it to the front and crash there.
            record(try auto.handle(.willEnterForeground))
            record(try auto.handle(.didBecomeActive))
            Crash.now(crashKind)
        }
        record(try auto.handle(.willResignActive))
        record(try auto.handle(.didEnterBackground))
        record(try auto.handle(.willTerminate))
    }

    private mutating func launch() throws {
        if Self.chance(0.2, &rng) {
            // A background fetch starts the process; the first page loads unseen.
            record(try auto.handle(.didFinishLaunching(inBackground: true)))
            try show(Catalog.home)
            let fetch = auto.startTiming("request", name: "GET /feed")
            clock.advance(seconds: Double.random(in: 0.05...0.8, using: &rng))
            record(try auto.endTiming(fetch, properties: ["status_code": 200]))
            clock.advance(seconds: Double.random(in: 1...90, using: &rng))
            record(try auto.handle(.willEnterForeground))
            record(try auto.handle(.didBecomeActive))
        } else {
            record(try auto.handle(.didFinishLaunching(inBackground: false)))
            try show(Catalog.home)
            record(try auto.handle(.didBecomeActive))
        }
    }

    /// Shows a page: a new instance pushed, or `existing` again (a back navigation: no load time).
    private mutating func show(_ next: Catalog.Page, instance existing: String? = nil) throws {
        let id: String
        if let existing {
            id = existing
            stack.removeSubrange((stack.lastIndex { $0.id == existing } ?? stack.count)...)
        } else {
            instance += 1
            id = "\(next.className)#\(instance)"
            auto.pageCreated(id)
        }
        stack.append((next, id))
        clock.advance(seconds: Double.random(in: 0.02...0.6, using: &rng))
        page = next
        scroll = 0
        record(
            try auto.pageAppeared(
                PageDescription(
                    instanceID: id, className: next.className, title: next.title, root: next.tree(scroll: 0),
                    url: "sim://\(next.className)", properties: next.properties),
                viewport: Catalog.viewport))
    }

    private mutating func navigate() throws {
        // Some navigations go back down the stack: the page's $referrer is the page below, not the one left.
        if stack.count > 1, Self.chance(0.35, &rng) {
            let below = stack[stack.count - 2]
            return try show(below.page, instance: below.id)
        }
        let candidates = Catalog.all.filter { $0.className != page.className }
        try show(candidates[Int.random(in: 0..<candidates.count, using: &rng)])
    }

    private mutating func click() throws {
        let targets = page.clickable(scroll: scroll)
        guard !targets.isEmpty else { return }
        let target = targets[Int.random(in: 0..<targets.count, using: &rng)]
        touch += 1
        // A control with two targets reports the touch twice: still one $AppClick.
        for _ in 0..<(Self.chance(0.3, &rng) ? 2 : 1) {
            if let receipt = try auto.click(elementID: target, touch: touch) { record([receipt]) }
        }
        if Self.chance(0.2, &rng) {
            let image = auto.startTiming("image", name: "https://img.example/\(target).jpg")
            clock.advance(seconds: Double.random(in: 0.01...0.3, using: &rng))
            record(try auto.endTiming(image))
        }
    }

    private mutating func scrollPage() throws {
        guard page.scrollHeight > 0 else { return }
        scroll = min(page.scrollHeight, max(0, scroll + Double.random(in: -300...700, using: &rng)))
        record(try auto.layoutChanged(viewport: Catalog.viewport, root: page.tree(scroll: scroll)))
    }

    private mutating func timing() throws {
        let request = auto.startTiming("request", name: page.endpoint)
        clock.advance(seconds: Double.random(in: 0.03...1.5, using: &rng))
        record(try auto.endTiming(request, properties: ["status_code": Self.chance(0.95, &rng) ? 200 : 503]))
    }

    /// The user logs in or out (its `$SignUp` or `$Logout` in the ledger, with the identity it carries):
    /// extensions running meanwhile store their events under whichever identity is in force when they track.
    private mutating func accountChange() throws {
        if try auto.tracker.identity().loginID == nil {
            record(try auto.tracker.signUp("sim-user-\(Int.random(in: 1...3, using: &rng))"))
        } else {
            record(try auto.tracker.signOut())
        }
    }

    private mutating func flicker() throws {
        // Notification centre or app switcher and back: no $AppStart.
        record(try auto.handle(.willResignActive))
        record(try auto.handle(.didBecomeActive))
    }

    private mutating func backgroundTrip() throws {
        record(try auto.handle(.willResignActive))
        record(try auto.handle(.didEnterBackground))
        clock.advance(
            seconds: Self.chance(0.5, &rng)
                ? Double.random(in: 1...25, using: &rng) : Double.random(in: 31...600, using: &rng))
        record(try auto.handle(.willEnterForeground))
        record(try auto.handle(.didBecomeActive))
    }
}

/// Ways to crash for real.
enum Crash {
    static func now(_ kind: String) -> Never {
        switch kind {
        case "fatal":
            fatalError("tributary-sim: simulated crash")
        case "abort":
            abort()
        case "breakpoint":
            tributary_crash_breakpoint()
            fatalError("tributary-sim: the breakpoint trap did not end the process")
        case "threads":
            // Four threads fault at the same moment: one record, then the process goes.
            let gate = Gate()
            for _ in 0..<4 {
                Thread.detachNewThread {
                    while !gate.open.load(ordering: .acquiring) {}
                    segv()
                }
            }
            usleep(20_000)
            gate.open.store(true, ordering: .releasing)
            sleep(30)
            fatalError("the crashing threads did not end the process")
        default:
            segv()
        }
    }

    final class Gate: Sendable { let open = Atomic<Bool>(false) }

    static func segv() -> Never {
        let pointer = UnsafeMutablePointer<Int>(bitPattern: 0x10)
        pointer.unsafelyUnwrapped.pointee = 42
        fatalError("unreachable: the write above faults")
    }
}

/// "Another SDK" that installed its crash handler before ours: it appends `foreign-handler signal N` to
/// its trace file, then dies by the default action.
enum ForeignSDK {
    nonisolated(unsafe) static var traceFD: Int32 = -1

    static func install(tracePath: String) throws {
        traceFD = open(tracePath, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o644)
        guard traceFD >= 0 else { throw ValidationError("--foreign-handler: cannot open \(tracePath).") }
        var action = sigaction()
        action.__sigaction_handler.sa_sigaction = { signal, _, _ in
            // Async-signal-safe: a fixed buffer on the stack, write(2), then the default action.
            var line:
                (
                    UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8,
                    UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8
                ) =
                    (
                        0x66, 0x6f, 0x72, 0x65, 0x69, 0x67, 0x6e, 0x2d, 0x68, 0x61, 0x6e, 0x64, 0x6c, 0x65, 0x72, 0x20,
                        0x73, 0x69, 0x67, 0x6e, 0x61, 0x6c, 0x20, 0x30, 0x30, 0x0a, 0
                    )  // "foreign-handler signal 00\n"
            withUnsafeMutableBytes(of: &line) { raw in
                raw[23] = UInt8(48 + (signal / 10) % 10)
                raw[24] = UInt8(48 + signal % 10)
                _ = write(ForeignSDK.traceFD, raw.baseAddress, 26)
            }
            Glibc.signal(signal, SIG_DFL)
            raise(signal)
        }
        action.sa_flags = SA_SIGINFO
        sigemptyset(&action.sa_mask)
        for sig in [SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL, SIGTRAP] { sigaction(sig, &action, nil) }
    }
}
