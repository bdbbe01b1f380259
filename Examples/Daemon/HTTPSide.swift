import ExampleServices
import Foundation
import Mainspring
import MainspringHTTP

// The daemon's HTTP side (`--http-port`): /metrics, /healthz, POST /echo, /work?n=… on the same
// loops as the line service. Self-contained: give it the group and the address.

/// Starts the HTTP side on `group` and prints its bound port. Exits the process (status 1) when
/// it cannot listen.
func startHTTPSide(group: EventLoopGroup, host: String, port: UInt16) async -> HTTPServer {
    let exporter = LoopMetricsExporter(group: group)
    let routes = HTTPService.routes(group: group, exporter: exporter)
    do {
        let server = try await HTTPServer(group: group, configuration: .init(host: host, port: port), routes: routes)
        let shown = host.contains(":") ? "[\(host)]" : host
        FileHandle.standardOutput.write(Data("http listening on \(shown):\(server.port)\n".utf8))
        return server
    } catch {
        FileHandle.standardError.write(Data("mainspring-daemon: cannot listen for HTTP on \(host):\(port): \(error)\n".utf8))
        exit(1)
    }
}
