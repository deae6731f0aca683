import Foundation
import HTTPTypes
import Hummingbird
import Logging
import NIOCore
import TributaryWire

/// `POST /sa` and `POST /ingest`: reads, checks, fault-injects, decodes, validates and stores one batch.
///
/// The steps, in order (the first that fails answers the request):
/// 1. read the body, at most `maxBodyBytes` → 413
/// 2. recognise the wire format from `Content-Type` → 415
/// 3. check `Authorization: Bearer <token>` when a token is configured → 401
/// 4. faults: draw the random decisions; `forcedStatus`, then hang, reset, injected failure
/// 5. decode (`WireError` → 400; 413 when the decompressed body is over `maxBodyBytes` or holds more
///    than `maxEventsPerRequest` events; 415 for a `Content-Encoding` other than gzip or identity)
/// 6. `maxEventsPerBatch` → 413; event shape → 400; poison pattern → `poisonStatus`
/// 7. one SQLite transaction: dedup, order checks, batch record, counters
/// 8. lost acknowledgement (reset after commit), or `latencyMillis` then 200
struct IngestEndpoint: Sendable {
    let token: String?
    let maxBodyBytes: Int
    let maxEventsPerRequest: Int
    let store: EventStore
    let injector: FaultInjector
    let hangs: HangingRequests

    /// What became of a request that was not rejected.
    private enum Outcome {
        /// The batch was stored.
        case accepted(BatchReceipt, loseAck: Bool)
        /// The connection was closed without an answer (hang or reset fault).
        case abandoned
    }

    func respond(to request: Request, context: CollectorRequestContext) async -> Response {
        let batchID = request.headers.first { $0.name.canonicalName == "idempotency-key" }?.value
        var logger = context.logger
        logger[metadataKey: "tributary.batch.id"] = batchID.map { .string($0) }
        let outcome: Outcome
        do throws(IngestRejection) {
            outcome = try await process(request, channel: context.channel, batchID: batchID, logger: logger)
        } catch {
            await record(rejectionBy: error.fault, logger: logger)
            logger.info(
                "Batch rejected",
                metadata: ["tributary.status": "\(error.status)", "tributary.reason": .string(error.message)]
            )
            await delayResponse()
            return error.response
        }
        switch outcome {
        case .accepted(let receipt, let loseAck):
            logger.debug(
                "Batch accepted",
                metadata: [
                    "tributary.accepted": "\(receipt.accepted)", "tributary.duplicates": "\(receipt.duplicates)",
                ]
            )
            if loseAck {
                logger.info("Batch committed; dropping the connection (lost acknowledgement fault)")
                await ConnectionControl.reset(context.channel)
                return Response(status: .internalServerError)  // never reaches the client: the channel is closed
            }
            await delayResponse()
            return JSONResponse.make(.ok, AcceptedBody(accepted: receipt.accepted, duplicates: receipt.duplicates))
        case .abandoned:
            return Response(status: .internalServerError)  // never reaches the client: the channel is closed
        }
    }

