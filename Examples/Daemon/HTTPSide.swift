import ExampleServices
import Foundation
import Mainspring
import MainspringHTTP
import MainspringTLS

// The daemon's HTTP side (`--http-port`, `--http-unix`): /metrics (with the daemon's own metrics),
// /healthz, POST /echo, /work?n=…, the WebSocket echo /ws/echo on the same loops as the line service. Self-contained: give it the group and the address.

/// Starts the HTTP side on `group` and prints its bound port; nil (after saying why on stderr)
/// when it cannot listen.
func startHTTPSide(group: EventLoopGroup, host: String, port: UInt16, tls: TLSServerContext?,
                   metrics: MetricsRegistry) async -> HTTPServer? {
    let exporter = LoopMetricsExporter(group: group, registry: metrics)
    let routes = HTTPService.routes(group: group, exporter: exporter)
    do {
        let configuration = HTTPServer.Configuration(host: host, port: port)
        let server = if let tls {
            try await HTTPServer(group: group, configuration: configuration, routes: routes, tls: tls)
        } else {
            try await HTTPServer(group: group, configuration: configuration, routes: routes)
        }
        let shown = host.contains(":") ? "[\(host)]" : host
        FileHandle.standardOutput.write(Data("\(tls == nil ? "http" : "https") listening on \(shown):\(server.port)\n".utf8))
        return server
    } catch {
        FileHandle.standardError.write(Data("mainspring-daemon: cannot listen for HTTP on \(host):\(port): \(error)\n".utf8))
        return nil
    }
}

/// Starts the HTTP side on a Unix stream socket at `path` (`--http-unix`) and prints where; nil
/// (after saying why on stderr) when it cannot listen (a live socket or another kind of file
/// there, say).
func startHTTPSide(group: EventLoopGroup, unixPath path: String, tls: TLSServerContext?,
                   metrics: MetricsRegistry) async -> HTTPServer? {
    let exporter = LoopMetricsExporter(group: group, registry: metrics)
    let routes = HTTPService.routes(group: group, exporter: exporter)
    do {
        var configuration = HTTPServer.Configuration()
        configuration.unixPath = path
        let server = if let tls {
            try await HTTPServer(group: group, configuration: configuration, routes: routes, tls: tls)
        } else {
            try await HTTPServer(group: group, configuration: configuration, routes: routes)
        }
        FileHandle.standardOutput.write(Data("\(tls == nil ? "http" : "https") listening on \(path)\n".utf8))
        return server
    } catch {
        FileHandle.standardError.write(Data("mainspring-daemon: cannot listen for HTTP on \(path): \(error)\n".utf8))
        return nil
    }
}
