import Foundation
import Hummingbird
import NIOCore
import Synchronization
import TributaryWire

/// `POST /count/<name>/…`: counts the events other analytics SDKs send, stores nothing.
///
/// It lets the benchmark point foreign SDKs (segment-analytics-python posts `{"batch": [...]}` to
/// `<host>/v1/batch`, posthog to `<host>/batch/`) at this collector with `<host>` =
/// `http://…/count/<name>`: a JSON body, gzip-compressed when `Content-Encoding: gzip` says so, whose
/// events are the elements of its `batch` array (or of the body when it is an array, or the body
/// itself when it is another object). Events are counted when the request arrives, before the
/// configured `latencyMillis` delays the 200 answer. `GET /count` serves the counts by name.
final class CountingEndpoint: Sendable {
    let maxBodyBytes: Int
    let injector: FaultInjector
    private let counts = Mutex<[String: SDKCount]>([:])

    init(maxBodyBytes: Int, injector: FaultInjector) {
        self.maxBodyBytes = maxBodyBytes
        self.injector = injector
    }

    /// What one name received.
    struct SDKCount: Codable, Sendable, Equatable {
        var requests = 0
        var events = 0
    }

    func respond(to request: Request, context: CollectorRequestContext) async -> Response {
        let name = request.uri.path.split(separator: "/").dropFirst().first.map(String.init) ?? ""
        let events: Int
        do {
            let buffer = try await request.body.collect(upTo: maxBodyBytes)
            let body = try Gzip.undoContentEncoding(
                request.headers[.contentEncoding], of: Array(buffer.readableBytesView), limit: maxBodyBytes)
            events = try Self.eventCount(in: body)
        } catch is NIOTooManyBytesError {
            // As ingest answers them: a body over the limit, or in a coding this side cannot read, is no
            // malformed JSON.
            return IngestRejection.bodyTooLarge(limit: maxBodyBytes).response
        } catch let error as WireError {
            return IngestRejection.undecodable(error).response
        } catch {
            return JSONResponse.error(
                .badRequest, code: "malformed_body",
                "The body is not JSON holding a batch of events (gzip only with Content-Encoding: gzip): \(error)")
        }
        counts.withLock { counts in
            counts[name, default: SDKCount()].requests += 1
            counts[name, default: SDKCount()].events += events
        }
        let millis = injector.configuration.latencyMillis
        if millis > 0 { try? await Task.sleep(for: .milliseconds(millis)) }
        return JSONResponse.text(.ok, #"{"status":"Ok"}"#)
    }

    /// The counts by name, as `GET /count` serves them.
    var snapshot: [String: SDKCount] { counts.withLock { $0 } }

    /// The events in a JSON body: its `batch` array, the body itself when it is an array, else one.
    static func eventCount(in body: [UInt8]) throws -> Int {
        let json = try JSONSerialization.jsonObject(with: Data(body))
        if let array = json as? [Any] { return array.count }
        guard let object = json as? [String: Any] else { throw CountingError() }
        return (object["batch"] as? [Any])?.count ?? 1
    }

    private struct CountingError: Error, CustomStringConvertible {
        var description: String { "the top level is neither an object nor an array" }
    }
}
