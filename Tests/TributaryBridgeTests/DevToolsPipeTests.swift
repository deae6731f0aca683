import Foundation
import Logging
import Synchronization
import Testing
import Tributary

#if canImport(Glibc)
    import Glibc
#endif

@testable import TributaryBridge

/// The DevTools pipe: how it splits the browser's stream into frames, and its end.
@Suite("DevTools pipe")
struct DevToolsPipeTests {
    /// A DevTools event of `method` on `session`.
    static func devtools(_ method: String, _ session: String, _ params: [String: JSON]) -> DevToolsMessage {
        DevToolsMessage(id: nil, method: method, sessionID: session, body: .object(params), error: nil)
    }

    /// A frame's default execution context created (its document loaded) with `origin`.
    static func contextCreated(_ id: Int, _ origin: String, frame: String, session: String = "s1") -> DevToolsMessage {
        devtools("Runtime.executionContextCreated", session, [
            "context": .object([
                "id": .number(Double(id)), "origin": .string(origin),
                "auxData": .object(["isDefault": .bool(true), "frameId": .string(frame)]),
            ])
        ])
    }

    /// A `Runtime.bindingCalled` frame as Chromium writes it around a page's `payload`, in the
    /// protocol's key order (`JSON.text` would sort the keys).
    static func bindingFrame(payload: String, context: Int, session: String) -> [UInt8] {
        let text =
            #"{"method":"Runtime.bindingCalled","params":{"name":"\#(WebViewHost.bindingName)","payload":"#
            + JSON.quoted(payload) + #","executionContextId":\#(context)},"sessionId":"\#(session)"}"#
        return Array(text.utf8) + [0]
    }