    private func process(
        _ request: Request,
        channel: any Channel,
        batchID: String?,
        logger: Logger
    ) async throws(IngestRejection) -> Outcome {
        let body = try await readBody(request)
        let format = try wireFormat(of: request)
        try authenticate(request)

        let (faults, decision) = injector.nextDecision()
        if let forced = faults.forcedStatus { throw .forced(status: forced, retryAfter: faults.retryAfter) }
        if decision.hang {
            await record(rejectionBy: .hang, logger: logger)
            logger.info("Holding the request without an answer (hang fault)")
            await hangs.hang(on: channel)
            logger.debug("Hanging request released (client gone or collector shutting down)")
            await ConnectionControl.reset(channel)
            return .abandoned
        }
        if decision.reset {
            await record(rejectionBy: .reset, logger: logger)
            logger.info("Resetting the connection without an answer (reset fault)")
            await ConnectionControl.reset(channel)
            return .abandoned
        }
        if decision.fail { throw .injectedFailure(status: faults.failureStatus, retryAfter: faults.retryAfter) }

        let decoded = try decode(body, format: format, contentEncoding: request.headers[.contentEncoding])
        if let limit = faults.maxEventsPerBatch, decoded.events.count > limit {
            throw IngestRejection(
                status: 413,
                code: "too_large",
                fault: .tooLarge,
                message:
                    "The batch has \(decoded.events.count) events; this collector accepts at most \(limit) per batch."
            )
        }
        let events: [IncomingEvent]
        do throws(InvalidEvent) {
            events = try EventValidator.validate(decoded)
        } catch {
            throw IngestRejection(
                status: 400,
                code: "invalid_event",
                message: error.message + "; nothing of this batch was stored.",
                index: error.index,
                field: error.field
            )
        }
        try checkPoison(events, faults: faults)

        let batch = IncomingBatch(
            idempotencyKey: batchID, format: format.rawValue, events: events,
            payload: decoded.payload, payloadEncoding: decoded.payloadEncoding)
        do throws(CollectorError) {
            return .accepted(try await store.accept(batch, lostAck: decision.loseAck), loseAck: decision.loseAck)
        } catch {
            logger.error("Storing a batch failed", metadata: ["tributary.error": "\(error)"])
            throw IngestRejection(status: 500, code: "storage_failed", message: error.message)
        }
    }

    // MARK: Steps

    private func readBody(_ request: Request) async throws(IngestRejection) -> [UInt8] {
        do {
            let buffer = try await request.body.collect(upTo: maxBodyBytes)
            return Array(buffer.readableBytesView)
        } catch is NIOTooManyBytesError {
            throw IngestRejection.bodyTooLarge(limit: maxBodyBytes)
        } catch {
            throw IngestRejection(
                status: 400,
                code: "unreadable_body",
                message: "The request body could not be read: \(error)."
            )
        }
    }

    private func wireFormat(of request: Request) throws(IngestRejection) -> WireFormat {
        let contentType = request.headers[.contentType]
        guard let format = WireFormat(contentType: contentType) else {
            throw IngestRejection(
                status: 415,
                code: "unsupported_media_type",
                message: "Content-Type \"\(contentType ?? "")\" names no known format or a charset other than UTF-8; "
                    + "send application/x-www-form-urlencoded (Sensors form) or application/x-ndjson (gzip NDJSON), in UTF-8."
            )
        }
        return format
    }

    private func authenticate(_ request: Request) throws(IngestRejection) {
        guard let token else { return }
        let presented = request.headers[.authorization].flatMap(Self.bearerToken(in:))
        guard let presented else {
            throw IngestRejection(
                status: 401,
                code: "unauthorized",
                message: "This collector requires Authorization: Bearer <token>."
            )
        }
        guard Self.constantTimeEqual(presented, token) else {
            throw IngestRejection(status: 401, code: "unauthorized", message: "The bearer token is not accepted.")
        }
    }

    private func decode(
        _ body: [UInt8],
        format: WireFormat,
        contentEncoding: String?
    ) throws(IngestRejection) -> DecodedBody {
        do throws(WireError) {
            return try BodyDecoder.decode(
                body, format: format, contentEncoding: contentEncoding, limit: maxBodyBytes,
                maxEvents: maxEventsPerRequest)
        } catch {
            throw IngestRejection.undecodable(error)
        }
    }

    private func checkPoison(_ events: [IncomingEvent], faults: FaultConfiguration) throws(IngestRejection) {
        guard let pattern = faults.poisonPattern, let regex = try? Regex(pattern) else { return }
        guard let index = events.firstIndex(where: { $0.name?.contains(regex) == true }) else { return }
        throw IngestRejection(
            status: faults.poisonStatus,
            code: "poison",
            fault: .poison,
            message: "event \(index): \"event\" matches the poison pattern /\(pattern)/; "
                + "nothing of this batch was stored.",
            index: index,
            field: "event"
        )
    }

    // MARK: Helpers

    private func record(rejectionBy fault: FaultKind?, logger: Logger) async {
        do throws(CollectorError) {
            try await store.recordRejected(fault: fault)
        } catch {
            logger.error("Counting a rejected request failed", metadata: ["tributary.error": "\(error)"])
        }
    }

