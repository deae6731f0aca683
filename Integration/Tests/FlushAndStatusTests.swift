import Foundation
import Testing
import TributaryCollector
import TributaryStore
import TributaryTestSupport

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// Flush requests, status reporting and metrics of a running agent process.
@Suite("Flush, status and metrics", .serialized)
struct FlushAndStatusTests {
    @Test("beside a producer appending every millisecond, a flush ends below the bulk size: requests carry about that many events")
    func flushEndsUnderTrickle() async throws {
        try await withTemporaryGroup { group in
            try await Collector.withRunning(CollectorConfiguration()) { collector in
                let producer = try ChildProcess("tributary-sim", ["load", "--group", group, "--count", "1000000", "--interval-ms", "1"])
                let agent = try ChildProcess("tributary-agent", [
                    "--group", group, "--server", collector.url + "/sa", "--outbox", group + "-state/outbox.sqlite",
                    "--bulk-size", "100", "--flush-interval", "600", "--log-level", "warning",
                ])
                // Until 600 events are delivered (about 1.5 s on an idle machine; the bound is for a loaded
                // one, where the producer itself runs slower).
                _ = try await HybridBrowserTests.delivered(collector, count: 600, within: 30)
                agent.send(SIGTERM)
                #expect(await agent.finish().status == 0)
                producer.send(SIGKILL)
                await producer.finish()
                // A flush that went on until it found the outbox empty (never, beside this producer) sent a
                // request every 5 or so events (973 requests for 4,511 events in 6 s); one that ends below the
                // bulk size sends about 100 a time (57 for 5,052). The SIGTERM flush may add a smaller one.
                let stats = try await collector.stats()
                #expect(stats.unique > 500, "\(stats.unique) events delivered")
                #expect(stats.batches > 0 && stats.received / stats.batches >= 40,
                        "\(stats.batches) requests for \(stats.received) events")
            }
        }
    }

    @Test("tributary flush wakes an idle agent at once; status and metrics show the deliveries")
    func flushWakesAgent() async throws {
        try await withTemporaryGroup { group in
            try await Collector.withRunning(CollectorConfiguration()) { collector in
                let metricsPort = try freeLoopbackPort()
                let notify = try NotifySocket(path: group + "-notify")
                let agent = try ChildProcess("tributary-agent", [
                    "--group", group, "--server", collector.url + "/sa", "--outbox", group + "-state/outbox.sqlite",
                    "--bulk-size", "1000", "--flush-interval", "600", "--log-level", "warning",
                    "--metrics-address", "127.0.0.1:\(metricsPort)",
                ], environment: ["NOTIFY_SOCKET": notify.path])
                // `tributary flush` needs the agent's socket: it is bound before READY=1.
                #expect(await notify.wait(for: "READY=1", timeout: 30) != nil, "the agent never sent READY=1")
                let produce = try await ChildProcess.run("tributary-sim", ["load", "--group", group, "--count", "25"])
                #expect(produce.status == 0)
                // Below the bulk size and long before the interval: nothing is uploaded yet.
                try await Task.sleep(for: .milliseconds(600))
                #expect(try await collector.stats().unique == 0)

                let flush = try await ChildProcess.run("tributary", ["flush", "--group", group])
                #expect(flush.status == 0, "\(flush.stderr)")
                // From the moment the request was sent. The bound is 200 times shorter than the flush
                // interval yet loose enough for a loaded 2-core machine running other suites beside this one.
                let flushedAt = Date()
                var unique = 0
                while unique < 25 && Date().timeIntervalSince(flushedAt) < 10 {
                    unique = try await collector.stats().unique
                    try await Task.sleep(for: .milliseconds(10))
                }
                #expect(unique == 25)
                // 60 times shorter than the interval: a flush that waited for it would take 600 s.
                #expect(Date().timeIntervalSince(flushedAt) < 10, "a flush must not wait for the 600 s interval")

                // The status file is written once a second: read it until it shows the deliveries, idle.
                var agentStatus: [String: Any] = [:]
                let readFrom = Date()
                repeat {
                    let status = try await ChildProcess.run("tributary", ["status", "--group", group, "--json"])
                    let json = try JSONSerialization.jsonObject(with: Data(status.stdout.utf8)) as? [String: Any]
                    agentStatus = json?["agent"] as? [String: Any] ?? [:]
                    if agentStatus["delivered"] as? Int == 25, agentStatus["state"] as? String == "idle" { break }
                    try await Task.sleep(for: .milliseconds(200))
                } while Date().timeIntervalSince(readFrom) < 30
                #expect(agentStatus["delivered"] as? Int == 25)
                #expect(agentStatus["state"] as? String == "idle")
                #expect(agentStatus["outbox_bytes"] as? Int == 0 && agentStatus["dead_letter_bytes"] as? Int == 0)
                #expect(agentStatus["outbox_quota"] as? Int == 512 << 20)
                let text = try await ChildProcess.run("tributary", ["status", "--group", group])
                #expect(text.stdout.contains("agent:          idle"))
                #expect(text.stdout.contains("  bytes:        0 pending + 0 dead letters of a 536870912 quota\n"), "\(text.stdout)")

                let url = try #require(URL(string: "http://127.0.0.1:\(metricsPort)/metrics"))
                let (data, _) = try await URLSession.shared.data(from: url)
                let metrics = String(decoding: data, as: UTF8.self)
                #expect(metrics.contains("tributary_events_uploaded_total 25"), "\(metrics)")
                #expect(metrics.contains("tributary_events_drained_total 25"))

                agent.send(SIGTERM)
                #expect(await agent.finish().status == 0)
                #expect(AgentChannel.readStatus(groupDirectory: group)?.state == "stopped")
                let noAgent = try await ChildProcess.run("tributary", ["flush", "--group", group])
                #expect(noAgent.status == 69)
            }
        }
    }

    @Test("tributary_events_drained_total counts the events new to the outbox, not those a crash left in both the outbox and the store")
    func drainedCountAfterCrash() async throws {
        try await withTemporaryGroup { group in
            try await Collector.withRunning(CollectorConfiguration()) { collector in
                #expect(try await ChildProcess.run("tributary-sim", ["load", "--group", group, "--count", "30"]).status == 0)
                let arguments = ["--group", group, "--server", collector.url + "/sa", "--outbox", group + "-state/outbox.sqlite", "--log-level", "warning"]
                // Killed after the outbox commit, before the store delete: the 30 are in both.
                let crashed = try await ChildProcess.run(
                    "tributary-agent", arguments + ["--once"], environment: ["TRIBUTARY_CRASH_AT": "drain.after-outbox-commit"])
                #expect(crashed.status == 9, "\(crashed.stderr)")
                #expect(try await ChildProcess.run("tributary-sim", ["load", "--group", group, "--count", "5"]).status == 0)
                let metricsPort = try freeLoopbackPort()
                let agent = try ChildProcess(
                    "tributary-agent", arguments + ["--flush-interval", "0.2", "--metrics-address", "127.0.0.1:\(metricsPort)"])
                let limit = agent.killAfter(.seconds(60))
                defer { limit.cancel() }
                _ = try await HybridBrowserTests.delivered(collector, count: 35, within: 30)
                let url = try #require(URL(string: "http://127.0.0.1:\(metricsPort)/metrics"))
                // The agent counts an upload once it has taken the collector's answer in: a moment after the collector.
                let metrics = try await Self.scrape(url, within: 10) { Self.sample($0, "tributary_events_uploaded_total") == 35 }
                #expect(Self.sample(metrics, "tributary_events_drained_total") == 5, "\(metrics)")
                #expect(Self.sample(metrics, "tributary_events_uploaded_total") == 35)
                agent.send(SIGTERM)
                #expect(await agent.finish().status == 0)
            }
        }
    }

    /// The agent's own backoff is long (`--backoff-base 3600`: a first wait of 0–3600 s), so what ends it early
    /// is the flush alone.
    @Test(
        "a flush request cuts short the agent's own backoff, not a wait the collector asked for with Retry-After",
        arguments: [("30", false), ("0", true)])
    func flushAndRetryAfter(retryAfter: String, retriesAtOnce: Bool) async throws {
        try await withTemporaryGroup { group in
            let faults = FaultConfiguration(retryAfter: retryAfter, forcedStatus: 429)
            try await Collector.withRunning(CollectorConfiguration(faults: faults)) { collector in
                let agent = try await Self.agentInBackoff(group, collector, stopTimeout: 2)
                // Every producer entering the background sends one: each was answered with a request at
                // once, whatever the 429 said. Retry-After: 0 asks for no wait: the backoff is the agent's.
                for _ in 0..<3 {
                    #expect(try await ChildProcess.run("tributary", ["flush", "--group", group]).status == 0)
                }
                try await Task.sleep(for: .seconds(2))
                let requests = try await collector.stats().requests
                if retriesAtOnce {
                    #expect(requests >= 2, "a flush request did not cut short the agent's own backoff (Retry-After: 0)")
                } else {
                    #expect(requests == 1, "a flush request retried before Retry-After: \(retryAfter)")
                }
                agent.send(SIGTERM)
                #expect(await agent.finish().status == 0)
            }
        }
    }

    @Test("a SIGTERM during the agent's own backoff sends at once; a collector still failing ends the stop")
    func stopCutsOwnBackoff() async throws {
        try await withTemporaryGroup { group in
            try await Collector.withRunning(CollectorConfiguration(faults: FaultConfiguration(forcedStatus: 503))) { collector in
                // A first wait of 0–3600 s after the 503 (full jitter: below 2 s once in 1,800 runs): the stop
                // comes during it.
                let agent = try await Self.agentInBackoff(group, collector, stopTimeout: 20)
                let limit = agent.killAfter(.seconds(60))
                defer { limit.cancel() }
                // The outage is over: the stop's one attempt delivers everything.
                try await collector.setFaults(.none)
                let stopped = ContinuousClock.now
                agent.send(SIGTERM)
                let run = await agent.finish()
                #expect(run.status == 0, "\(run.stderr)")
                #expect(try #require(agent.exitedAt) - stopped < .seconds(2 + DeadlineTests.exitSlack))
                #expect(try await collector.stats().unique == 5, "the stop did not try again after the agent's own backoff")
            }
        }
    }

    @Test("a metrics scraper that stops reading does not hold the agent past its stop timeout")
    func stuckScraperDoesNotHoldStop() async throws {
        try await withTemporaryGroup { group in
            let port = try freeLoopbackPort()
            let notify = try NotifySocket(path: group + "-notify")
            let agent = try ChildProcess(
                "tributary-agent",
                [
                    "--group", group, "--server", "http://127.0.0.1:9/sa", "--outbox", group + "-state/outbox.sqlite",
                    "--metrics-address", "127.0.0.1:\(port)", "--stop-timeout", "3", "--log-level", "warning",
                ], environment: ["NOTIFY_SOCKET": notify.path])
            #expect(await notify.wait(for: "READY=1", timeout: 30) != nil, "the agent never sent READY=1")
            // Pipelined requests whose answers are never read: the server's writes back up, and its
            // graceful shutdown waits for them. The server starts beside the agent's loop, so it may be
            // listening a moment after READY=1.
            var scraper: Int32 = -1
            let connecting = ContinuousClock.now
            while scraper < 0 && ContinuousClock.now - connecting < .seconds(30) {
                let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
                var small: Int32 = 4096
                setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, socklen_t(MemoryLayout<Int32>.size))
                var address = sockaddr_in()
                address.sin_family = sa_family_t(AF_INET)
                address.sin_port = in_port_t(UInt16(port).bigEndian)
                address.sin_addr.s_addr = inet_addr("127.0.0.1")
                let connected = withUnsafePointer(to: &address) { p in
                    p.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
                }
                if connected == 0 {
                    scraper = fd
                } else {
                    close(fd)
                    try await Task.sleep(for: .milliseconds(20))
                }
            }
            defer { if scraper >= 0 { close(scraper) } }
            try #require(scraper >= 0, "cannot connect to the metrics endpoint")
            _ = fcntl(scraper, F_SETFL, fcntl(scraper, F_GETFL) | O_NONBLOCK)
            let request = Array("GET /metrics HTTP/1.1\r\nHost: agent\r\n\r\n".utf8)
            var sent = 0
            for _ in 0..<20_000 {
                guard send(scraper, request, request.count, Int32(MSG_NOSIGNAL)) == request.count else { break }
                sent += 1
            }
            try await Task.sleep(for: .seconds(1))  // the server answers until its writes back up
            let stopped = ContinuousClock.now
            agent.send(SIGTERM)
            // The scraper is closed only after the agent's exit: an agent it holds would wait for ever.
            let limiter = agent.killAfter(.seconds(20))
            defer { limiter.cancel() }
            let exit = await agent.finish()
            let took = try #require(agent.exitedAt) - stopped
            #expect(exit.status == 0, "\(exit.stderr)")
            // The stop timeout (3 s) and the exit slack of the deadline tests; before, the agent's stop
            // began only once the metrics server had shut down: when the scraper went away.
            #expect(took < .seconds(3 + DeadlineTests.exitSlack), "SIGTERM to exit took \(took) (\(sent) requests pipelined)")
        }
    }

    @Test("while a request is out the status file stays fresh and says uploading, then stopping once a stop is asked for; the request's failure ends the stop")
    func statusDuringRequest() async throws {
        try await withTemporaryGroup { group in
            // Every request hangs until the agent gives it up (its 4 s timeout).
            try await Collector.withRunning(CollectorConfiguration(faults: FaultConfiguration(hangRate: 1))) { collector in
                let agent = try ChildProcess("tributary-agent", [
                    "--group", group, "--server", collector.url + "/sa", "--outbox", group + "-state/outbox.sqlite",
                    "--bulk-size", "1", "--request-timeout", "4", "--stop-timeout", "30", "--log-level", "warning",
                ])
                #expect(try await ChildProcess.run("tributary-sim", ["load", "--group", group, "--count", "5"]).status == 0)
                try await Self.awaitFirstRequest(collector)
                let requestOut = Date()
                /// The status's state and age once the request has been out for `after` seconds.
                func status(after: Double) async throws -> (state: String?, age: Int64) {
                    try await Task.sleep(for: .seconds(max(0, after - Date().timeIntervalSince(requestOut))))
                    let status = AgentChannel.readStatus(groupDirectory: group)
                    return (status?.state, BootClock.wallMillis() - (status?.updatedMillis ?? 0))
                }
                // Rewritten every second: about 1 s old at most (1.5 s more for a loaded machine; without
                // the rewrites it still said the state before the request).
                let uploading = try await status(after: 1.8)
                #expect(uploading.state == "uploading" && uploading.age < 2500, "\(uploading)")
                agent.send(SIGTERM)
                let stopping = try await status(after: 3.4)
                #expect(stopping.state == "stopping" && stopping.age < 2500, "\(stopping)")
                let result = await agent.finish()
                // The request out when the stop came was its attempt: its failure (at 4 s) ends the stop,
                // with no second request.
                #expect(result.status == 0, "\(result.stderr)")
                #expect(Date().timeIntervalSince(requestOut) < 4 + DeadlineTests.exitSlack)
                #expect(try await collector.stats().requests == 1)
                #expect(AgentChannel.readStatus(groupDirectory: group)?.state == "stopped")
            }
        }
    }

    /// Waits (30 s at most) for the collector's first request, and expects exactly one.
    static func awaitFirstRequest(_ collector: RunningCollector) async throws {
        let start = Date()
        while try await collector.stats().requests == 0 && Date().timeIntervalSince(start) < 30 {
            try await Task.sleep(for: .milliseconds(20))
        }
        #expect(try await collector.stats().requests == 1, "the first upload never came")
    }

    /// An agent with a long backoff of its own (a first wait of 0–3600 s), 5 events stored and its first
    /// request sent and answered.
    static func agentInBackoff(_ group: String, _ collector: RunningCollector, stopTimeout: Int) async throws -> ChildProcess {
        let agent = try ChildProcess("tributary-agent", [
            "--group", group, "--server", collector.url + "/sa", "--outbox", group + "-state/outbox.sqlite",
            "--bulk-size", "1", "--flush-interval", "600", "--backoff-base", "3600", "--backoff-cap", "3600",
            "--stop-timeout", "\(stopTimeout)", "--log-level", "warning",
        ])
        #expect(try await ChildProcess.run("tributary-sim", ["load", "--group", group, "--count", "5"]).status == 0)
        try await awaitFirstRequest(collector)
        // Its answer applied (the status file says so within a second): a stop that comes while the request
        // is still being handled takes it for the stop's one attempt, not a wait of the agent's own.
        let answered = ContinuousClock.now
        while AgentChannel.readStatus(groupDirectory: group)?.state != "backoff" && ContinuousClock.now - answered < .seconds(10) {
            try await Task.sleep(for: .milliseconds(20))
        }
        #expect(AgentChannel.readStatus(groupDirectory: group)?.state == "backoff")
        return agent
    }

    /// Scrapes `url` every 100 ms until `done` holds of the metrics text or `seconds` have passed; returns
    /// the last text.
    static func scrape(_ url: URL, within seconds: Double, until done: (String) -> Bool) async throws -> String {
        var metrics = ""
        let began = Date()
        repeat {
            try await Task.sleep(for: .milliseconds(100))
            if let (data, _) = try? await URLSession.shared.data(from: url) { metrics = String(decoding: data, as: UTF8.self) }
        } while !done(metrics) && Date().timeIntervalSince(began) < seconds
        return metrics
    }

    /// One sample's value in Prometheus' text format (`name value`), or nil.
    static func sample(_ metrics: String, _ name: String) -> Double? {
        metrics.split(separator: "\n").lazy.compactMap { line -> Double? in
            let parts = line.split(separator: " ")
            return parts.count == 2 && parts[0] == name ? Double(parts[1]) : nil
        }.first
    }

    @Test("metrics and STATUS=: requests, retries and dead letters as the collector answered them; backlog and batch latency")
    func metricsMatchCollector() async throws {
        try await withTemporaryGroup { group in
            // Seeded: some requests answered 503 (retried), and one poison event refused with 422 (dead-lettered).
            let faults = FaultConfiguration(
                seed: 7, failureRate: 0.3, failureStatus: 503, retryAfter: "0", poisonPattern: "^Poison$", poisonStatus: 422)
            try await Collector.withRunning(CollectorConfiguration(faults: faults)) { collector in
                #expect(try await ChildProcess.run("tributary-sim", ["load", "--group", group, "--count", "40"]).status == 0)
                #expect(try await ChildProcess.run("tributary", ["track", "--create", "--group", group, "Poison"]).status == 0)
                let metricsPort = try freeLoopbackPort()
                let notify = try NotifySocket(path: group + "-notify")
                let agent = try ChildProcess(
                    "tributary-agent",
                    [
                        "--group", group, "--server", collector.url + "/sa", "--outbox", group + "-state/outbox.sqlite",
                        "--batch-size", "10", "--flush-interval", "0.1", "--backoff-base", "0.01", "--backoff-cap", "0.05",
                        "--log-level", "error", "--metrics-address", "127.0.0.1:\(metricsPort)",
                    ], environment: ["NOTIFY_SOCKET": notify.path])
                let url = try #require(URL(string: "http://127.0.0.1:\(metricsPort)/metrics"))
                // Until everything is answered: 40 delivered, the poison dead-lettered, nothing queued.
                let metrics = try await Self.scrape(url, within: 60) { metrics in
                    Self.sample(metrics, "tributary_events_uploaded_total") == 40
                        && Self.sample(metrics, "tributary_dead_letters_total") == 1
                        && Self.sample(metrics, "tributary_backlog_events") == 0
                }
                let stats = try await collector.stats()
                #expect(stats.unique == 40)
                #expect(Self.sample(metrics, "tributary_events_drained_total") == 41, "\(metrics)")
                #expect(Self.sample(metrics, "tributary_dead_letters_total") == 1)
                #expect(Self.sample(metrics, "tributary_backlog_events") == 0)
                // Every request reached the collector (no proxy, no timeout); each 503 is one retry.
                #expect(stats.faults.failure > 0, "the seed must make some requests fail")
                #expect(Self.sample(metrics, "tributary_upload_requests_total") == Double(stats.requests))
                #expect(Self.sample(metrics, "tributary_upload_retries_total") == Double(stats.faults.failure))
                #expect(metrics.contains("tributary_batch_latency_seconds"), "\(metrics)")
                #expect(Self.sample(metrics, "tributary_deadline_expirations_total") == 0, "\(metrics)")
                // The status line systemd shows (`systemctl status`), once a second.
                let statusBegan = Date()
                while !notify.received.contains(where: { $0.text.contains("0 events queued, 40 delivered, 1 dead letters") }),
                    Date().timeIntervalSince(statusBegan) < 30
                {
                    try await Task.sleep(for: .milliseconds(100))
                }
                #expect(
                    notify.received.contains { $0.text.contains("STATUS=idle: 0 events queued, 40 delivered, 1 dead letters") },
                    "\(notify.received.map(\.text).suffix(3))")

                // Refused (401): the agent halts and asks again at the backoff cap. As in `tributary status`,
                // those waits are no retries: the metric counted one per halted request.
                let retried = Self.sample(metrics, "tributary_upload_retries_total")
                try await collector.setFaults(FaultConfiguration(forcedStatus: 401))
                #expect(try await ChildProcess.run("tributary", ["track", "--create", "--group", group, "AfterHalt"]).status == 0)
                let requestsBefore = try await collector.stats().requests
                let haltBegan = Date()
                while try await collector.stats().requests < requestsBefore + 3, Date().timeIntervalSince(haltBegan) < 30 {
                    try await Task.sleep(for: .milliseconds(50))
                }
                #expect(try await collector.stats().requests >= requestsBefore + 3, "the halted agent did not ask again")
                let (halted, _) = try await URLSession.shared.data(from: url)
                #expect(Self.sample(String(decoding: halted, as: UTF8.self), "tributary_upload_retries_total") == retried)
                agent.send(SIGTERM)
                #expect(await agent.finish().status == 0)
            }
        }
    }
}
