import Foundation
import Mainspring
import MainspringTestSupport
import MainspringHTTP
import MainspringTLS
import Synchronization
import Testing
#if canImport(Glibc)
import Glibc
#endif

// What the TLS suites share: the test certificates, the tools found, an echo server.

let certificates = TestCertificates.shared
let hasOpenSSL = certificates != nil

/// testssl.sh, by the name it has on the PATH (Debian's package installs it as `testssl`), or nil.
let testssl: String? = {
    let directories = (ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin").split(separator: ":").map(String.init)
    return ["testssl.sh", "testssl"].first { name in
        directories.contains { FileManager.default.isExecutableFile(atPath: "\($0)/\(name)") }
    }
}()

/// Whether strace can trace a program here (installed, and ptrace allowed): the HTTPS close
/// test reads a daemon's failed system calls from it. Not under AddressSanitizer: its leak
/// check cannot run under ptrace, and the traced daemon would end with status 1.
let canStrace: Bool = {
    guard ProcessInfo.processInfo.environment["MAINSPRING_SANITIZER"] != "address",
          FileManager.default.isExecutableFile(atPath: "/usr/bin/strace") else { return false }
    let probe = try? runProgramSynchronously("/usr/bin/strace", arguments: ["-qq", "-o", "/dev/null", "/bin/true"])
    return probe.map { $0.status == 0 && !$0.crashedBySignal } ?? false
}()

/// A TLS echo server on a fresh 1-loop group: each line back as "echo: <line>"; the server
/// context counts handshakes.
final class TLSEchoServer: @unchecked Sendable {
    let group: EventLoopGroup
    let context: TLSServerContext
    let listener: Listener
    let serving: Task<Void, any Error>
    /// The TLS sessions of the connections served so far.
    let sessions = Locked<[TLSSession]>([])
    var port: UInt16 { listener.port }

    init(configuration: TLSServerConfiguration, loops: Int = 1, endpoint: Listener.Endpoint = .tcp()) async throws {
        group = try EventLoopGroup(loopCount: loops)
        context = try TLSServerContext(configuration: configuration)
        listener = try await Listener(endpoint, on: group.loops[0], group: group, tls: context)
        let listener = self.listener
        let sessions = self.sessions
        serving = Task(executorPreference: group.loops[0]) {
            try await withThrowingDiscardingTaskGroup { tasks in
                for try await connection in listener.connections {
                    if let session = connection.tls { sessions.withLock { $0.append(session) } }
                    tasks.addTask(executorPreference: connection.loop) {
                        do {
                            for try await event in connection.lines {
                                if case .line(let text) = event {
                                    if text == "quit" { break }
                                    if text == "who" {
                                        try await connection.send(line: connection.tls?.peerCertificate?.subject ?? "nobody")
                                    } else {
                                        try await connection.send(line: "echo: \(text)")
                                    }
                                }
                            }
                        } catch {}
                        connection.close()
                    }
                }
            }
        }
    }

    func stop() async {
        listener.close()
        _ = try? await serving.value
        await group.shutdown(gracePeriod: .seconds(2))
    }
}

/// The server configuration with the test CA's `localhost` certificate.
func serverConfiguration(_ certs: TestCertificates, alpn: [String] = [],
                                 clientAuthentication: TLSClientAuthentication = .none,
                                 handshakeTimeout: Duration = .seconds(10)) -> TLSServerConfiguration
{
    TLSServerConfiguration(certificates: [TLSCertificate(certificateFile: certs.serverCertificate, keyFile: certs.serverKey)],
                           applicationProtocols: alpn, clientAuthentication: clientAuthentication,
                           handshakeTimeout: handshakeTimeout)
}
