import Foundation

/// An outside server the benchmarks compare against (nginx, nghttpd), started as a process of
/// its own. Neither can be told to pick a free port, so ports below the ephemeral range are
/// tried until one binds (never a port another process may be given).
final class OutsidePeer {
    let port: UInt16
    private let process: Process

    /// Starts `executable` with `arguments(port)` (after `prepare(port)`, for a configuration
    /// file that names it) and returns once it accepts connections on that port; tries up to 20
    /// ports, each for up to 2 s (one the peer cannot bind makes it exit). Nil when it never
    /// serves.
    init?(executable: String, prepare: (UInt16) -> Void = { _ in }, arguments: (UInt16) -> [String]) {
        var generator = SystemRandomNumberGenerator()
        for _ in 0..<20 {
            let candidate = UInt16.random(in: 20_000...29_999, using: &generator)
            prepare(candidate)
            let process = Process()
            process.executableURL = URL(fileURLWithPath: executable)
            process.arguments = arguments(candidate)
            process.standardOutput = FileHandle.nullDevice
            process.standardError = FileHandle.nullDevice
            guard (try? process.run()) != nil else { return nil }
            for _ in 0..<200 where process.isRunning {
                if let client = BenchClient(port: candidate) {
                    _ = client
                    self.port = candidate
                    self.process = process
                    return
                }
                usleep(10_000)
            }
            if process.isRunning { process.terminate() }
            process.waitUntilExit()
        }
        return nil
    }

    /// The path of `name` on the PATH or in one of `places`, if it is installed.
    static func find(_ name: String, in places: [String]) -> String? {
        findExecutable(name) ?? places.first { FileManager.default.isExecutableFile(atPath: $0) }
    }

    /// CPU time (user and system, µs) the peer's process and its children (nginx's worker) have
    /// used so far, from `/proc`.
    var cpuMicroseconds: UInt64 {
        var total: UInt64 = 0
        let ticks = UInt64(sysconf(Int32(_SC_CLK_TCK)))
        let children = (try? String(contentsOfFile: "/proc/\(process.processIdentifier)/task/\(process.processIdentifier)/children",
                                    encoding: .utf8)) ?? ""
        let pids = [process.processIdentifier] + children.split(separator: " ").compactMap { Int32($0) }
        for pid in pids {
            guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
                  let close = stat.lastIndex(of: ")")
            else { continue }
            let fields = stat[stat.index(after: close)...].split(separator: " ")
            // Fields 14 and 15 of the whole line (utime, stime): 12 and 13 after the name.
            if fields.count > 13, let user = UInt64(fields[11]), let system = UInt64(fields[12]) {
                total += (user + system) * 1_000_000 / ticks
            }
        }
        return total
    }

    func stop() {
        process.terminate()
        process.waitUntilExit()
    }
}

extension OutsidePeer {
    /// nginx (Debian's `nginx-light`) as the http scenario's peer: one worker process, `return
    /// 200 "hello\n"` on `/hello`, access log off, its configuration, pid file and temporary
    /// folders under `.build/bench-nginx`. Nil when nginx is not installed or does not start.
    static func nginx() -> OutsidePeer? {
        guard let nginx = find("nginx", in: ["/usr/sbin/nginx", "/usr/local/sbin/nginx"]) else { return nil }
        let folder = URL(fileURLWithPath: FileManager.default.currentDirectoryPath).appendingPathComponent(".build/bench-nginx")
        try? FileManager.default.createDirectory(at: folder.appendingPathComponent("tmp"), withIntermediateDirectories: true)
        let configuration = folder.appendingPathComponent("nginx.conf")
        return OutsidePeer(executable: nginx, prepare: { port in
            try? nginxConfiguration(folder: folder.path, port: port).write(to: configuration, atomically: true, encoding: .utf8)
        }, arguments: { _ in
            ["-p", folder.path, "-c", configuration.path, "-e", folder.appendingPathComponent("error.log").path]
        })
    }

    private static func nginxConfiguration(folder: String, port: UInt16) -> String {
        """
        worker_processes 1;
        daemon off;
        master_process on;
        pid \(folder)/nginx.pid;
        error_log \(folder)/error.log warn;
        events { worker_connections 1024; }
        http {
            access_log off;
            client_body_temp_path \(folder)/tmp/body;
            proxy_temp_path \(folder)/tmp/proxy;
            fastcgi_temp_path \(folder)/tmp/fastcgi;
            uwsgi_temp_path \(folder)/tmp/uwsgi;
            scgi_temp_path \(folder)/tmp/scgi;
            keepalive_requests 1000000;
            server {
                listen 127.0.0.1:\(port);
                location = /hello { default_type text/plain; return 200 "hello\\n"; }
            }
        }
        """
    }
}
