import Foundation
import Hummingbird
import HummingbirdCore
import HummingbirdTLS
import Logging
import NIOCore
import NIOSSL
import ServiceLifecycle
import Synchronization

/// The reference collector: an HTTP server that receives Tributary batches, deduplicates and checks
/// them, stores them in SQLite, and injects faults on demand.
///
/// Run it as a `Service` in a `ServiceGroup` (graceful shutdown releases hanging requests and lets
/// in-flight batches finish), or in tests with ``withRunning(_:logger:_:)``. Endpoints, statistics and
/// faults are described in `docs/collector.md`.
public final class Collector: Service, Sendable {
    /// The configuration the collector was created with (its faults may since have been replaced).
    public let configuration: CollectorConfiguration
    private let logger: Logger
    private let store: EventStore
    private let injector: FaultInjector
    private let hangs = HangingRequests()
    private let counting: CountingEndpoint
    private let onListening: @Sendable (_ url: String, _ port: Int) async -> Void
    /// The server's TLS (``CollectorConfiguration/tls``, loaded), or nil for plain http.
    private let serverTLS: TLSConfiguration?

    /// Creates a collector and opens its database; the server starts listening in ``run()``.
    ///
    /// - Parameters:
    ///   - configuration: address, authentication, database, limits and initial faults; validated here.
    ///   - logger: where the collector logs (one line per rejected batch at info, accepted at debug).
    ///   - onListening: called once the server listens, with its base URL (`http://127.0.0.1:PORT`).
    /// - Throws: ``CollectorError`` with code `invalidConfiguration` or `database`.
    public convenience init(
        configuration: CollectorConfiguration,
        logger: Logger = Logger(label: "tributary.collector"),
        onListening: @escaping @Sendable (_ url: String) async -> Void = { _ in }
    ) throws(CollectorError) {
        try self.init(configuration: configuration, logger: logger) { url, _ in await onListening(url) }
    }

    /// Creates a collector whose `onListening` also receives the bound port.
    init(
        configuration: CollectorConfiguration,
        logger: Logger,
        onListening: @escaping @Sendable (_ url: String, _ port: Int) async -> Void
    ) throws(CollectorError) {
        try configuration.validate()
        self.serverTLS = try configuration.tls?.serverConfiguration()
        self.configuration = configuration
        self.logger = logger
        self.store = try EventStore(path: configuration.databasePath)
        self.injector = FaultInjector(configuration.faults)
        self.counting = CountingEndpoint(maxBodyBytes: configuration.maxBodyBytes, injector: injector)
        self.onListening = onListening
    }

    /// Serves HTTP until graceful shutdown (or cancellation) of the enclosing `ServiceGroup`.
    ///
    /// - Throws: ``CollectorError`` with code `serverNotStarted` when the address cannot be bound.
    public func run() async throws {
        let listening = Mutex(false)
        let server: HTTPServerBuilder = try serverTLS.map { try .tls(.http1(), tlsConfiguration: $0) } ?? .http1()
        let scheme = serverTLS == nil ? "http" : "https"
        let application = Application(
            router: makeRouter(),
            server: server,
            configuration: ApplicationConfiguration(
                address: .hostname(configuration.host, port: configuration.port),
                serverName: "tributary-collector"
            ),
            onServerRunning: { [configuration, onListening, logger] channel in
                listening.withLock { $0 = true }
                let port = channel.localAddress?.port ?? configuration.port
                let url = Self.baseURL(host: configuration.host, port: port, scheme: scheme)
                logger.info("Collector listening", metadata: ["tributary.url": .string(url)])
                await onListening(url, port)
            },
            logger: logger
        )
        let hangs = self.hangs
        do {
            try await withGracefulShutdownHandler {
                try await application.run()
            } onGracefulShutdown: {
                hangs.releaseAll()
            }
        } catch where !listening.withLock({ $0 }) {
            throw CollectorError(
                .serverNotStarted,
                "Cannot listen on \(configuration.host):\(configuration.port); "
                    + "is the port in use or the address not local?",
                cause: error
            )
        }
    }

    // MARK: Control

    /// The faults in force.
    public var faults: FaultConfiguration { injector.configuration }

    /// Replaces the faults in force and restarts the fault generator from `faults.seed`.
    ///
    /// - Throws: ``CollectorError`` with code `invalidConfiguration`, naming the bad value; the faults in
    ///   force are then unchanged.
    public func setFaults(_ faults: FaultConfiguration) throws(CollectorError) {
        try faults.validate()
        injector.replace(with: faults)
        logger.info("Faults replaced", metadata: ["tributary.faults": "\(faults)"])
    }

    /// What the collector has received so far (the same figures as `GET /stats`).
    public func stats() async throws(CollectorError) -> CollectorStats {
        try await store.stats()
    }

    /// A user's profile as JSON (`{"distinct_id":…,"properties":{…}}`), nil when the collector keeps none.
    public func profileJSON(of distinctID: String) async throws(CollectorError) -> String? {
        try await store.profileJSON(of: distinctID)
    }

    /// Unique events in arrival order: those with an arrival index above `after`, at most `limit`.
    public func events(after: Int64 = 0, limit: Int? = nil) async throws(CollectorError) -> [ReceivedEvent] {
        try await store.events(after: after, limit: limit)
    }

