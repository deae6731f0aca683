import Crypto
import Foundation
import NIOSSL
import X509

/// How the agent's `https://` requests trust the collector and prove who they are: TLS 1.2 or later,
/// the system's roots or the operator's, a client certificate (mutual TLS), and public key pins.
public struct TLSSettings: Sendable, Equatable {
    /// PEM file of the CA certificates to trust instead of the system's (`--ca-file`).
    public var caFile: String?
    /// PEM file of CA certificates to trust besides the system's, or besides ``caFile``'s
    /// (`--ca-file-append`).
    public var caFileAppend: String?
    /// PEM file of the device's certificate, and the chain to send with it (`--client-cert`).
    public var clientCertificate: String?
    /// PEM file of the private key of ``clientCertificate`` (`--client-key`).
    public var clientKey: String?
    /// Base64 SHA-256 digests of SubjectPublicKeyInfos (`--pin-sha256`): when any is given, the
    /// collector's certificate chain must hold a key with one of them.
    public var pins: [String] = []

    /// Settings that trust the system's roots and send no client certificate.
    public init() {}

    /// The PEM files these settings name, loaded and checked: a CA file that holds no PEM certificate,
    /// a key without a certificate (or a certificate without its key), a key that does not belong to
    /// the certificate, or a pin that is not the base64 of 32 bytes is a configuration error (exit 78),
    /// found before anything is sent.
    public func loaded() throws(AgentError) -> Loaded {
        var tls = TLSConfiguration.makeClientConfiguration()
        tls.minimumTLSVersion = .tlsv12
        if let caFile { tls.trustRoots = .certificates(try Self.certificates(caFile, option: "--ca-file")) }
        if let caFileAppend {
            tls.additionalTrustRoots = [.certificates(try Self.certificates(caFileAppend, option: "--ca-file-append"))]
        }
        switch (clientCertificate, clientKey) {
        case (nil, nil): break
        case (nil, .some):
            throw AgentError(.configuration, "--client-key needs --client-cert: a private key alone proves nothing.")
        case (.some, nil):
            throw AgentError(.configuration, "--client-cert needs --client-key, the certificate's private key.")
        case (.some(let certificateFile), .some(let keyFile)):
            let chain = try Self.certificates(certificateFile, option: "--client-cert")
            tls.certificateChain = chain.map { .certificate($0) }
            tls.privateKey = .privateKey(try Self.privateKey(keyFile, matching: chain[0], certificateFile: certificateFile))
        }
        var digests: [[UInt8]] = []
        for pin in pins {
            guard let digest = Data(base64Encoded: pin), digest.count == SHA256.byteCount else {
                throw AgentError(
                    .configuration,
                    "--pin-sha256 '\(pin)' is not the base64 of a SHA-256 digest (32 bytes): make one with `openssl x509 -in cert.pem -pubkey -noout | openssl pkey -pubin -outform der | openssl dgst -sha256 -binary | base64`.")
            }
            digests.append(Array(digest))
        }
        return Loaded(configuration: tls, pins: digests)
    }

    /// The system's roots, no client certificate, no pins; TLS 1.2 or later.
    public static let systemDefault: Loaded = {
        var tls = TLSConfiguration.makeClientConfiguration()
        tls.minimumTLSVersion = .tlsv12
        return Loaded(configuration: tls, pins: [])
    }()

    /// The TLS configuration the HTTP client uses, and the pins as bytes.
    public struct Loaded: Sendable {
        /// The client's TLS configuration (roots, identity, TLS 1.2 or later).
        public var configuration: TLSConfiguration
        /// The pinned SPKI SHA-256 digests; empty: no pinning.
        var pins: [[UInt8]]
    }

    /// Every certificate in the PEM file at `path`; at least one.
    static func certificates(_ path: String, option: String) throws(AgentError) -> [NIOSSLCertificate] {
        let bytes = try read(path, option: option)
        let certificates: [NIOSSLCertificate]
        do {
            certificates = try NIOSSLCertificate.fromPEMBytes(bytes)
        } catch {
            throw AgentError(
                .configuration, "\(option) \(path) is not a PEM file of certificates (-----BEGIN CERTIFICATE-----): \(error)",
                cause: error)
        }
        guard !certificates.isEmpty else {
            throw AgentError(.configuration, "\(option) \(path) holds no PEM certificate (-----BEGIN CERTIFICATE-----).")
        }
        return certificates
    }

    /// The private key in the PEM file at `path`, checked against `certificate`'s public key.
    static func privateKey(
        _ path: String, matching certificate: NIOSSLCertificate, certificateFile: String
    ) throws(AgentError) -> NIOSSLPrivateKey {
        let bytes = try read(path, option: "--client-key")
        let key: NIOSSLPrivateKey
        let parsed: Certificate.PrivateKey
        do {
            key = try NIOSSLPrivateKey(bytes: bytes, format: .pem)
            parsed = try Certificate.PrivateKey(pemEncoded: String(decoding: bytes, as: UTF8.self))
        } catch {
            throw AgentError(
                .configuration, "--client-key \(path) is not a PEM private key (RSA, EC or Ed25519, unencrypted): \(error)",
                cause: error)
        }
        let matches: Bool
        do {
            matches = try Certificate(derEncoded: certificate.toDERBytes()).publicKey == parsed.publicKey
        } catch {
            throw AgentError(.configuration, "--client-cert \(certificateFile): its certificate cannot be read: \(error)", cause: error)
        }
        guard matches else {
            throw AgentError(
                .configuration,
                "--client-key \(path) is not the key of --client-cert \(certificateFile): give the key the certificate was issued for.")
        }
        return key
    }

    private static func read(_ path: String, option: String) throws(AgentError) -> [UInt8] {
        guard let data = FileManager.default.contents(atPath: path) else {
            throw AgentError(.configuration, "\(option) \(path) cannot be read (missing, or not readable by this user).")
        }
        return Array(data)
    }

    /// The base64 SHA-256 of `certificate`'s SubjectPublicKeyInfo, as `--pin-sha256` takes it.
    static func pin(of certificate: NIOSSLCertificate) throws -> [UInt8] {
        Array(SHA256.hash(data: try certificate.extractPublicKey().toSPKIBytes()))
    }
}
