import Foundation
import Testing
import Mainspring
import MainspringTestSupport
@testable import MainspringCore

#if canImport(Glibc)
import Glibc
#endif

/// Unix domain stream sockets: by path and in the abstract namespace, the file's mode, stale
/// and live files, removal on close, peer credentials, the async API over them, a Python peer.
@Suite("Unix domain sockets", .serialized)
struct UnixSocketTests {
    static func directory() throws -> String {
        let path = NSTemporaryDirectory() + "mainspring-unix-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        return path
    }

    static func echo(_ connection: Connection) {
        connection.readLines { event in
            if case .line(let text) = event { connection.writeLine(text) }
            if event == .endOfFile { connection.close() }
        }
    }

    @Test("listen and connect by path and by abstract name; the mode is set; credentials are ours; the file goes on close")
    func pathAndAbstract() async throws {
        let directory = try Self.directory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let path = directory + "/echo.sock"
        let abstract = "@mainspring-test-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        let results = try await onLoopThread { loop -> [String] in
            var results: [String] = []
            for address in [path, abstract] {
                nonisolated(unsafe) var serverCredentials: PeerCredentials?
                let listener = try Listener(.unix(path: address, mode: 0o600), on: loop) { connection in
                    serverCredentials = connection.peerCredentials
                    Self.echo(connection)
                }
                if address == path {
                    var status = stat()
                    #expect(lstat(path, &status) == 0)
                    #expect(status.st_mode & S_IFMT == S_IFSOCK)
                    #expect(status.st_mode & 0o777 == 0o600, "mode \(String(status.st_mode & 0o777, radix: 8))")
                    #expect(listener.localAddress == path)
                    // Not a stale socket: a live one is left alone.
                    #expect(throws: EventLoopError.self) { _ = try Listener(.unix(path: path), on: loop) { _ in } }
                }
                nonisolated(unsafe) var replies: [String] = []
                let client = try Connection.connect(unixPath: address, on: loop)
                client.readLines { if case .line(let text) = $0 { replies.append(text) } }
                client.writeLine("over \(address)")
                loop.spin(until: { replies.count == 1 }, timeout: .seconds(10))
                results += replies
                let own = PeerCredentials(pid: getpid(), uid: getuid(), gid: getgid())
                #expect(client.peerCredentials == own)
                #expect(serverCredentials == own)
                client.close()
                listener.close()
                loop.spin(until: { false }, timeout: .milliseconds(20))
                if address == path { #expect(access(path, F_OK) != 0, "the socket file outlived its listener") }
            }
            return results
        }
        #expect(results == ["over \(path)", "over \(abstract)"])
    }

    @Test("a stale socket file is replaced; a regular file, a long path, a missing directory, nobody listening: clear errors")
    func badPaths() async throws {
        let directory = try Self.directory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let stale = directory + "/stale.sock"
        // A socket bound and closed without unlinking: stale.
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        let address = try unixSocketAddress(stale)
        _ = address.withUnsafeBytes { bind(fd, $0.baseAddress!.assumingMemoryBound(to: sockaddr.self), socklen_t($0.count)) }
        close(fd)
        let regular = directory + "/file"
        _ = FileManager.default.createFile(atPath: regular, contents: Data("keep".utf8))
        let errors = try await onLoopThread { loop -> [EventLoopError?] in
            func error(_ body: () throws -> Void) -> EventLoopError? {
                do { try body(); return nil } catch let error as EventLoopError { return error } catch { return nil }
            }
            let replaced = try Listener(.unix(path: stale), on: loop) { Self.echo($0) }
            defer { replaced.close() }
            return [
                error { _ = try Listener(.unix(path: regular), on: loop) { _ in } },
                error { _ = try Listener(.unix(path: directory + "/" + String(repeating: "x", count: 120)), on: loop) { _ in } },
                error { _ = try Listener(.unix(path: directory + "/missing/dir.sock"), on: loop) { _ in } },
                error { _ = try Connection.connect(unixPath: directory + "/nobody.sock", on: loop) },
            ]
        }
        guard case .unixSocketPathInUse(let path, let reason)? = errors[0] else {
            Issue.record("a regular file gave \(String(describing: errors[0]))")
            return
        }
        #expect(path == regular && reason.contains("regular file"))
        #expect(try String(contentsOfFile: regular, encoding: .utf8) == "keep")
        if case .invalidAddress(let text)? = errors[1] { #expect(text.contains("107")) } else { Issue.record("\(String(describing: errors[1]))") }
        #expect(errors[2] == EventLoopError.system(function: "bind unix socket \(directory)/missing/dir.sock", errno: ENOENT))
        #expect(errors[3] == EventLoopError.system(function: "connect unix socket \(directory)/nobody.sock", errno: ENOENT))
    }

    @Test("async over a Unix socket: connections, lines, send with backpressure; a Python client")
    func asyncAndPython() async throws {
        let directory = try Self.directory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let path = directory + "/async.sock"
        let group = try EventLoopGroup(loopCount: 1)
        let loop = group.loops[0]
        let listener = try await Listener(.unix(path: path), on: loop)
        let server = Task(executorPreference: loop) {
            for try await connection in listener.connections {
                for try await event in connection.lines {
                    guard case .line(let text) = event else { break }
                    // A large reply: the output limit is met, send suspends until it drains.
                    try await connection.send(line: text == "big" ? String(repeating: "y", count: 3 << 20) : text)
                }
                connection.close()
            }
        }
        let client = try await Connection.connect(unixPath: path, on: loop, options: .init(maxLineLength: 4 << 20))
        try await client.send(line: "big")
        try await client.send(line: "small")
        var lines = client.lines.makeAsyncIterator()
        #expect(try await lines.next() == .line(String(repeating: "y", count: 3 << 20)))
        #expect(try await lines.next() == .line("small"))
        client.close()
        let python = try await onPlainThread { () -> String in
            try runProgramSynchronously("/usr/bin/env", arguments: ["python3", "-c", """
                import socket, sys
                s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.sendall(b"from python\\n")
                print(s.makefile().readline().strip())
                """, path]).stdout
        }
        #expect(python == "from python\n")
        listener.close()
        _ = try? await server.value
        await group.shutdown(gracePeriod: .seconds(2))
        #expect(access(path, F_OK) != 0)
    }
}
