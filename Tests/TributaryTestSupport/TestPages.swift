import Hummingbird
import Logging

/// Serves `pages` (path → HTML) on 127.0.0.1, a free port, while `body` runs with that port; stops the
/// server afterwards, even when `body` throws. For browser tests: a frame needs a real http origin to be
/// trusted (a `data:` page's origin is opaque), and pages are never fetched from the internet.
public func withTestPages(_ pages: [String: String], _ body: (Int) async throws -> Void) async throws {
    let router = Router()
    for (route, html) in pages {
        router.get(RouterPath(route)) { _, _ in
            Response(
                status: .ok, headers: [.contentType: "text/html; charset=utf-8", .cacheControl: "no-store"],
                body: ResponseBody(byteBuffer: ByteBuffer(string: html)))
        }
    }
    var logger = Logger(label: "tributary.test.pages")
    logger.logLevel = .critical  // cancellation at the end is logged as an error
    let (ports, continuation) = AsyncStream.makeStream(of: Int.self)
    let server = Application(
        router: router, configuration: ApplicationConfiguration(address: .hostname("127.0.0.1", port: 0)),
        onServerRunning: { continuation.yield($0.localAddress?.port ?? 0) }, logger: logger)
    try await withThrowingTaskGroup(of: Void.self) { tasks in
        tasks.addTask { try await server.run() }
        defer { tasks.cancelAll() }
        var iterator = ports.makeAsyncIterator()
        guard let port = await iterator.next() else { return }
        try await body(port)
    }
}
