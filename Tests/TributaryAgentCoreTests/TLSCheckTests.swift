import NIOSSL
import Testing

@testable import TributaryAgentCore

/// What a transport error means: a certificate problem halts with its cause and fix; anything else is
/// for the retry's backoff.
@Suite("TLS failures")
struct TLSCheckTests {
    struct Text: Error, CustomStringConvertible { var description: String }

    @Test(
        "certificate problems are named, with a fix",
        arguments: [
            ("handshakeFailed(sslError([Error: 268435581 error:1000007d:SSL routines:OPENSSL_internal:CERTIFICATE_VERIFY_FAILED]))",
             "failed verification"),
            ("handshakeFailed(sslError([error:10000074:SSL routines:OPENSSL_internal:TLSV1_ALERT_CERTIFICATE_REQUIRED]))",
             "requires a client certificate"),
            ("handshakeFailed(sslError([error:10000418:SSL routines:OPENSSL_internal:TLSV1_ALERT_UNKNOWN_CA]))",
             "refused the agent's client certificate"),
            ("handshakeFailed(sslError([error:1000010b:SSL routines:OPENSSL_internal:WRONG_VERSION_NUMBER]))",
             "does not speak TLS"),
            ("handshakeFailed(sslError([error:1000042e:SSL routines:OPENSSL_internal:TLSV1_ALERT_PROTOCOL_VERSION]))",
             "no TLS 1.2"),
        ])
    func named(_ error: String, _ says: String) throws {
        let problem = try #require(TLSCheck.problem(in: Text(description: error)))
        #expect(problem.contains(says))
        #expect(problem.contains("fix:"))
    }

    @Test("a host name the certificate does not name")
    func hostName() throws {
        let problem = try #require(TLSCheck.problem(in: NIOSSLExtraError.failedToValidateHostname))
        #expect(problem.contains("not issued for the host name"))
    }

    @Test("transport errors that are not about certificates are left to the retry")
    func transient() {
        for text in ["connect ECONNREFUSED", "remoteConnectionClosed", "uncleanShutdown", "readTimeout", "connectTimeout"] {
            #expect(TLSCheck.problem(in: Text(description: text)) == nil, "\(text)")
        }
    }

    @Test("a bad pin or client key is a configuration error, before anything is sent")
    func badFiles() {
        var settings = TLSSettings()
        settings.pins = ["not base64 of 32 bytes"]
        #expect(throws: AgentError.self) { try settings.loaded() }
        settings = TLSSettings()
        settings.clientKey = "/nonexistent/key.pem"
        #expect(throws: AgentError.self) { try settings.loaded() }
        settings = TLSSettings()
        settings.caFile = "/etc/hostname"
        #expect(throws: AgentError.self) { try settings.loaded() }
    }
}
