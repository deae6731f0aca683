import AsyncHTTPClient

@testable import TributaryAgentCore

/// Runs `body` with a new agent HTTP client and shuts the client down however `body` ends. A client
/// dropped without a shutdown stops the whole test process (a precondition in its `deinit`): one test's
/// thrown error would end every test running beside it, and leave their child processes behind.
func withHTTPClient<Result>(
    readTimeout: Duration = .seconds(30), _ body: (HTTPClient) async throws -> Result
) async throws -> Result {
    let client = HTTPClientFactory.make(readTimeout: readTimeout)
    let result: Swift.Result<Result, any Error>
    do {
        result = .success(try await body(client))
    } catch {
        result = .failure(error)
    }
    try await client.shutdown()
    return try result.get()
}
