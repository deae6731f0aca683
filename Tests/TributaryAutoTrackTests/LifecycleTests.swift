import Testing
import TributaryAutoTrack

/// Every sequence of chapter 2 of the whitepaper, as signals in and effects out.
@Suite("Lifecycle state machine")
struct LifecycleTests {
    enum Input: CustomStringConvertible {
        case signal(AppSignal)
        /// The process crashes: what the next start derives from the crash record.
        case crash

        var description: String {
            switch self {
            case .signal(let s): s.description
            case .crash: "crash"
            }
        }
    }

    struct Step {
        var atMillis: UInt64
        var input: Input
        var expect: [LifecycleEffect]
    }

    struct Scenario: CustomTestStringConvertible, Sendable {
        var name: String
        var launchedBefore = true
        var steps: [Step]
        var testDescription: String { name }
    }

    static func at(_ ms: UInt64, _ signal: AppSignal, _ expect: [LifecycleEffect] = []) -> Step {
        Step(atMillis: ms, input: .signal(signal), expect: expect)
    }

    static let coldLaunch = [
        at(0, .didFinishLaunching(inBackground: false), [.newSession]),
        at(500, .didBecomeActive, [.appStart(isFirstTime: false, resumeFromBackground: false)]),
    ]
    static func toBackground(_ ms: UInt64, _ duration: Double) -> [Step] {
        [
            at(ms, .willResignActive),
            at(
                ms + 100, .didEnterBackground, [.appEnd(duration: duration, reason: .background), .pauseTimers, .flush]),
        ]
    }
    static let hotStart: [LifecycleEffect] = [
        .appStart(isFirstTime: false, resumeFromBackground: true), .resumeTimers, .resendPageView,
    ]

    static let scenarios: [Scenario] = [
        Scenario(
            name: "cold start, first launch ever", launchedBefore: false,
            steps: [
                at(0, .didFinishLaunching(inBackground: false), [.newSession]),
                at(500, .didBecomeActive, [.appStart(isFirstTime: true, resumeFromBackground: false)]),
            ]),
        Scenario(name: "cold start, launched before", steps: coldLaunch),
        Scenario(
            name: "hot start: home button, then back after 10 s (same session)",
            steps: coldLaunch + toBackground(10_000, 9.6) + [
                at(20_000, .willEnterForeground),
                at(20_100, .didBecomeActive, hotStart),
            ]),
        Scenario(
            name: "back in front after 25 s, active 10 s later (a lock screen): the same session, as the pages shown meanwhile",
            steps: coldLaunch + toBackground(10_000, 9.6) + [
                at(35_000, .willEnterForeground),
                at(45_000, .didBecomeActive, hotStart),
            ]),
        Scenario(
            name: "hot start after 40 s in the background: new session, before the first page shown",
            steps: coldLaunch + toBackground(10_000, 9.6) + [
                at(50_100, .willEnterForeground, [.newSession]),
                at(50_200, .didBecomeActive, hotStart),
            ]),
        Scenario(
            name: "back in front after 40 s, then in the background again, then active 40 s later without willEnterForeground: a new session each time",
            steps: coldLaunch + toBackground(10_000, 9.6) + [
                at(50_100, .willEnterForeground, [.newSession]),
                at(50_200, .didEnterBackground, [.pauseTimers, .flush]),
                at(90_300, .didBecomeActive, [.newSession] + hotStart),
            ]),
        Scenario(
            name: "notification centre pulled down and up: no $AppStart",
            steps: coldLaunch + [
                at(5000, .willResignActive), at(7000, .didBecomeActive),
            ] + toBackground(9000, 8.6)),
        Scenario(
            name: "control centre up and down: no $AppStart",
            steps: coldLaunch + [
                at(3000, .willResignActive), at(3300, .didBecomeActive), at(4000, .willResignActive),
                at(4100, .didBecomeActive),
            ]),
        Scenario(
            name: "app switcher, back to the same app: no $AppStart",
            steps: coldLaunch + [
                at(6000, .willResignActive), at(8000, .didBecomeActive),
            ]),
        Scenario(
            name: "app switcher, another app, then back",
            steps: coldLaunch + [
                at(6000, .willResignActive),
                at(9000, .didEnterBackground, [.appEnd(duration: 8.5, reason: .background), .pauseTimers, .flush]),
                at(12_000, .willEnterForeground),
                at(12_100, .didBecomeActive, hotStart),
            ]),
        Scenario(
            name: "background launch (fetch), then the user opens the app", launchedBefore: false,
            steps: [
                at(0, .didFinishLaunching(inBackground: true), [.newSession, .appStartPassively, .pauseTimers]),
                at(10_000, .willEnterForeground),
                at(
                    10_200, .didBecomeActive,
                    [.appStart(isFirstTime: true, resumeFromBackground: false), .resumeTimers, .resendPageView]),
            ]),
        Scenario(
            name: "background launch, opened 45 s later: new session",
            steps: [
                at(0, .didFinishLaunching(inBackground: true), [.newSession, .appStartPassively, .pauseTimers]),
                at(45_000, .willEnterForeground, [.newSession]),
                at(
                    45_100, .didBecomeActive,
                    [.appStart(isFirstTime: false, resumeFromBackground: false), .resumeTimers, .resendPageView]),
            ]),
        Scenario(
            name: "background launch, never opened: terminate without $AppEnd",
            steps: [
                at(0, .didFinishLaunching(inBackground: true), [.newSession, .appStartPassively, .pauseTimers]),
                at(20_000, .willTerminate, [.flush]),
            ]),
        Scenario(
            name: "terminate from the foreground",
            steps: coldLaunch + [
                at(30_500, .willTerminate, [.appEnd(duration: 30, reason: .terminate), .flush])
            ]),
        Scenario(
            name: "terminate after the background: one $AppEnd only",
            steps: coldLaunch + toBackground(10_000, 9.6) + [
                at(11_000, .willTerminate, [.flush])
            ]),
        Scenario(
            name: "crash in the foreground: $AppCrashed and the missing $AppEnd",
            steps: coldLaunch + [
                Step(atMillis: 12_500, input: .crash, expect: [.appCrashed, .appEnd(duration: 12, reason: .crash)])
            ]),
        Scenario(
            name: "crash in the background: $AppCrashed only (its $AppEnd was sent)",
            steps: coldLaunch + toBackground(10_000, 9.6) + [
                Step(atMillis: 15_000, input: .crash, expect: [.appCrashed])
            ]),
        Scenario(
            name: "$AppEnd after more than 24 h carries no duration",
            steps: coldLaunch + [
                at(
                    25 * 3_600_000, .didEnterBackground,
                    [.appEnd(duration: nil, reason: .background), .pauseTimers, .flush])
            ]),
        Scenario(
            name: "repeated signals are ignored",
            steps: coldLaunch + [
                at(600, .didBecomeActive), at(700, .didFinishLaunching(inBackground: false)),
                at(800, .willEnterForeground),
            ] + toBackground(1000, 0.6) + [at(1200, .didEnterBackground)]),
    ]

