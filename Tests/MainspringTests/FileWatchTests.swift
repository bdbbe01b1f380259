import Foundation
import Testing
import Mainspring
import MainspringTestSupport
@testable import MainspringCore

#if canImport(Glibc)
import Glibc
#endif

// File operations as the kernel sees them: one system call each (Foundation's file writing
// may write a temporary file and rename it, which is a different event).

/// Creates `path` empty (one IN_CREATE), or truncates it.
func createFile(_ path: String) {
    let fd = open(path, O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0o644)
    precondition(fd >= 0, "create \(path): errno \(errno)")
    close(fd)
}

/// Appends `text` to `path` (one IN_MODIFY).
func appendFile(_ path: String, _ text: String) {
    let fd = open(path, O_WRONLY | O_APPEND | O_CLOEXEC)
    precondition(fd >= 0, "open \(path): errno \(errno)")
    var bytes = Array(text.utf8)
    precondition(write(fd, &bytes, bytes.count) == bytes.count)
    close(fd)
}

/// Writes `text` to a temporary file beside `path` and renames it over `path`: an editor's save.
func replaceFile(_ path: String, _ text: String) {
    let temporary = path + ".tmp"
    createFile(temporary)
    appendFile(temporary, text)
    precondition(rename(temporary, path) == 0)
}

