import Foundation
import HTTPTypes
import Hummingbird
import NIOCore
import NIOHTTP1

/// The request context of the collector's routes: Hummingbird's basics plus the connection, which the
/// reset, lost-acknowledgement and hang faults close without answering.
struct CollectorRequestContext: RequestContext {
    var coreContext: CoreRequestContextStorage
    /// The connection the request arrived on.
    let channel: any Channel

    init(source: ApplicationRequestContextSource) {
        coreContext = CoreRequestContextStorage(source: source)
        channel = source.channel
    }
}

/// Builds JSON responses.
enum JSONResponse {
    /// `value` encoded as JSON (sorted keys) with `Content-Type: application/json`.
    static func make<T: Encodable>(
        _ status: HTTPResponse.Status,
        _ value: T,
        headers: HTTPFields = HTTPFields()
    ) -> Response {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        guard let data = try? encoder.encode(value) else {
            return text(
                .internalServerError,
                #"{"error":"The response could not be encoded as JSON.","code":"internal"}"#
            )
        }
        return raw(status, data, headers: headers)
    }

    /// Already-encoded JSON text.
    static func text(_ status: HTTPResponse.Status, _ json: String, headers: HTTPFields = HTTPFields()) -> Response {
        raw(status, Data(json.utf8), headers: headers)
    }

    /// An error answer: `{"error": message, "code": code}`.
    static func error(_ status: HTTPResponse.Status, code: String, _ message: String) -> Response {
        make(status, ErrorBody(error: message, code: code))
    }

    /// The status for `code`, with its standard reason phrase.
    static func status(_ code: Int) -> HTTPResponse.Status {
        let clamped = (100...999).contains(code) ? code : 500
        return HTTPResponse.Status(code: clamped, reasonPhrase: HTTPResponseStatus(statusCode: clamped).reasonPhrase)
    }

    private static func raw(_ status: HTTPResponse.Status, _ data: Data, headers: HTTPFields) -> Response {
        var headers = headers
        headers[.contentType] = "application/json"
        return Response(status: status, headers: headers, body: ResponseBody(byteBuffer: ByteBuffer(bytes: data)))
    }
}
