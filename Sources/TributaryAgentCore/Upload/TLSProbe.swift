import Foundation
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import NIOSSL

/// A TLS handshake of the agent's own with the collector, which accepts whatever certificate it is
/// shown and returns it: the pins are checked against it (``TLSCheck``), and a certificate the HTTP
/// client's handshake refused is read to say why (expired, not yet valid, unknown issuer).
///
/// async-http-client verifies the chain and the host name of every connection it makes, but offers
/// no hook to see the certificate; this second handshake, to the same host and port with the same
/// client identity, is how the agent sees it. Only the leaf's key can be pinned: it is the one the
/// handshake proves the server holds (any other certificate of a chain is public, and a forger could
/// send it along).
enum TLSProbe {
    /// The certificate chain `host:port` presents (leaf first), read within `timeout`, through `proxy`
    /// (`CONNECT`) when one is given, as the upload's own request goes.
    static func peerChain(
        host: String, port: Int, tls: TLSConfiguration, proxy: ProxySettings.Proxy? = nil, timeout: TimeAmount
    ) async throws -> [NIOSSLCertificate] {
        let loop = MultiThreadedEventLoopGroup.singleton.next()
        let context = try NIOSSLContext(configuration: tls)
        let chain = loop.makePromise(of: [NIOSSLCertificate].self)
        let sniHost = isIPAddress(host) ? nil : host
        let timer = loop.scheduleTask(in: timeout) { chain.fail(ProbeTimedOut()) }
        defer { timer.cancel() }
        let channel: any Channel
        do {
            channel = try await ClientBootstrap(group: loop)
                .connectTimeout(timeout)
                .channelInitializer { channel in
                    channel.eventLoop.makeCompletedFuture {
                        let handler = try NIOSSLClientHandler(
                            context: context, serverHostname: sniHost,
                            customVerificationCallback: { certificates, verified in
                                chain.succeed(certificates)
                                verified.succeed(.certificateVerified)
                            })
                        if let proxy {
                            let tunnel = Tunnel(to: "\(host):\(port)", proxy: proxy, then: handler, failing: chain)
                            try channel.pipeline.syncOperations.addHandlers(tunnel, FailOnError(chain))
                        } else {
                            try channel.pipeline.syncOperations.addHandlers(handler, FailOnError(chain))
                        }
                    }
                }
                .connect(
                    host: proxy?.host ?? host.trimmingCharacters(in: CharacterSet(charactersIn: "[]")),
                    port: proxy?.port ?? port
                ).get()
        } catch {
            chain.fail(error)
            throw error
        }
        defer { channel.close(promise: nil) }
        return try await chain.futureResult.get()
    }

    /// The probe's handshake took too long.
    struct ProbeTimedOut: Error, CustomStringConvertible {
        var description: String { "no TLS handshake within the timeout" }
    }

    /// A `CONNECT` tunnel through an HTTP proxy: sends the request when the connection is up, reads the
    /// proxy's answer to its blank line, and on a 2xx puts the TLS handler first and steps aside.
    private final class Tunnel: ChannelInboundHandler, RemovableChannelHandler {
        typealias InboundIn = ByteBuffer
        let target: String
        let proxy: ProxySettings.Proxy
        let tls: NIOSSLClientHandler
        let promise: EventLoopPromise<[NIOSSLCertificate]>
        var answer = ByteBuffer()

        init(to target: String, proxy: ProxySettings.Proxy, then tls: NIOSSLClientHandler, failing promise: EventLoopPromise<[NIOSSLCertificate]>) {
            (self.target, self.proxy, self.tls, self.promise) = (target, proxy, tls, promise)
        }

        func channelActive(context: ChannelHandlerContext) {
            var request = "CONNECT \(target) HTTP/1.1\r\nHost: \(target)\r\n"
            if let (user, password) = proxy.credentials {
                request += "Proxy-Authorization: Basic \(Data("\(user):\(password)".utf8).base64EncodedString())\r\n"
            }
            context.writeAndFlush(NIOAny(context.channel.allocator.buffer(string: request + "\r\n")), promise: nil)
            context.fireChannelActive()
        }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            var part = unwrapInboundIn(data)
            answer.writeBuffer(&part)
            let text = String(buffer: answer)
            guard text.contains("\r\n\r\n") else { return }
            let status = text.split(separator: " ", maxSplits: 2).dropFirst().first.flatMap { Int($0) } ?? 0
            guard (200..<300).contains(status) else {
                promise.fail(ProxyRefused(status: status))
                context.close(promise: nil)
                return
            }
            do {
                try context.pipeline.syncOperations.addHandler(tls, position: .first)
                context.pipeline.syncOperations.removeHandler(context: context, promise: nil)
            } catch {
                promise.fail(error)
                context.close(promise: nil)
            }
        }
    }

    /// The proxy answered `CONNECT` with something other than 2xx.
    struct ProxyRefused: Error, CustomStringConvertible {
        var status: Int
        var description: String { "the proxy answered CONNECT with \(status)" }
    }

    /// Fails the promise with the first error, or when the connection closes first.
    private final class FailOnError: ChannelInboundHandler, Sendable {
        typealias InboundIn = NIOAny
        let promise: EventLoopPromise<[NIOSSLCertificate]>
        init(_ promise: EventLoopPromise<[NIOSSLCertificate]>) { self.promise = promise }
        func errorCaught(context: ChannelHandlerContext, error: any Error) {
            promise.fail(error)
            context.close(promise: nil)
        }
        func channelInactive(context: ChannelHandlerContext) {
            promise.fail(ChannelError.eof)
        }
    }
}

/// Whether `text` is an IPv4 or IPv6 address (bracketed or not): SNI carries host names only.
func isIPAddress(_ text: String) -> Bool {
    var v4 = in_addr()
    var v6 = in6_addr()
    let bare = text.trimmingCharacters(in: CharacterSet(charactersIn: "[]"))
    return inet_pton(AF_INET, bare, &v4) == 1 || inet_pton(AF_INET6, bare, &v6) == 1
}
