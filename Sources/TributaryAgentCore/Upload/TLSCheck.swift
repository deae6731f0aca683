import Foundation
import NIOCore
import NIOSSL
import X509

/// What TLS means for an upload: a certificate problem is no transient failure. Whether the
/// collector's certificate is untrusted, expired, for another name, or its key not pinned, or the
/// collector refuses the agent's own certificate, sending the batch again a few seconds later gets
/// the same answer: uploads halt keeping every event, as for a 401, with a reason that names the
/// cause and the fix, and try again at the backoff cap (a collector whose certificate is renewed is
/// then reached; a fix on the agent's side takes a restart with the new options).
struct TLSCheck: Sendable {
    let loaded: TLSSettings.Loaded
    /// The proxies: the agent's own handshake goes through the one the upload goes through.
    var proxies = ProxySettings()

    /// The halt a transport error means when it is a certificate problem, naming its cause (read from
    /// the certificate when the handshake only said it failed verification); nil for anything else.
    func outcome(for error: any Error, serverURL: String) async -> UploadOutcome? {
        guard let problem = Self.problem(in: error) else { return nil }
        var reason = problem
        if problem == Self.untrusted, let (host, port) = Self.hostAndPort(serverURL) {
            reason = await diagnose(host: host, port: port, proxy: proxies.proxy(for: serverURL)) ?? problem
        }
        return .halt(status: 0, reason: "TLS: \(reason)")
    }

    /// A halt when the collector's certificate key is none of the pins; nil when it is one (or there
    /// are no pins, or the collector is not `https://`). A check that could not be made (the collector
    /// or the proxy unreachable, the handshake refused) is a retry, or the halt the handshake's failure
    /// means: nothing is sent unchecked.
    func verifyPins(serverURL: String, timeout: Duration) async -> UploadOutcome? {
        guard !loaded.pins.isEmpty, let (host, port) = Self.hostAndPort(serverURL) else { return nil }
        let chain: [NIOSSLCertificate]
        do {
            chain = try await TLSProbe.peerChain(
                host: host, port: port, tls: loaded.configuration, proxy: proxies.proxy(for: serverURL), timeout: .init(timeout))
        } catch {
            if let problem = Self.problem(in: error) { return .halt(status: 0, reason: "TLS: \(problem)") }
            return .retry(reason: "the collector's certificate key could not be checked against the pins: \(error)", retryAfter: nil)
        }
        guard let leaf = chain.first, let pin = try? TLSSettings.pin(of: leaf) else {
            return .retry(reason: "the collector presented no certificate to check against the pins", retryAfter: nil)
        }
        if loaded.pins.contains(pin) { return nil }
        return .halt(
            status: 0,
            reason: "TLS: the collector's certificate key (sha256 \(Data(pin).base64EncodedString())) matches no --pin-sha256; "
                + "fix: pin the key of the certificate the collector now presents, or give the collector a certificate with a pinned key")
    }

    /// The host and port of an `https://` URL, or nil for another scheme.
    static func hostAndPort(_ serverURL: String) -> (String, Int)? {
        guard let url = URLComponents(string: serverURL), url.scheme?.lowercased() == "https", let host = url.host else {
            return nil
        }
        return (host, url.port ?? 443)
    }

    static let untrusted =
        "the collector's certificate failed verification (signed by a CA the agent does not trust, expired, or not yet valid); "
        + "fix: give its CA with --ca-file or --ca-file-append, or renew the collector's certificate"

    /// The certificate problem in a transport error, as a cause and a fix; nil when it is none.
    static func problem(in error: any Error) -> String? {
        let text = String(describing: error)
        if let extra = error as? NIOSSLExtraError,
            extra == .failedToValidateHostname || extra == .serverHostnameImpossibleToMatch
        {
            return "the collector's certificate is not issued for the host name in the collector URL; "
                + "fix: use the name the certificate was issued for in --server, or reissue the certificate with this name"
        }
        if text.contains("CERTIFICATE_VERIFY_FAILED") { return untrusted }
        if text.contains("CERTIFICATE_REQUIRED") {
            return "the collector requires a client certificate; fix: give the device's certificate and key with --client-cert and --client-key"
        }
        for alert in ["ALERT_BAD_CERTIFICATE", "ALERT_UNKNOWN_CA", "ALERT_CERTIFICATE_EXPIRED", "ALERT_CERTIFICATE_REVOKED",
                      "ALERT_CERTIFICATE_UNKNOWN", "ALERT_UNSUPPORTED_CERTIFICATE", "ALERT_ACCESS_DENIED"]
        where text.contains(alert) {
            return "the collector refused the agent's client certificate (\(alert.lowercased())); "
                + "fix: give --client-cert and --client-key a certificate issued by a CA the collector trusts, and still valid"
        }
        if text.contains("ALERT_HANDSHAKE_FAILURE") || text.contains("NO_SHARED_CIPHER") {
            return "the collector refused the TLS handshake (no common cipher, or it requires a client certificate); "
                + "fix: give --client-cert and --client-key if the collector requires them, and check its TLS settings"
        }
        if text.contains("WRONG_VERSION_NUMBER") {
            return "the collector does not speak TLS at this address; fix: use its http:// URL, or the port where it serves https"
        }
        if text.contains("ALERT_PROTOCOL_VERSION") || text.contains("UNSUPPORTED_PROTOCOL") {
            return "the collector offers no TLS 1.2 or later, which the agent requires; fix: enable TLS 1.2 or 1.3 on the collector"
        }
        return nil
    }

    /// Why the collector's certificate failed verification, read from the certificate itself: expired,
    /// not yet valid, or issued by a CA the agent does not trust. Nil when it cannot be read.
    private func diagnose(host: String, port: Int, proxy: ProxySettings.Proxy?) async -> String? {
        guard
            let chain = try? await TLSProbe.peerChain(
                host: host, port: port, tls: loaded.configuration, proxy: proxy, timeout: .seconds(5)),
            let leaf = chain.first, let certificate = try? Certificate(derEncoded: leaf.toDERBytes())
        else { return nil }
        let now = Date()
        if certificate.notValidAfter < now {
            return "the collector's certificate expired on \(certificate.notValidAfter) (\(certificate.subject)); "
                + "fix: renew the collector's certificate (or the agent's clock is wrong)"
        }
        if certificate.notValidBefore > now {
            return "the collector's certificate is not valid before \(certificate.notValidBefore) (\(certificate.subject)); "
                + "fix: check the agent's clock, or the certificate's start date"
        }
        return "the collector's certificate (\(certificate.subject)) is issued by \(certificate.issuer), a CA the agent does not trust; "
            + "fix: give that CA with --ca-file (instead of the system's roots) or --ca-file-append (besides them)"
    }
}
