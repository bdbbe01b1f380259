import Foundation
import Mainspring
import MainspringTestSupport
@testable import MainspringCore
@testable import MainspringHTTP
import MainspringTLS
import Synchronization
import Testing

#if canImport(Glibc)
import Glibc
#endif

@Suite("HTTP client over TLS", .enabled(if: TestCertificates.shared != nil, "the openssl command is not installed (Debian: apt-get install openssl)"))
struct HTTPClientTLSTests {
    @Test("https through MainspringTLS's connector: the certificate checked against the URL's host; keep-alive over TLS; an untrusted server named")
    func https() async throws {
        let certs = try #require(TestCertificates.shared)
        let group = try EventLoopGroup(loopCount: 2)
        var routes = HTTPRoutes()
        routes.get("/peer") { request in .text(request.remoteAddress) }
        let tls = try TLSServerContext(configuration: .init(certificates: [
            TLSCertificate(certificateFile: certs.serverCertificate, keyFile: certs.serverKey),
        ]))
        let server = try await HTTPServer(group: group, routes: routes, tls: tls)
        let trusting = try TLSClientContext(configuration: .init(trustRoots: .file(certs.caCertificate)))
        let client = HTTPClient(loop: group.loops[1], configuration: .init(secureConnector: .tls(trusting)))
        let first = try await client.get("https://localhost:\(server.port)/peer")
        let second = try await client.get("https://127.0.0.1:\(server.port)/peer")
        let third = try await client.get("https://localhost:\(server.port)/peer")
        #expect(first.status == 200 && second.status == 200)
        #expect(first.text == third.text, "one TLS connection for localhost's requests")
        let untrusting = HTTPClient(loop: group.loops[1], configuration: .init(secureConnector: .tls(try TLSClientContext())))
        let refused = await clientError { _ = try await untrusting.get("https://localhost:\(server.port)/peer") }
        guard case .tlsFailed(let host, let port, let tlsError)? = refused else {
            Issue.record("\(String(describing: refused))")
            return
        }
        #expect(host == "localhost" && port == server.port)
        #expect(tlsError == .handshakeFailed(reason: "the server's certificate did not verify: unable to get local issuer certificate"))
        #expect(refused?.description == "connect to localhost:\(server.port) failed: TLS handshake failed: "
                + "the server's certificate did not verify: unable to get local issuer certificate")
        // A TCP connect that fails under TLS is the same error as over http, not a TLS one.
        let nowhere = await clientError { _ = try await untrusting.get("https://127.0.0.1:1/peer") }
        guard case .connectFailed(_, 1, .system(_, ECONNREFUSED))? = nowhere else {
            Issue.record("\(String(describing: nowhere))")
            return
        }
        client.shutdown()
        untrusting.shutdown()
        await server.closeAndWait()
        await group.shutdown(gracePeriod: .seconds(2))
    }
}
