import Crypto
import Foundation
import X509

/// A private CA and certificates made at test time, written as PEM files into a directory: the TLS
/// tests' good chain, wrong CA, expired and wrong-name certificates, and client certificates.
public struct TestPKI: Sendable {
    /// The directory the PEM files are written to.
    public let directory: String
    private let caKey: P256.Signing.PrivateKey
    private let caName: DistinguishedName

    /// A new CA named `name`, its certificate written to `directory/<file>.pem` (``caFile``).
    public init(directory: String, name: String = "Tributary Test CA", file: String = "ca") throws {
        self.directory = directory
        caKey = P256.Signing.PrivateKey()
        caName = try DistinguishedName { CommonName(name) }
        let now = Date()
        let certificate = try Certificate(
            version: .v3, serialNumber: .init(), publicKey: .init(caKey.publicKey),
            notValidBefore: now - 3600, notValidAfter: now + 86_400, issuer: caName, subject: caName,
            signatureAlgorithm: .ecdsaWithSHA256,
            extensions: try Certificate.Extensions {
                Critical(BasicConstraints.isCertificateAuthority(maxPathLength: nil))
                Critical(KeyUsage(keyCertSign: true, cRLSign: true))
            },
            issuerPrivateKey: .init(caKey))
        caFile = directory + "/\(file).pem"
        try Self.write(certificate.serializeAsPEM().pemString, to: caFile)
    }

    /// The CA's certificate (PEM).
    public let caFile: String

    /// A leaf certificate and its key, as files.
    public struct Leaf: Sendable {
        public var certificateFile: String
        public var keyFile: String
        /// base64 SHA-256 of its SubjectPublicKeyInfo, as `--pin-sha256` takes it.
        public var pin: String
    }

    /// Issues a certificate for `hosts` (DNS names, or IP addresses such as `::1`, which become IP address
    /// names), valid from `notBefore` to `notAfter` (by default an
    /// hour ago to a day ahead), for servers and clients, written to `directory/<file>.pem` and
    /// `directory/<file>-key.pem`.
    public func issue(
        _ file: String, hosts: [String] = ["localhost"], notBefore: Date = Date() - 3600,
        notAfter: Date = Date() + 86_400
    ) throws -> Leaf {
        let key = P256.Signing.PrivateKey()
        let subject = try DistinguishedName { CommonName(hosts.first ?? file) }
        let certificate = try Certificate(
            version: .v3, serialNumber: .init(), publicKey: .init(key.publicKey),
            notValidBefore: notBefore, notValidAfter: notAfter, issuer: caName, subject: subject,
            signatureAlgorithm: .ecdsaWithSHA256,
            extensions: try Certificate.Extensions {
                Critical(BasicConstraints.notCertificateAuthority)
                Critical(KeyUsage(digitalSignature: true))
                try ExtendedKeyUsage([.serverAuth, .clientAuth])
                SubjectAlternativeNames(hosts.map { host in Self.ipAddress(host).map { .ipAddress(.init(contentBytes: $0[...])) } ?? .dnsName(host) })
            },
            issuerPrivateKey: .init(caKey))
        let leaf = Leaf(
            certificateFile: directory + "/\(file).pem", keyFile: directory + "/\(file)-key.pem",
            pin: Data(SHA256.hash(data: key.publicKey.derRepresentation)).base64EncodedString())
        try Self.write(certificate.serializeAsPEM().pemString, to: leaf.certificateFile)
        try Self.write(key.pemRepresentation, to: leaf.keyFile)
        return leaf
    }

    /// The bytes of `host` as an IPv6 or IPv4 address (16 or 4), or nil if it is a DNS name.
    static func ipAddress(_ host: String) -> [UInt8]? {
        var v6 = in6_addr()
        if inet_pton(AF_INET6, host, &v6) == 1 { return withUnsafeBytes(of: &v6) { Array($0) } }
        var v4 = in_addr()
        if inet_pton(AF_INET, host, &v4) == 1 { return withUnsafeBytes(of: &v4) { Array($0) } }
        return nil
    }

    private static func write(_ text: String, to path: String) throws {
        try Data((text + "\n").utf8).write(to: URL(fileURLWithPath: path))
    }
}
