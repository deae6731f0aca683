import NIOSSL

/// The collector's TLS: its certificate and key (`--tls-cert`, `--tls-key`), and the CA whose client
/// certificates it requires (`--client-ca`: mutual TLS). TLS 1.2 or later.
public struct CollectorTLS: Sendable, Equatable {
    /// PEM file of the server certificate, followed by its chain.
    public var certificateFile: String
    /// PEM file of the certificate's private key.
    public var keyFile: String
    /// PEM file of the CA certificates that issue client certificates; when set, a client without a
    /// certificate issued by one of them cannot connect.
    public var clientCAFile: String?

    /// TLS with this certificate and key, and optionally client certificates from `clientCAFile`.
    public init(certificateFile: String, keyFile: String, clientCAFile: String? = nil) {
        (self.certificateFile, self.keyFile, self.clientCAFile) = (certificateFile, keyFile, clientCAFile)
    }

    /// The server's TLS configuration; a file that cannot be read or is not PEM is a configuration
    /// error.
    func serverConfiguration() throws(CollectorError) -> TLSConfiguration {
        let chain = try Self.certificates(certificateFile, option: "--tls-cert")
        let key: NIOSSLPrivateKey
        do {
            key = try NIOSSLPrivateKey(file: keyFile, format: .pem)
        } catch {
            throw CollectorError(.invalidConfiguration, "--tls-key \(keyFile) is not a readable PEM private key: \(error)", cause: error)
        }
        var tls = TLSConfiguration.makeServerConfiguration(certificateChain: chain.map { .certificate($0) }, privateKey: .privateKey(key))
        tls.minimumTLSVersion = .tlsv12
        if let clientCAFile {
            tls.trustRoots = .certificates(try Self.certificates(clientCAFile, option: "--client-ca"))
            tls.certificateVerification = .noHostnameVerification
        }
        return tls
    }

    /// The certificates of the PEM file at `path` (at least one), given with `option`.
    private static func certificates(_ path: String, option: String) throws(CollectorError) -> [NIOSSLCertificate] {
        let certificates: [NIOSSLCertificate]
        do {
            certificates = try NIOSSLCertificate.fromPEMFile(path)
        } catch {
            throw CollectorError(.invalidConfiguration, "\(option) \(path) is not a readable PEM certificate file: \(error)", cause: error)
        }
        guard !certificates.isEmpty else {
            throw CollectorError(.invalidConfiguration, "\(option) \(path) holds no PEM certificate.")
        }
        return certificates
    }
}