    @Test(
        "a frame over the bound is skipped up to its NUL in one pass, holding at most the bound; its neighbours arrive",
        arguments: [61, 4096, 65536])
    func oversizedFrame(chunkBytes: Int) throws {
        let bound = 1 << 20
        // The page's string holds what looks like the protocol's keys, escaped as every quote in a string is.
        let spoof = #""sessionId":"EVIL","executionContextId":99,"method":"Target.attachedToTarget""#
        let payload = spoof + String(repeating: "x", count: 10 << 20) + spoof
        let before = Array(#"{"id":1,"result":{}}"#.utf8) + [0]
        let huge = Self.bindingFrame(payload: payload, context: 7, session: "S1")
        let after = Array(#"{"method":"Page.frameAttached","params":{"frameId":"F"}}"#.utf8) + [0]
        let stream = before + huge + after

        var splitter = FrameSplitter(maxFrameBytes: bound)
        var frames: [FrameSplitter.Frame] = []
        var mostBuffered = 0
        var offset = 0
        while offset < stream.count {
            let end = min(offset + chunkBytes, stream.count)
            stream[offset..<end].withUnsafeBytes { splitter.consume($0) { frames.append($0) } }
            mostBuffered = max(mostBuffered, splitter.bufferedBytes)
            offset = end
        }
        #expect(mostBuffered <= bound, "the splitter held \(mostBuffered) bytes of one frame; the bound is \(bound)")
        #expect(splitter.scannedBytes == stream.count, "each byte is searched for the NUL once")
        try #require(frames.count == 3)
        guard case .complete(let first) = frames[0], case .tooLarge(let skipped) = frames[1],
            case .complete(let last) = frames[2]
        else {
            Issue.record("expected a frame, a skipped frame and a frame; got \(frames)")
            return
        }
        #expect(Array(first) == before.dropLast())
        #expect(Array(last) == after.dropLast())
        #expect(skipped.byteCount == huge.count - 1)
        #expect(skipped.string(after: #""method":""#) == "Runtime.bindingCalled")
        #expect(skipped.integer(after: #""executionContextId":"#) == 7, "the page's escaped keys are not read")
        #expect(skipped.string(after: #""sessionId":""#) == "S1")
    }

    @Test("a page's oversized binding call is refused as message_too_large; the page's next message arrives")
    func oversizedBindingCall() async throws {
        // 16 MiB of 'x', far over the bound (2 MiB and 64 KiB for the default 64 KiB messages).
        let page = BrowserHarness.posting(["'x'.repeat(16 << 20)", "event('AfterHuge')"])
        try await BrowserHarness.run(pages: ["/": page]) { harness in
            try await harness.wait(for: "both messages") { harness.bridge.snapshot.received.values.reduce(0, +) == 2 }
            try await harness.wait(for: "the event's commit") { harness.bridge.snapshot.accepted == 1 }
            #expect(harness.bridge.snapshot.received == [harness.origin: 2])
            #expect(harness.bridge.rejections == [.messageTooLarge: 1])
            #expect(try harness.tracker.store.status().pendingEvents == 1)
        }
    }

    // A page posting in a loop outruns the commits (one durable transaction per message): the queue
    // between the DevTools reader and the bridge grew without bound.
    @Test("a page flooding the bridge: what exceeds the queue bound is dropped unread and counted as overloaded")
    func floodingPage() async throws {
        let flood = "(function () { for (var i = 0; i < 3000; i++) h.sensorsdataNativeTracker.postMessage(event('Flood')); "
            + "return event('Last'); })()"
        try await BrowserHarness.run(pages: ["/": BrowserHarness.posting([flood])], configure: { $0.maxQueuedBytes = 64 << 10 }) {
            harness in
            // Every message is accounted for: committed, or refused (most of the flood, as overloaded).
            try await harness.wait(for: "all 3,001 messages handled") { harness.bridge.snapshot.handled == 3001 }
            let accepted = harness.bridge.snapshot.accepted
            let overloaded = harness.bridge.rejections[.overloaded] ?? 0
            #expect(overloaded > 0, "3,001 messages of about 300 bytes never exceeded 64 KiB waiting")
            #expect(accepted + overloaded == 3001 && accepted >= 100, "\(harness.bridge.snapshot)")
            #expect(try harness.tracker.store.status().pendingEvents == UInt64(accepted))
        }
    }

    /// `/proc/PID/stat`: the state letter, the parent's pid and the process group.
    static func stat(_ pid: pid_t) -> (state: Character, parent: pid_t, group: pid_t)? {
        guard let text = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
            let close = text.lastIndex(of: ")")
        else { return nil }
        let fields = text[text.index(after: close)...].split(separator: " ")
        guard fields.count > 2, let state = fields[0].first, let parent = pid_t(fields[1]), let group = pid_t(fields[2])
        else { return nil }
        return (state, parent, group)
    }

    /// Every process below `root`, from /proc.
    static func descendants(of root: pid_t) -> [pid_t] {
        let all = ((try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? []).compactMap { pid_t($0) }
        let parents = Dictionary(uniqueKeysWithValues: all.compactMap { pid in stat(pid).map { (pid, $0.parent) } })
        return all.filter { pid in
            var current = pid
            while let parent = parents[current], parent > 1 {
                if parent == root { return true }
                current = parent
            }
            return false
        }
    }

    /// Those of `pids` that still run (a zombie does not).
    static func running(_ pids: [pid_t]) -> [pid_t] { pids.filter { stat($0).map { $0.state != "Z" } ?? false } }

    @Test("the reader queues a page's binding calls and sensorsanalytics: navigations within the bound, the browser's events always, and nothing else")
    func admission() {
        func message(_ method: String, _ params: [String: JSON] = [:]) -> DevToolsMessage {
            DevToolsMessage(id: nil, method: method, sessionID: "s", body: .object(params), error: nil)
        }
        let queue = MessageQueueGauge(limit: 100)
        // A page can send these as fast as it likes; run() handles none of them.
        for noise in [
            message("Runtime.consoleAPICalled", ["args": .array([.object(["value": .string(String(repeating: "x", count: 1 << 20))])])]),
            message("Runtime.exceptionThrown"), message("Page.frameRequestedNavigation", ["url": .string("https://example.com/")]),
            message("Network.requestWillBeSent"), DevToolsMessage(id: 7, method: nil, sessionID: nil, body: .null, error: nil),
        ] {
            #expect(!WebViewHost.admit(noise, to: queue), "\(noise.method ?? "a reply") was queued")
        }
        for event in ["Target.attachedToTarget", DevToolsPipe.closedEvent] {
            #expect(WebViewHost.admit(message(event), to: queue))
        }
        // A frame over the limit only as a binding call, which the bridge refuses for its size.
        #expect(WebViewHost.admit(message(DevToolsPipe.frameTooLargeEvent, ["method": .string("Runtime.bindingCalled")]), to: queue))
        #expect(!WebViewHost.admit(message(DevToolsPipe.frameTooLargeEvent, ["method": .string("Runtime.consoleAPICalled")]), to: queue))
        // A legacy navigation counts its URL against the bound, as a binding call counts its payload.
        let legacy = message("Page.frameRequestedNavigation", ["url": .string("sensorsanalytics://trackEvent?event=" + String(repeating: "a", count: 40))])
        #expect(WebViewHost.admit(legacy, to: queue))
        #expect(WebViewHost.admit(message("Runtime.bindingCalled", ["payload": .string(String(repeating: "b", count: 20))]), to: queue))
        #expect(!WebViewHost.admit(legacy, to: queue), "past the bound")
        #expect(queue.takeDropped() == 1)

        // An empty queue takes a message larger than its bound: the bridge refuses it for its size.
        let empty = MessageQueueGauge(limit: 100)
        #expect(empty.admit(150))
        #expect(!empty.admit(1), "the queue holds 150 bytes of a 100-byte bound")
        empty.release(150)
        #expect(empty.admit(1))
    }

    @Test("the reader takes frame events in itself, never queued, and queues a page message with the origin it is credited with")
    func readerTakesFrameEvents() {
        func event(_ method: String, _ params: [String: JSON]) -> DevToolsMessage { Self.devtools(method, "s1", params) }
        let queue = MessageQueueGauge(limit: 1 << 20)
        let trusted: Set<String> = ["https://app.example"]
        var origins = FrameOrigins()
        var queued: [WebViewHost.Queued] = []
        func take(_ message: DevToolsMessage) {
            if let item = WebViewHost.take(message, origins: &origins, queue: queue, trusted: trusted) { queued.append(item) }
        }
        take(Self.contextCreated(1, "https://app.example", frame: "main"))
        // A page adding and removing iframes in a loop while run() waits on a commit: nothing piles up.
        for n in 2...1001 {
            take(event("Page.frameAttached", ["frameId": .string("f\(n)"), "parentFrameId": .string("main")]))
            take(Self.contextCreated(n, "https://ads.example", frame: "f\(n)"))
            take(event("Runtime.executionContextDestroyed", ["executionContextId": .number(Double(n))]))
            take(event("Page.frameDetached", ["frameId": .string("f\(n)"), "reason": .string("remove")]))
        }
        #expect(queued.isEmpty && origins.contexts.count == 1 && origins.frames.count == 1 && origins.parents.isEmpty)
        // Page messages: credited when read, against what the browser reported before them.
        take(event("Runtime.bindingCalled", ["name": .string(WebViewHost.bindingName), "executionContextId": .number(1), "payload": .string("{}")]))
        take(event("Page.frameAttached", ["frameId": .string("ad"), "parentFrameId": .string("main")]))
        take(Self.contextCreated(9, "https://ads.example", frame: "ad"))
        take(event("Runtime.bindingCalled", ["name": .string(WebViewHost.bindingName), "executionContextId": .number(9), "payload": .string("{}")]))
        take(event("Page.frameRequestedNavigation", ["frameId": .string("ad"), "url": .string("sensorsanalytics://trackEvent?event=E")]))
        take(event("Runtime.executionContextDestroyed", ["executionContextId": .number(9)]))
        take(event("Runtime.bindingCalled", ["name": .string(WebViewHost.bindingName), "executionContextId": .number(9), "payload": .string("{}")]))
        // The trusted page's message is queued; the foreign ones are counted, and the first queues one marker.
        #expect(queued.map(\.origin) == ["https://app.example", "null"])
        #expect(queued.last?.message.method == WebViewHost.foreignRefusedEvent)
        #expect(queue.takeForeign() == ["https://ads.example": 2, "null": 1])

        // A foreign frame posting as fast as it can: the trusted page's next message still finds room.
        let small = MessageQueueGauge(limit: 100)
        var markers = 0
        for _ in 0..<1000 {
            let flood = event("Runtime.bindingCalled", [
                "name": .string(WebViewHost.bindingName), "executionContextId": .number(9),
                "payload": .string(String(repeating: "x", count: 60)),
            ])
            _ = origins.record(Self.contextCreated(9, "https://ads.example", frame: "ad"))
            if WebViewHost.take(flood, origins: &origins, queue: small, trusted: trusted) != nil { markers += 1 }
        }
        let trustedMessage = event("Runtime.bindingCalled", [
            "name": .string(WebViewHost.bindingName), "executionContextId": .number(1), "payload": .string(String(repeating: "y", count: 60)),
        ])
        #expect(WebViewHost.take(trustedMessage, origins: &origins, queue: small, trusted: trusted)?.origin == "https://app.example")
        #expect(small.takeDropped() == 0 && markers == 1 && small.takeForeign() == ["https://ads.example": 1000])
    }

    @Test("a legacy navigation is credited only when the frame's own renderer (or, for a fresh iframe, its parent's) asked for it")
    func navigationFromAnotherRenderer() {
        func navigation(of frame: String, on session: String) -> DevToolsMessage {
            Self.devtools("Page.frameRequestedNavigation", session, [
                "frameId": .string(frame), "url": .string("sensorsanalytics://trackEvent?event=E"),
            ])
        }
        let trusted: Set<String> = ["https://app.example"]
        var origins = FrameOrigins()
        _ = origins.record(Self.contextCreated(1, "https://app.example", frame: "main", session: "s1"))
        _ = origins.record(Self.contextCreated(1, "https://evil.example", frame: "popup", session: "s2"))
        func credited(_ message: DevToolsMessage) -> String { WebViewHost.origin(of: message, in: origins, trusted: trusted) }
        // The page itself, and the legacy SDK's fresh iframe (no document yet) asked for by the page.
        #expect(credited(navigation(of: "main", on: "s1")) == "https://app.example")
        _ = origins.record(Self.devtools("Page.frameAttached", "s1", ["frameId": .string("fresh"), "parentFrameId": .string("main")]))
        #expect(credited(navigation(of: "fresh", on: "s1")) == "https://app.example")
        // A popup setting opener.location, or navigating a frame it does not run in: reported on its session.
        #expect(credited(navigation(of: "main", on: "s2")) == "null")
        #expect(credited(navigation(of: "fresh", on: "s2")) == "null")
        // A same-process foreign iframe setting top.location: the top frame's session hosts an untrusted frame.
        _ = origins.record(Self.devtools("Page.frameAttached", "s1", ["frameId": .string("ad"), "parentFrameId": .string("main")]))
        _ = origins.record(Self.contextCreated(2, "https://ads.example", frame: "ad", session: "s1"))
        #expect(credited(navigation(of: "main", on: "s1")) == "null")
    }

    @Test("a frame attached with an event too large to read keeps its parent link (or, unread, trusts no navigation of that session)")
    func oversizedFrameAttached() {
        func event(_ method: String, _ params: [String: JSON]) -> DevToolsMessage { Self.devtools(method, "s1", params) }
        let trusted: Set<String> = ["https://app.example"]
        let navigation = event("Page.frameRequestedNavigation", ["frameId": .string("child"), "url": .string("sensorsanalytics://trackEvent?event=E")])
        for readable in [true, false] {
            var origins = FrameOrigins()
            _ = origins.record(Self.contextCreated(1, "https://app.example", frame: "main"))
            _ = origins.record(event("Page.frameAttached", ["frameId": .string("ad"), "parentFrameId": .string("main")]))
            _ = origins.record(Self.contextCreated(2, "https://ads.example", frame: "ad"))
            // The ad appends a trusted page with a huge creation stack (a long script URL, deep recursion).
            var skipped: [String: JSON] = ["bytes": .number(3e6), "method": .string("Page.frameAttached")]
            if readable { skipped.merge(["frameId": .string("child"), "parentFrameId": .string("ad")]) { $1 } }
            let taken = origins.record(event(DevToolsPipe.frameTooLargeEvent, skipped))
            #expect(taken)
            _ = origins.record(Self.contextCreated(3, "https://app.example", frame: "child"))
            let origin = WebViewHost.origin(of: navigation, in: origins, trusted: trusted)
            #expect(origin == (readable ? "https://ads.example" : "null"), "readable: \(readable)")
        }
    }

    @Test("ids out of range in the browser's messages are no ids, not a trap")
    func hugeNumbers() {
        var origins = FrameOrigins()
        let huge = Self.devtools(
            "Runtime.executionContextCreated", "s1", ["context": .object(["id": .number(1e19), "origin": .string("https://app.example")])])
        let recorded = origins.record(huge)
        #expect(recorded && origins.contexts.isEmpty)
        for id: JSON in [.integer(.max), .number(1e300), .number(1.5)] {
            let binding = Self.devtools("Runtime.bindingCalled", "s1", ["executionContextId": id])
            #expect(WebViewHost.origin(of: binding, in: origins, trusted: []) == "null")
        }
    }

    @Test("frame origins: contexts and frames are forgotten when the browser says they are gone, and only then")
    func frameOrigins() {
        var origins = FrameOrigins()
        // A page that keeps adding and removing iframes: nothing stays of the ones gone.
        let recorded = origins.record(Self.contextCreated(1, "https://app.example", frame: "main"))
        #expect(recorded)
        for n in 2...51 {
            _ = origins.record(Self.devtools("Page.frameAttached", "s1", ["frameId": .string("f\(n)"), "parentFrameId": .string("main")]))
            _ = origins.record(Self.contextCreated(n, "https://ads.example", frame: "f\(n)"))
            #expect(origins.context(n, session: "s1") == "https://ads.example")
            _ = origins.record(Self.devtools("Runtime.executionContextDestroyed", "s1", ["executionContextId": .number(Double(n))]))
            _ = origins.record(Self.devtools("Page.frameDetached", "s1", ["frameId": .string("f\(n)"), "reason": .string("remove")]))
        }
        #expect(origins.contexts.count == 1 && origins.frames.count == 1 && origins.parents.isEmpty)
        #expect(origins.context(2, session: "s1") == "null")
        // A frame swapped into a process of its own lives on: its parent is kept.
        _ = origins.record(Self.devtools("Page.frameAttached", "s1", ["frameId": .string("oopif"), "parentFrameId": .string("main")]))
        _ = origins.record(Self.devtools("Page.frameDetached", "s1", ["frameId": .string("oopif"), "reason": .string("swap")]))
        #expect(origins.parents["oopif"] == "main")
        // A child target's contexts go with it; a navigation clears the session's.
        _ = origins.record(Self.contextCreated(1, "https://ads.example", frame: "oopif", session: "s2"))
        _ = origins.record(Self.devtools("Target.detachedFromTarget", "s1", ["sessionId": .string("s2")]))
        #expect(origins.context(1, session: "s2") == "null" && origins.context(1, session: "s1") == "https://app.example")
        _ = origins.record(Self.devtools("Runtime.executionContextsCleared", "s1", [:]))
        #expect(origins.contexts.isEmpty)
        // A tab closed (its target detached) takes its frames along: it sends no frameDetached for them. The
        // frame it ran out of process for stays the parent's child, as the parent session recorded it.
        _ = origins.record(Self.contextCreated(1, "https://tab.example", frame: "tab", session: "s3"))
        _ = origins.record(Self.devtools("Page.frameAttached", "s3", ["frameId": .string("tab-child"), "parentFrameId": .string("tab")]))
        _ = origins.record(Self.contextCreated(2, "https://tab.example", frame: "tab-child", session: "s3"))
        _ = origins.record(Self.contextCreated(1, "https://ads.example", frame: "oopif", session: "s4"))
        #expect(origins.frames["tab"] != nil && origins.frames["tab-child"] != nil && origins.parents["tab-child"] == "tab")
        _ = origins.record(Self.devtools("Target.detachedFromTarget", "", ["sessionId": .string("s3")]))
        _ = origins.record(Self.devtools("Target.detachedFromTarget", "s1", ["sessionId": .string("s4")]))
        #expect(origins.frames["tab"] == nil && origins.frames["tab-child"] == nil && origins.parents["tab-child"] == nil)
        #expect(origins.frames["oopif"] == nil && origins.parents["oopif"] == "main" && origins.frames["main"] == "https://app.example")
        let binding = origins.record(Self.devtools("Runtime.bindingCalled", "s1", [:]))
        #expect(!binding, "not an event of its own")
    }

    @Test("the browser leads a process group its helpers share: a stop ends them all at once, and its profile stays removed")
    func stopEndsHelpers() async throws {
        let browser = try ChromiumProcess()
        defer { browser.terminate() }
        let pipe = DevToolsPipe(browser: browser, maxFrameBytes: 1 << 20) { _ in }
        _ = try await pipe.call("Browser.getVersion")
        let helpers = Self.descendants(of: browser.pid)
        #expect(!helpers.isEmpty, "the browser has helper processes")
        #expect(Self.stat(browser.pid)?.group == browser.pid, "the browser leads no process group of its own")
        #expect(helpers.allSatisfy { Self.stat($0)?.group == browser.pid }, "a helper left the browser's process group")
        browser.terminate()
        // At once (the second a SIGKILLed process may take to go, on a loaded machine), not once they notice
        // the browser has gone: they wrote into the removed profile meanwhile.
        for _ in 0..<40 where !Self.running(helpers).isEmpty { try await Task.sleep(for: .milliseconds(25)) }
        #expect(Self.running(helpers).isEmpty, "helpers outlived the stop: \(Self.running(helpers))")
        try await Task.sleep(for: .milliseconds(500))
        #expect(!FileManager.default.fileExists(atPath: browser.userDataDirectory), "the profile came back")
    }

    @Test("a command sent without waiting that the browser refuses is logged as a warning, with its name and the browser's error")
    func failedCommandLogged() async throws {
        let browser = try ChromiumProcess()
        defer { browser.terminate() }
        let captured = CapturedLogs()
        let pipe = DevToolsPipe(browser: browser, maxFrameBytes: 1 << 20, logger: Logger(label: "test") { _ in captured }) { _ in }
        pipe.send("Runtime.noSuchCommand")
        pipe.send("Browser.getVersion")
        // Replies come in order: once a call is answered, both sends were.
        _ = try await pipe.call("Browser.getVersion")
        let warnings = captured.store.lines.withLock { $0 }
        #expect(warnings.count == 1, "\(warnings)")
        #expect(warnings.first?.contains("DevTools command failed") == true && warnings.first?.contains("Runtime.noSuchCommand") == true)
    }

    @Test("a killed browser: commands throw browserExited and this process lives on; after the stop none is written")
    func killedBrowser() async throws {
        let browser = try ChromiumProcess()
        defer { browser.terminate() }
        let (ends, end) = AsyncStream.makeStream(of: Void.self)
        let pipe = DevToolsPipe(browser: browser, maxFrameBytes: 1 << 20) { message in
            if message.method == DevToolsPipe.closedEvent { end.finish() }
        }
        _ = try await pipe.call("Browser.getVersion")
        let helpers = Self.descendants(of: browser.pid)
        kill(browser.pid, SIGKILL)
        for await _ in ends {}  // the reader saw the browser's end of the pipes close: it is gone

        // Nobody reads the command pipe now: a write fails with EPIPE and raises SIGPIPE, whose
        // default action would end this test process.
        pipe.send("Browser.getVersion")
        let written = #expect(throws: BrowserError.self) { try browser.commands.write(Array("{}".utf8) + [0]) }
        #expect(written?.code == .browserExited)
        let called = await #expect(throws: BrowserError.self) { try await pipe.call("Browser.getVersion") }
        #expect(called?.code == .browserExited)

        // Stopped: the fd is closed, and its number may be another file's by now; nothing is written to it.
        browser.terminate()
        let stopped = #expect(throws: BrowserError.self) { try browser.commands.write(Array("{}".utf8) + [0]) }
        #expect(stopped?.code == .browserExited)
        #expect(stopped?.message.contains("was stopped") == true, "\(String(describing: stopped))")
        // Its helpers (renderers, the zygote) went with it: none still runs (a zombie waits for init only).
        let clock = ContinuousClock()
        let began = clock.now
        while !Self.running(helpers).isEmpty, clock.now - began < .seconds(10) { try await Task.sleep(for: .milliseconds(50)) }
        #expect(!helpers.isEmpty, "the browser had helper processes to leave behind")
        #expect(Self.running(helpers).isEmpty, "helpers of the browser outlived it: \(Self.running(helpers))")
    }

    // A browser that hangs (stuck at start, or an executable that is no Chromium) held open() for ever;
    // and stopping it closed the command pipe first, whose lock a write blocked on the full pipe held.
    @Test("a browser that never answers: a call times out, and the stop ends it while a write to it is blocked",
          .timeLimit(.minutes(1)))
    func hungBrowser() async throws {
        try await Self.withSilentBrowser { browser in
            let pipe = DevToolsPipe(browser: browser, maxFrameBytes: 1 << 20) { _ in }
            let error = await #expect(throws: BrowserError.self) {
                try await pipe.call("Browser.getVersion", timeout: .milliseconds(300))
            }
            #expect(error?.code == .timedOut)

            // 1 MiB nobody reads: the write fills the pipe and blocks, holding the pipe's lock.
            let writeEnded = DispatchSemaphore(value: 0)
            Thread.detachNewThread {
                try? browser.commands.write([UInt8](repeating: 0x20, count: 1 << 20))
                writeEnded.signal()
            }
            try await Task.sleep(for: .milliseconds(200))
            let clock = ContinuousClock()
            let began = clock.now
            browser.terminate()
            #expect(clock.now - began < .seconds(10), "the stop waited on the blocked write")
            #expect(writeEnded.wait(timeout: .now() + 10) == .success, "the blocked write never ended")
            #expect(kill(browser.pid, 0) != 0, "the browser still runs")
        }
    }
}

extension DevToolsPipeTests {
    /// `spawn` of a script just written, tried again while exec says ETXTBSY: a process another test
    /// forks meanwhile inherits the write descriptor of the script's temporary file until it execs
    /// itself (Go's os/exec tests retry the same way).
    static func spawnFreshScript<T>(_ spawn: () throws -> T) async throws -> T {
        for _ in 0..<50 {
            do {
                return try spawn()
            } catch let error as BrowserError where "\(error)".contains("Text file busy") {
                try await Task.sleep(for: .milliseconds(20))
            }
        }
        return try spawn()
    }

    /// Runs `body` with a "browser" that starts and never reads its commands nor answers (a shell
    /// sleeping), stopped afterwards.
    static func withSilentBrowser(_ body: (ChromiumProcess) async throws -> Void) async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("tributary-silent-\(UUID())").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let fake = directory + "/chromium"
        try "#!/bin/sh\nexec sleep 600\n".write(toFile: fake, atomically: true, encoding: .utf8)
        chmod(fake, 0o755)
        let browser = try await spawnFreshScript { try ChromiumProcess(executable: fake) }
        defer { browser.terminate() }
        try await body(browser)
    }

    // The caller wrote each command itself: one to a browser that stopped reading blocked the caller's
    // thread (a Swift concurrency thread, for the host's run loop) until the browser was stopped, and
    // a call's timeout could not end its own write.
    @Test("a browser that stops reading: commands are sent without blocking, a call still times out, and what waits is bounded",
          .timeLimit(.minutes(1)))
    func browserNotReading() async throws {
        try await Self.withSilentBrowser { browser in
            let logs = CapturedLogs()
            let pipe = DevToolsPipe(browser: browser, maxFrameBytes: 1 << 20, logger: Logger(label: "test") { _ in logs }) { _ in }

            // 1 MiB, more than the pipe holds: its write blocks for as long as the browser does not read.
            let big: [String: JSON] = ["expression": .string(String(repeating: " ", count: 1 << 20))]
            let sent = DispatchSemaphore(value: 0)
            Thread.detachNewThread {
                pipe.send("Runtime.evaluate", big)
                pipe.send("Runtime.evaluate", big)
                sent.signal()
            }
            #expect(sent.wait(timeout: .now() + 15) == .success, "send blocked on a browser that does not read")

            // Raced against 15 s (a loaded machine delays the call's 300 ms timeout by seconds), so that a
            // call stuck in its write fails the test instead of hanging it: the browser is then stopped,
            // which ends the write.
            let first = await withTaskGroup(of: String.self) { race in
                race.addTask {
                    do {
                        _ = try await pipe.call("Browser.getVersion", timeout: .milliseconds(300))
                        return "answered"
                    } catch let error as BrowserError {
                        return "\(error.code)"
                    } catch {
                        return "\(error)"
                    }
                }
                race.addTask {
                    try? await Task.sleep(for: .seconds(15))
                    return "still waiting"
                }
                let first = await race.next() ?? ""
                if first == "still waiting" { browser.terminate() }
                race.cancelAll()
                return first
            }
            #expect(first == "timedOut", "the call blocked on a browser that does not read")

            // Past the bound, a command fails at once: a call throws, a send is logged.
            let huge: [String: JSON] = ["expression": .string(String(repeating: " ", count: DevToolsPipe.maxQueuedCommandBytes))]
            let refused = await #expect(throws: BrowserError.self) {
                try await pipe.call("Runtime.evaluate", huge, timeout: .seconds(30))
            }
            #expect(refused?.code == .timedOut && refused?.message.contains("has not read") == true, "\(String(describing: refused))")
            pipe.send("Runtime.evaluate", huge)
            #expect(pipe.unansweredCount == 2, "the two 1 MiB sends wait; the refused one is forgotten")
            let lines = logs.store.lines.withLock { $0 }
            #expect(lines.contains { $0.hasPrefix("warning DevTools command not sent") && $0.contains("has not read") }, "\(lines)")
        }
    }
}

/// A log handler that keeps every line it is given (level, message and metadata).
struct CapturedLogs: LogHandler, Sendable {
    final class Lines: Sendable {
        let lines = Mutex<[String]>([])
    }

    let store = Lines()
    var metadata: Logger.Metadata = [:]
    var logLevel: Logger.Level = .trace

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    func log(event: LogEvent) {
        store.lines.withLock { $0.append("\(event.level) \(event.message) \(event.metadata ?? [:])") }
    }
}