    @Test("lifecycle sequences", arguments: scenarios)
    func sequence(_ scenario: Scenario) {
        var machine = LifecycleMachine(hasLaunchedBefore: scenario.launchedBefore)
        for (i, step) in scenario.steps.enumerated() {
            let now = step.atMillis * 1_000_000
            let effects: [LifecycleEffect]
            switch step.input {
            case .signal(let signal):
                effects = machine.handle(signal, at: now)
            case .crash:
                effects = LifecycleMachine.crashEffects(
                    foreground: machine.isStarted, activeSince: machine.activeSince, crashedAt: now)
            }
            #expect(effects == step.expect, "step \(i) (\(step.input)) of \(scenario.name)")
        }
    }

    @Test("page views are visible only in front; the phase follows the signals")
    func visibility() {
        var machine = LifecycleMachine(hasLaunchedBefore: true)
        _ = machine.handle(.didFinishLaunching(inBackground: true), at: 0)
        #expect(!machine.pageViewsVisible && machine.phase == .background)
        _ = machine.handle(.willEnterForeground, at: 1)
        #expect(machine.pageViewsVisible && machine.phase == .inactive)
        _ = machine.handle(.didBecomeActive, at: 2)
        #expect(machine.phase == .active && machine.isStarted && machine.activeSince == 2)
    }

    @Test("session timeout is configurable")
    func sessionTimeout() {
        var machine = LifecycleMachine(hasLaunchedBefore: true, sessionTimeoutNanos: 5_000_000_000)
        _ = machine.handle(.didFinishLaunching(inBackground: false), at: 0)
        _ = machine.handle(.didBecomeActive, at: 1)
        _ = machine.handle(.didEnterBackground, at: 1_000_000_000)
        #expect(machine.handle(.didBecomeActive, at: 6_000_000_000).first == .newSession)
    }
}
