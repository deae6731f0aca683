import AsyncHTTPClient
import Foundation
import NIOCore
import NIOHTTP1
import TributaryCollector
import TributaryWire

/// An HTTP answer from the collector.
struct Reply: Sendable {
    var status: Int
    var headers: HTTPHeaders
    var body: String

    /// The body parsed as a JSON object (empty when it is not one).
    var object: [String: Any] {
        (try? JSONSerialization.jsonObject(with: Data(body.utf8))) as? [String: Any] ?? [:]
    }

    /// The body parsed as a JSON array of objects (empty when it is not one).
    var array: [[String: Any]] {
        (try? JSONSerialization.jsonObject(with: Data(body.utf8))) as? [[String: Any]] ?? []
    }
}

/// Builds events the way the agent sends them.
enum Events {
    /// One `track` event as JSON bytes.
    static func track(
        _ name: String = "BuyProduct",
        id: String = UUID().uuidString,
        seq: Int,
        producer: String = "app-1",
        producerSeq: Int
    ) -> [UInt8] {
        json([
            "type": "track", "event": name, "time": 1_760_000_000_000 + seq, "distinct_id": "d-1",
            "anonymous_id": "a-1", "_track_id": seq, "event_id": id,
            "lib": ["$lib": "Tributary", "$lib_version": "0.1", "$lib_method": "code"],
            "properties": ["$os": "Linux", "price": 9.5],
            "_tributary": ["seq": seq, "producer": producer, "producer_kind": "app", "producer_seq": producerSeq],
            "_flush_time": 1_760_000_001_000,
        ])
    }

    /// `count` track events of one producer, with global and producer sequence numbers from `firstSeq`.
    static func run(_ count: Int, firstSeq: Int = 1, producer: String = "app-1") -> [[UInt8]] {
        (0..<count).map { track(seq: firstSeq + $0, producer: producer, producerSeq: firstSeq + $0) }
    }

    static func json(_ object: [String: Any]) -> [UInt8] {
        (try? Array(JSONSerialization.data(withJSONObject: object, options: [.sortedKeys]))) ?? []
    }
}

/// Talks HTTP to a running collector with AsyncHTTPClient.
struct Client {
    var collector: RunningCollector
    var token: String?

    /// How long a request may take before it fails the test: long enough for an answer from a collector
    /// that the rest of the suite starves (the tests of all suites start at once on 2 cores; in a CI
    /// run every collector test waited 24 s, and a 5 s bound failed them all), short of a hang.
    static let patience = TimeAmount.seconds(60)

    init(_ collector: RunningCollector, token: String? = nil) {
        self.collector = collector
        self.token = token
    }

    /// Posts `events` encoded in `format` to `path`, as the agent does.
    func post(
        _ events: [[UInt8]],
        format: WireFormat = .ndjson,
        path: String? = nil,
        batchID: String = UUID().uuidString,
        timeout: TimeAmount = Client.patience
    ) async throws -> Reply {
        let encoded = try format.encode(events)
        return try await post(
            encoded.body,
            headers: encoded.headers,
            path: path ?? Self.path(for: format),
            batchID: batchID,
            timeout: timeout
        )
    }

    /// Posts a raw body with the given headers.
    func post(
        _ body: [UInt8],
        headers: [(name: String, value: String)],
        path: String = "/ingest",
        batchID: String = UUID().uuidString,
        timeout: TimeAmount = Client.patience
    ) async throws -> Reply {
        var request = HTTPClientRequest(url: collector.url + path)
        request.method = .POST
        for header in headers { request.headers.add(name: header.name, value: header.value) }
        request.headers.add(name: "Idempotency-Key", value: batchID)
        if let token { request.headers.add(name: "Authorization", value: "Bearer \(token)") }
        request.body = .bytes(ByteBuffer(bytes: body))
        return try await execute(request, timeout: timeout)
    }

    /// Posts a JSON text (for `/control/faults`).
    func postJSON(_ path: String, _ json: String) async throws -> Reply {
        var request = HTTPClientRequest(url: collector.url + path)
        request.method = .POST
        request.headers.add(name: "Content-Type", value: "application/json")
        request.body = .bytes(ByteBuffer(string: json))
        return try await execute(request, timeout: Client.patience)
    }

    func get(_ path: String) async throws -> Reply {
        try await execute(HTTPClientRequest(url: collector.url + path), timeout: Client.patience)
    }

    private func execute(_ request: HTTPClientRequest, timeout: TimeAmount) async throws -> Reply {
        let response = try await HTTPClient.shared.execute(request, timeout: timeout)
        let body = try await response.body.collect(upTo: 64 << 20)
        return Reply(status: Int(response.status.code), headers: response.headers, body: String(buffer: body))
    }

    static func path(for format: WireFormat) -> String {
        format == .sensors ? "/sa" : "/ingest"
    }
}
