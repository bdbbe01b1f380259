import Testing
import MainspringTestSupport
@testable import MainspringCore

#if canImport(Glibc)
import Glibc
#endif

@Suite("Descriptor calls")
struct DescriptorCallsTests {
    @Test("duplicateCloseOnExec points a number at another file, close-on-exec, in one step; a bad source fails with EBADF")
    func duplicateOnto() throws {
        let source = TestPipe()
        let target = TestPipe()
        let sourceIdentity = try #require(FileIdentity(of: source.readEnd))
        // The target number starts without close-on-exec, so the flag can only come from the call.
        #expect(fcntl(target.readEnd, F_SETFD, 0) == 0)
        #expect(duplicateCloseOnExec(source.readEnd, onto: target.readEnd))
        #expect(FileIdentity(of: target.readEnd) == sourceIdentity)
        #expect(fcntl(target.readEnd, F_GETFD) & FD_CLOEXEC != 0)
        #expect(FileIdentity(of: source.readEnd) == sourceIdentity, "the source stays open")
        // Data written to the source pipe now reads from the target's number.
        source.write("x")
        var byte: UInt8 = 0
        #expect(read(target.readEnd, &byte, 1) == 1 && byte == UInt8(ascii: "x"))

        #expect(!duplicateCloseOnExec(-1, onto: target.readEnd))
        #expect(errno == EBADF)
    }
}
