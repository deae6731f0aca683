import Foundation

/// A CA and a server certificate for `localhost`, made with Debian's `openssl` for the end-to-end runs
/// over TLS; `/stats` of a TLS collector is read with `curl`.
struct BenchTLS {
    let caFile: String
    let certificateFile: String
    let keyFile: String

    /// Makes the files in `directory` (P-256 keys, valid for a day).
    static func make(in directory: String) throws -> BenchTLS {
        let tls = BenchTLS(
            caFile: directory + "/ca.pem", certificateFile: directory + "/server.pem", keyFile: directory + "/server-key.pem")
        let caKey = directory + "/ca-key.pem"
        let request = directory + "/server.csr"
        let extensions = directory + "/server.ext"
        try Data("subjectAltName=DNS:localhost\n".utf8).write(to: URL(fileURLWithPath: extensions))
        let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
        try run(["req", "-x509"] + ec + ["-keyout", caKey, "-out", tls.caFile, "-subj", "/CN=Bench CA", "-days", "1"])
        try run(["req"] + ec + ["-keyout", tls.keyFile, "-out", request, "-subj", "/CN=localhost"])
        try run([
            "x509", "-req", "-in", request, "-CA", tls.caFile, "-CAkey", caKey, "-CAcreateserial", "-out",
            tls.certificateFile, "-days", "1", "-extfile", extensions,
        ])
        return tls
    }

    /// GET `url` with `curl`, trusting `caFile`.
    func get(_ url: String) throws -> Data {
        let process = Process()
        let output = Pipe()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/curl")
        process.arguments = ["-sS", "--fail", "--cacert", caFile, url]
        process.standardOutput = output
        try process.run()
        let body = output.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        guard process.terminationStatus == 0 else { throw BenchFailure("curl \(url) exited \(process.terminationStatus).") }
        return body
    }

    private static func run(_ arguments: [String]) throws {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/openssl")
        process.arguments = arguments
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        try process.run()
        process.waitUntilExit()
        guard process.terminationStatus == 0 else {
            throw BenchFailure("openssl \(arguments.joined(separator: " ")) exited \(process.terminationStatus).")
        }
    }
}