/// How many inotify descriptors this process holds.
func inotifyDescriptorCount() -> Int {
    let entries = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd")) ?? []
    return entries.filter {
        (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/fd/\($0)")) == "anon_inode:inotify"
    }.count
}

/// Runs `action`, then the loop until `events` holds `expected` more events (or 10 s passed);
/// returns those new events.
func step(_ loop: EventLoop, _ events: () -> [FileEvent], expecting expected: Int = 1, _ action: () -> Void)
    -> [FileEvent]
{
    let before = events().count
    action()
    _ = loop.spin(until: { events().count >= before + expected }, timeout: .seconds(10))
    return Array(events().dropFirst(before))
}

@Suite("File watching: inotify", .serialized)
struct FileWatchTests {
    @Test("a directory: created, modified, attributes, renamed, moved away, moved in, deleted — as callbacks")
    func directoryEvents() async throws {
        let directory = freshDirectory()
        let elsewhere = freshDirectory("elsewhere")
        let steps = try await onLoopThread { loop -> [[FileEvent]] in
            nonisolated(unsafe) var events: [FileEvent] = []
            let watcher = try loop.observeFile(at: directory) { events.append($0) }
            let a = directory + "/a"
            var steps: [[FileEvent]] = []
            steps.append(step(loop, { events }) { createFile(a) })
            steps.append(step(loop, { events }) { appendFile(a, "one\n") })
            steps.append(step(loop, { events }) { chmod(a, 0o600) })
            steps.append(step(loop, { events }) { rename(a, directory + "/b") })
            steps.append(step(loop, { events }) { rename(directory + "/b", elsewhere + "/b") })
            steps.append(step(loop, { events }) { rename(elsewhere + "/b", directory + "/c") })
            steps.append(step(loop, { events }) { unlink(directory + "/c") })
            steps.append(step(loop, { events }) { chmod(directory, 0o700) })
            watcher.cancel()
            return steps
        }
        #expect(steps == [
            [FileEvent(.created, path: directory + "/a")],
            [FileEvent(.modified, path: directory + "/a")],
            [FileEvent(.attributesChanged, path: directory + "/a")],
            [FileEvent(.renamed, path: directory + "/b", previousPath: directory + "/a")],
            [FileEvent(.movedAway, path: directory + "/b")],
            [FileEvent(.movedIn, path: directory + "/c")],
            [FileEvent(.deleted, path: directory + "/c")],
            [FileEvent(.attributesChanged, path: directory)],
        ])
    }

    @Test("a file: modified, attributes; replaced by a rename over it (one event) and still watched; deleted and re-created; moved away and back")
    func fileEvents() async throws {
        let directory = freshDirectory()
        let file = directory + "/config.json"
        createFile(file)
        let steps = try await onLoopThread { loop -> [[FileEvent]] in
            nonisolated(unsafe) var events: [FileEvent] = []
            let watcher = try loop.observeFile(at: file) { events.append($0) }
            var steps: [[FileEvent]] = []
            steps.append(step(loop, { events }) { appendFile(file, "{}") })
            steps.append(step(loop, { events }) { chmod(file, 0o600) })
            steps.append(step(loop, { events }) { replaceFile(file, "{\"a\": 1}") })
            steps.append(step(loop, { events }) { appendFile(file, "\n") })  // the new file is watched
            steps.append(step(loop, { events }) { replaceFile(file, "{\"a\": 2}") })  // and replaced again
            steps.append(step(loop, { events }) { unlink(file) })
            steps.append(step(loop, { events }) { createFile(file) })
            steps.append(step(loop, { events }) { appendFile(file, "again") })
            steps.append(step(loop, { events }) { rename(file, directory + "/saved") })
            steps.append(step(loop, { events }) { rename(directory + "/saved", file) })
            // Other names in the directory are not this watch's business.
            steps.append(step(loop, { events }) {
                createFile(directory + "/other")
                appendFile(directory + "/other", "x")
                appendFile(file, "!")
            })
            watcher.cancel()
            return steps
        }
        #expect(steps == [
            [FileEvent(.modified, path: file)],
            [FileEvent(.attributesChanged, path: file)],
            [FileEvent(.replaced, path: file)],
            [FileEvent(.modified, path: file)],
            [FileEvent(.replaced, path: file)],
            [FileEvent(.deleted, path: file)],
            [FileEvent(.created, path: file)],
            [FileEvent(.modified, path: file)],
            [FileEvent(.movedAway, path: file)],
            [FileEvent(.created, path: file)],
            [FileEvent(.modified, path: file)],
        ])
    }

    @Test("as an async sequence: the same events; dropping the sequence or cancelling its task removes the watch")
    func asyncSequence() async throws {
        let directory = freshDirectory()
        let file = directory + "/settings"
        createFile(file)
        let group = try EventLoopGroup(loopCount: 1)
        let loop = group.loops[0]
        /// Whether the loop's inotify descriptor is gone (its last watch removed), within 20 s.
        func hubCloses() async throws -> Bool {
            for _ in 0..<2_000 {
                if try await loop.submit({ loop.fileWatchHub == nil }) { return true }
                try await Task.sleep(for: .milliseconds(10))
            }
            return false
        }
        do {
            let events = try await loop.fileChanges(at: file)
            let consumer = Task {
                var seen: [FileEvent] = []
                for await event in events {
                    seen.append(event)
                    if seen.count == 3 { break }
                }
                return seen
            }
            appendFile(file, "a")
            replaceFile(file, "b")
            unlink(file)
            #expect(await consumer.value == [
                FileEvent(.modified, path: file), FileEvent(.replaced, path: file), FileEvent(.deleted, path: file),
            ])
        }
        #expect(try await hubCloses(), "the dropped sequence's watch was the loop's last: its descriptor closed")

        // A consumer that is cancelled while waiting: the sequence ends, the watch goes.
        let waiting = try await loop.fileChanges(at: directory)
        #expect(try await loop.submit { loop.fileWatchHub?.kernelWatchCount } == 1)
        let parked = Task {
            var count = 0
            for await _ in waiting { count += 1 }
            return count
        }
        parked.cancel()
        #expect(await parked.value == 0)
        #expect(try await hubCloses(), "the cancelled sequence's watch removed, and the descriptor")
        _ = waiting
        await group.shutdown(gracePeriod: .seconds(2))
    }

    @Test("one inotify descriptor per loop, shared by its watches; kernel watches removed on cancel, the descriptor with the last")
    func oneDescriptorPerLoop() async throws {
        let first = freshDirectory()
        let second = freshDirectory()
        createFile(first + "/file")
        let before = inotifyDescriptorCount()
        let counts = try await onLoopThread { loop -> [Int?] in
            var counts: [Int?] = []
            let a = try loop.observeFile(at: first) { _ in }
            let b = try loop.observeFile(at: first + "/file") { _ in }  // shares first's kernel watch
            let c = try loop.observeFile(at: second) { _ in }
            counts.append(inotifyDescriptorCount() - before)
            counts.append(loop.fileWatchHub?.kernelWatchCount)
            a.cancel()
            counts.append(loop.fileWatchHub?.kernelWatchCount)  // b still uses it
            b.cancel()
            counts.append(loop.fileWatchHub?.kernelWatchCount)
            c.cancel()
            counts.append(loop.fileWatchHub == nil ? 0 : 1)
            counts.append(inotifyDescriptorCount() - before)
            return counts
        }
        #expect(counts == [1, 2, 2, 1, 0, 0])
    }

    @Test("a missing path (or one under a missing directory) is a clear error naming it")
    func missingPath() async throws {
        let missing = uniqueTestPath("missing")
        try await onLoopThread { loop in
            #expect(throws: FileWatchError.cannotWatch(path: missing, errno: ENOENT)) {
                try loop.observeFile(at: missing) { _ in }
            }
            #expect(throws: FileWatchError.cannotWatch(path: missing + "/file", errno: ENOENT)) {
                try loop.fileChanges(at: missing + "/file")
            }
            let description = FileWatchError.cannotWatch(path: missing, errno: ENOENT).description
            #expect(description.contains(missing) && description.contains("No such file"), "\(description)")
            #expect(loop.fileWatchHub == nil, "no descriptor left behind by a failed watch")
        }
    }

    @Test("what the loop refuses is FileWatchError.loop: off its thread, shut down")
    func loopRefusals() async throws {
        let group = try EventLoopGroup(loopCount: 1)
        let loop = group.loops[0]
        let directory = FileManager.default.temporaryDirectory.path
        #expect(throws: FileWatchError.loop(.wrongThread(function: "EventLoop.observeFile(at:_:)"))) {
            try loop.observeFile(at: directory) { _ in }
        }
        #expect(throws: FileWatchError.loop(.wrongThread(function: "EventLoop.fileChanges(at:)"))) {
            try { () throws(FileWatchError) in try loop.fileChanges(at: directory) }()
        }
        await group.shutdown(gracePeriod: .seconds(2))
        await #expect(throws: FileWatchError.loop(.loopClosed)) { try await loop.fileChanges(at: directory) }
    }

    @Test("watchFile(at:) and fileEvents(at:) (deprecated) still throw EventLoopError.watchFailed and .wrongThread")
    func deprecatedSpellingsKeepTheirErrors() async throws {
        let missing = uniqueTestPath("missing")
        let expected = FileWatchError.cannotWatch(path: missing, errno: ENOENT).description
        let loop = try await onLoopThread { loop in
            let old: any FileWatchingBefore02 = loop
            let fromWatch = #expect(throws: EventLoopError.self) { try old.watchFile(at: missing) { _ in } }
            let fromEvents = #expect(throws: EventLoopError.self) { try old.fileEvents(at: missing) }
            for error in [fromWatch, fromEvents] {
                #expect(error.map(caseName) == "watchFailed" && error?.description == expected, "\(String(describing: error))")
            }
            let watcher = try old.watchFile(at: FileManager.default.temporaryDirectory.path) { _ in }
            watcher.cancel()
            return loop
        }
        let old: any FileWatchingBefore02 = loop
        #expect(throws: EventLoopError.wrongThread(function: "EventLoop.watchFile(at:_:)")) {
            try old.watchFile(at: missing) { _ in }
        }
        #expect(throws: EventLoopError.wrongThread(function: "EventLoop.fileEvents(at:)")) {
            try old.fileEvents(at: missing)
        }
    }

    @Test("a watched directory removed: watchedPathRemoved, the last event; the sequence ends")
    func directoryRemoved() async throws {
        let directory = freshDirectory()
        let other = freshDirectory()
        createFile(other + "/file")
        let (directoryEvents, fileEvents, hubGone) = try await onLoopThread { loop -> ([FileEvent], [FileEvent], Bool) in
            nonisolated(unsafe) var events: [FileEvent] = []
            nonisolated(unsafe) var fileEvents: [FileEvent] = []
            _ = try loop.observeFile(at: directory) { events.append($0) }
            _ = try loop.observeFile(at: other + "/file") { fileEvents.append($0) }
            _ = step(loop, { events }) { rmdir(directory) }
            _ = step(loop, { fileEvents }, expecting: 2) {
                unlink(other + "/file")
                rmdir(other)
            }
            _ = loop.spin(until: { loop.fileWatchHub == nil }, timeout: .seconds(10))
            return (events, fileEvents, loop.fileWatchHub == nil)
        }
        #expect(directoryEvents == [FileEvent(.watchedPathRemoved, path: directory)])
        #expect(fileEvents == [FileEvent(.deleted, path: other + "/file"), FileEvent(.watchedPathRemoved, path: other)])
        #expect(hubGone, "both watches ended: the loop's descriptor is closed")

        let again = freshDirectory()
        let group = try EventLoopGroup(loopCount: 1)
        let events = try await group.loops[0].fileChanges(at: again)
        rmdir(again)
        var seen: [FileEvent] = []
        for await event in events { seen.append(event) }
        #expect(seen == [FileEvent(.watchedPathRemoved, path: again)], "the sequence ended after it")
        await group.shutdown(gracePeriod: .seconds(2))
    }

    @Test("the kernel's queue overflowing is its own event; the watch goes on")
    func kernelOverflow() async throws {
        let limit = Int((try? String(contentsOfFile: "/proc/sys/fs/inotify/max_queued_events", encoding: .utf8))?
            .trimmingCharacters(in: .whitespacesAndNewlines) ?? "") ?? 16_384
        try #require(limit <= 200_000, "max_queued_events \(limit): too many to overflow in a test")
        let directory = freshDirectory()
        let (overflows, created) = try await onLoopThread { loop -> (Int, Bool) in
            nonisolated(unsafe) var events: [FileEvent] = []
            let watcher = try loop.observeFile(at: directory) { events.append($0) }
            // The loop does not run meanwhile: the kernel queues until it is full.
            for index in 0...(limit / 2 + 16) {
                let path = directory + "/f\(index)"
                createFile(path)
                unlink(path)
            }
            _ = loop.spin(until: { events.contains { $0.kind == .overflow } }, timeout: .seconds(20))
            let overflows = events.filter { $0.kind == .overflow }.count
            let after = step(loop, { events }) { createFile(directory + "/after") }
            watcher.cancel()
            return (overflows, after.contains(FileEvent(.created, path: directory + "/after")))
        }
        #expect(overflows == 1)
        #expect(created, "the watch still delivers after the overflow")
    }

    @Test("an async consumer 4,096 events behind: the rest is dropped and one overflow takes its place")
    func consumerOverflow() async throws {
        let directory = freshDirectory()
        let group = try EventLoopGroup(loopCount: 1)
        let loop = group.loops[0]
        let events = try await loop.fileChanges(at: directory)
        // A callback watch of the same directory on the same loop sees each read as it is
        // handed out: once it has the marker, so has the sequence's buffer.
        let marker = directory + "/marker"
        let sawMarker = Locked(false)
        let counter = WatcherBox()
        try await loop.submit {
            counter.watcher = try loop.observeFile(at: directory) { event in
                if event == FileEvent(.created, path: marker) { sawMarker.withLock { $0 = true } }
            }
        }
        let total = 5_000
        await onPlainThread {
            for index in 0..<total { createFile(directory + "/f\(index)") }
            createFile(marker)
        }
        #expect(await eventually { sawMarker.value })
        try await loop.submit {}
        var seen: [FileEvent] = []
        var iterator = events.makeAsyncIterator()
        while seen.count < FileEvents.limit + 1, let event = await iterator.next() { seen.append(event) }
        #expect(seen.prefix(FileEvents.limit).allSatisfy { $0.kind == .created })
        #expect(seen.last == FileEvent(.overflow, path: directory))
        // Taken: new events come through again.
        createFile(directory + "/later")
        var later: FileEvent?
        while let event = await iterator.next() {
            later = event
            if event.kind != .created || event.path == directory + "/later" { break }
        }
        #expect(later == FileEvent(.created, path: directory + "/later"))
        try await loop.submit { counter.watcher?.cancel() }
        await group.shutdown(gracePeriod: .seconds(2))
    }
}

typealias FileEvents = EventLoop.FileEvents

/// A watcher kept for its loop's thread (made and cancelled there).
final class WatcherBox: @unchecked Sendable {
    var watcher: Watcher?
}

/// The deprecated file-watch calls, reached through a protocol so that calling the deprecated spellings
/// in a test does not warn.
private protocol FileWatchingBefore02 {
    func watchFile(at path: String, _ handler: @escaping (FileEvent) -> Void) throws(EventLoopError) -> Watcher
    func fileEvents(at path: String) throws(EventLoopError) -> EventLoop.FileEvents
}

extension EventLoop: FileWatchingBefore02 {}

/// The name of an error's case, read without naming it (a deprecated case named in a test warns).
func caseName(_ error: EventLoopError) -> String {
    Mirror(reflecting: error).children.first?.label ?? "\(error)"
}
