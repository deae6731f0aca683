import ArgumentParser
import Foundation
import TributaryAgentCore

/// The agent's TLS and proxy options. Each may come from the environment instead (the systemd units'
/// environment files): the variable named in its help; an option given on the command line wins.
struct NetworkOptions: ParsableArguments {
    @Option(
        name: .customLong("ca-file"),
        help: ArgumentHelp(
            "PEM file of the CA certificates to trust for an https:// collector, instead of the system's ($TRIBUTARY_CA_FILE).",
            valueName: "pem"))
    var caFile: String?

    @Option(
        name: .customLong("ca-file-append"),
        help: ArgumentHelp(
            "PEM file of CA certificates to trust besides the system's (or besides --ca-file's) ($TRIBUTARY_CA_FILE_APPEND).",
            valueName: "pem"))
    var caFileAppend: String?

    @Option(
        name: .customLong("client-cert"),
        help: ArgumentHelp(
            "PEM file of the device's certificate (and its chain), sent when the collector asks for one: mutual TLS ($TRIBUTARY_CLIENT_CERT).",
            valueName: "pem"))
    var clientCert: String?

    @Option(
        name: .customLong("client-key"),
        help: ArgumentHelp("PEM file of --client-cert's private key, unencrypted ($TRIBUTARY_CLIENT_KEY).", valueName: "pem"))
    var clientKey: String?

    @Option(
        name: .customLong("pin-sha256"),
        help: ArgumentHelp(
            """
            Base64 SHA-256 of a SubjectPublicKeyInfo the collector's certificate must have; repeat it for \
            backup keys, any one matches ($TRIBUTARY_PIN_SHA256, comma-separated).
            """,
            valueName: "base64"))
    var pinSHA256: [String] = []

    @Option(
        help: ArgumentHelp(
            """
            HTTP proxy for every request, http://[user:password@]host:port (reached with CONNECT) \
            (default: $TRIBUTARY_PROXY, else $https_proxy/$HTTPS_PROXY or $http_proxy/$HTTP_PROXY by the collector's \
            scheme; $no_proxy/$NO_PROXY lists hosts reached direct).
            """,
            valueName: "url"))
    var proxy: String?

    /// These options, or their environment variables, in `upload`.
    func apply(to upload: inout UploadConfiguration) {
        func value(_ option: String?, _ variable: String) -> String? { option ?? AgentCommand.environment(variable) }
        upload.tls.caFile = value(caFile, "TRIBUTARY_CA_FILE")
        upload.tls.caFileAppend = value(caFileAppend, "TRIBUTARY_CA_FILE_APPEND")
        upload.tls.clientCertificate = value(clientCert, "TRIBUTARY_CLIENT_CERT")
        upload.tls.clientKey = value(clientKey, "TRIBUTARY_CLIENT_KEY")
        upload.tls.pins =
            !pinSHA256.isEmpty
            ? pinSHA256
            : (AgentCommand.environment("TRIBUTARY_PIN_SHA256") ?? "").split(whereSeparator: { $0 == "," || $0 == " " })
                .map(String.init)
        let environment = ProcessInfo.processInfo.environment
        let noProxy = ProxySettings(environment: environment).noProxy
        if let proxy = value(proxy, "TRIBUTARY_PROXY") {
            upload.proxy = ProxySettings(proxy: proxy, noProxy: noProxy)
        } else {
            upload.proxy = ProxySettings(environment: environment)
        }
    }

    func validate() throws {
        if let proxy = proxy ?? AgentCommand.environment("TRIBUTARY_PROXY") {
            do throws(AgentError) {
                try ProxySettings(proxy: proxy, noProxy: nil).validate()
            } catch {
                throw ValidationError("--proxy must be an http://[user:password@]host[:port] URL, not '\(proxy)'.")
            }
        }
    }
}