    private func delayResponse() async {
        let millis = injector.configuration.latencyMillis
        guard millis > 0 else { return }
        try? await Task.sleep(for: .milliseconds(millis))
    }

    /// The token of an `Authorization: Bearer <token>` header value (the scheme is case-insensitive).
    static func bearerToken(in header: String) -> String? {
        let parts = header.split(separator: " ", maxSplits: 1, omittingEmptySubsequences: true)
        guard parts.count == 2, parts[0].lowercased() == "bearer" else { return nil }
        return parts[1].trimmingCharacters(in: .whitespaces)
    }

    /// Compares in time independent of where the strings differ.
    static func constantTimeEqual(_ a: String, _ b: String) -> Bool {
        let x = Array(a.utf8)
        let y = Array(b.utf8)
        var difference = UInt8(truncatingIfNeeded: x.count ^ y.count)
        for i in 0..<max(x.count, y.count) {
            difference |= (i < x.count ? x[i] : 0) ^ (i < y.count ? y[i] : 0)
        }
        return difference == 0
    }
}

/// An ingest request answered with an error: what status, what JSON body, which fault to count.
struct IngestRejection: Error {
    var status: Int
    /// A stable snake_case code for programs (`malformed_body`, `poison`, …).
    var code: String
    /// The injected fault or limit this rejection counts as, if any.
    var fault: FaultKind?
    var message: String
    var index: Int?
    var field: String?
    var retryAfter: String?

    init(
        status: Int,
        code: String,
        fault: FaultKind? = nil,
        message: String,
        index: Int? = nil,
        field: String? = nil,
        retryAfter: String? = nil
    ) {
        self.status = status
        self.code = code
        self.fault = fault
        self.message = message
        self.index = index
        self.field = field
        self.retryAfter = retryAfter
    }

    /// A request body over the collector's `limit` of bytes.
    static func bodyTooLarge(limit: Int) -> IngestRejection {
        IngestRejection(
            status: 413, code: "too_large", fault: .tooLarge,
            message: "The request body is over this collector's limit of \(limit) bytes.")
    }

    /// A body that could not be decoded: 413 over the limit once decompressed, 415 in a coding this side
    /// cannot read, else 400.
    static func undecodable(_ error: WireError) -> IngestRejection {
        switch error.code {
        case .tooLarge: IngestRejection(status: 413, code: "too_large", fault: .tooLarge, message: error.message)
        case .crcMismatch: IngestRejection(status: 400, code: "crc_mismatch", message: error.message)
        case .unsupportedMediaType: IngestRejection(status: 415, code: "unsupported_media_type", message: error.message)
        default: IngestRejection(status: 400, code: "malformed_body", message: error.message)
        }
    }

    static func forced(status: Int, retryAfter: String?) -> IngestRejection {
        IngestRejection(
            status: status,
            code: "forced_status",
            fault: .forced,
            message: "This collector answers every ingest request with \(status) (forcedStatus fault); "
                + "nothing was stored.",
            retryAfter: retryAfter
        )
    }

    static func injectedFailure(status: Int, retryAfter: String?) -> IngestRejection {
        IngestRejection(
            status: status,
            code: "injected_failure",
            fault: .failure,
            message: "Injected failure (failureRate fault); nothing was stored. Retry later.",
            retryAfter: retryAfter
        )
    }

    var response: Response {
        var headers = HTTPFields()
        if let retryAfter { headers[.retryAfter] = retryAfter }
        // RFC 9110 §11.6.1: a 401 names the scheme it wants.
        if status == 401 { headers[.wwwAuthenticate] = "Bearer" }
        return JSONResponse.make(
            JSONResponse.status(status),
            ErrorBody(error: message, code: code, index: index, field: field),
            headers: headers
        )
    }
}

/// The body of a 200 answer to an ingest request.
struct AcceptedBody: Encodable {
    /// Events stored for the first time.
    var accepted: Int
    /// Events already stored before (by `event_id`).
    var duplicates: Int
}

/// The body of every error answer: `{"error": "...", "code": "...", "index": 3, "field": "event"}`.
struct ErrorBody: Encodable {
    var error: String
    var code: String
    var index: Int?
    var field: String?
}