    // MARK: Routes

    private func makeRouter() -> Router<CollectorRequestContext> {
        let router = Router(context: CollectorRequestContext.self)
        let ingest = IngestEndpoint(
            token: configuration.token,
            maxBodyBytes: configuration.maxBodyBytes,
            maxEventsPerRequest: configuration.maxEventsPerRequest,
            store: store,
            injector: injector,
            hangs: hangs
        )
        let counting = self.counting
        router.post("/sa") { request, context in await ingest.respond(to: request, context: context) }
        router.post("/ingest") { request, context in await ingest.respond(to: request, context: context) }
        router.post("/count/**") { request, context in await counting.respond(to: request, context: context) }
        router.get("/count") { [counting] _, _ in JSONResponse.make(.ok, counting.snapshot) }
        router.get("/stats") { [store] _, _ in
            do throws(CollectorError) {
                return JSONResponse.make(.ok, try await store.stats())
            } catch {
                return JSONResponse.error(.internalServerError, code: "storage_failed", error.message)
            }
        }
        router.get("/events") { [store] request, _ in await Self.listEvents(request, store: store) }
        router.get("/profile") { [store] request, _ in await Self.showProfile(request, store: store) }
        router.get("/control/faults") { [injector] _, _ in JSONResponse.make(.ok, injector.configuration) }
        router.post("/control/faults") { request, _ in await self.replaceFaults(request) }
        return router
    }

    /// The events one `GET /events` returns without a `limit`: the answer is built in memory, and a
    /// collector holding millions of events must not build them all at once.
    public static let eventsPageDefault = 10_000
    /// The largest `limit` `GET /events` takes (a larger one is a 400 `bad_query`).
    public static let eventsPageMax = 100_000

    /// `GET /events?after=<arrival>&limit=<n>`.
    private static func listEvents(_ request: Request, store: EventStore) async -> Response {
        let query = request.uri.queryParameters
        var after: Int64 = 0
        if let text = query["after"] {
            guard let value = Int64(String(text)), value >= 0 else {
                return JSONResponse.error(
                    .badRequest,
                    code: "bad_query",
                    "after must be a non-negative integer (an arrival index)."
                )
            }
            after = value
        }
        var limit = eventsPageDefault
        if let text = query["limit"] {
            guard let value = Int(String(text)), (1...eventsPageMax).contains(value) else {
                return JSONResponse.error(
                    .badRequest, code: "bad_query", "limit must be an integer from 1 to \(eventsPageMax); page with after.")
            }
            limit = value
        }
        do throws(CollectorError) {
            return JSONResponse.text(.ok, try await store.eventsJSONArray(after: after, limit: limit))
        } catch {
            return JSONResponse.error(.internalServerError, code: "storage_failed", error.message)
        }
    }

    /// `GET /profile?distinct_id=<id>`: the user's profile, or 404 `not_found`.
    private static func showProfile(_ request: Request, store: EventStore) async -> Response {
        guard let id = request.uri.queryParameters["distinct_id"].map(String.init), !id.isEmpty else {
            return JSONResponse.error(.badRequest, code: "bad_query", "distinct_id must name the user whose profile to show.")
        }
        do throws(CollectorError) {
            guard let profile = try await store.profileJSON(of: id) else {
                return JSONResponse.error(.notFound, code: "not_found", "No profile is kept for this distinct_id.")
            }
            return JSONResponse.text(.ok, profile)
        } catch {
            return JSONResponse.error(.internalServerError, code: "storage_failed", error.message)
        }
    }

    /// `POST /control/faults` with a JSON ``FaultConfiguration``: replaces the faults, answers the new ones.
    private func replaceFaults(_ request: Request) async -> Response {
        let faults: FaultConfiguration
        do {
            let body = try await request.body.collect(upTo: 1 << 20)
            faults = try JSONDecoder().decode(FaultConfiguration.self, from: Data(body.readableBytesView))
        } catch {
            return JSONResponse.error(
                .badRequest,
                code: "invalid_faults",
                "The body is not a JSON fault configuration: \(Self.describe(error))"
            )
        }
        do throws(CollectorError) {
            try setFaults(faults)
        } catch {
            return JSONResponse.error(.badRequest, code: "invalid_faults", error.message)
        }
        return JSONResponse.make(.ok, faults)
    }

    // MARK: Helpers

    /// `http://HOST:PORT`, with an IPv6 host in brackets.
    static func baseURL(host: String, port: Int, scheme: String = "http") -> String {
        let shownHost = host.contains(":") && !host.hasPrefix("[") ? "[\(host)]" : host
        return "\(scheme)://\(shownHost):\(port)"
    }

    /// A one-line description of a decoding error, naming the key or value at fault.
    private static func describe(_ error: any Error) -> String {
        guard let error = error as? DecodingError else { return "\(error)" }
        switch error {
        case .dataCorrupted(let context), .typeMismatch(_, let context), .valueNotFound(_, let context),
            .keyNotFound(_, let context):
            let path = context.codingPath.map(\.stringValue).joined(separator: ".")
            return path.isEmpty ? context.debugDescription : "\(path): \(context.debugDescription)"
        @unknown default:
            return "\(error)"
        }
    }
}
