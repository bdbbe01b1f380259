import ExampleServices
import Testing
import MainspringTestSupport

@Suite("Example services: command parsers and the prime sieve")
struct ExampleServicesTests {
    @Test("demo commands parse in any case, with clear errors for the rest")
    func demoCommands() {
        #expect(DemoCommand.parse("status") == .success(.status))
        #expect(DemoCommand.parse("  PAUSE ") == .success(.pause))
        #expect(DemoCommand.parse("chunk 50000") == .success(.chunk(50_000)))
        #expect(DemoCommand.parse("?") == .success(.help))
        #expect(DemoCommand.parse("") == nil)
        #expect(DemoCommand.parse(" \t ") == nil)
        #expect(DemoCommand.parse("frobnicate") == .failure(.unknown("frobnicate")))
        #expect(DemoCommand.parse("chunk") == .failure(.missingArgument("chunk")))
        #expect(DemoCommand.parse("chunk 0") == .failure(.invalidArgument("chunk", "0")))
        #expect(DemoCommand.parse("chunk many") == .failure(.invalidArgument("chunk", "many")))
        #expect(DemoCommand.parse("status please") == .failure(.unexpectedArgument("status")))
        #expect(DemoCommand.ParseError.unknown("x").description == "unknown command 'x'")
    }

    @Test("daemon requests parse; ECHO keeps its text verbatim; bad arguments are refused")
    func daemonCommands() {
        #expect(DaemonCommand.parse("ECHO hello  world ") == .success(.echo("hello  world ")))
        #expect(DaemonCommand.parse("echo") == .success(.echo("")))
        #expect(DaemonCommand.parse("time") == .success(.time))
        #expect(DaemonCommand.parse("SLEEP 250") == .success(.sleep(milliseconds: 250)))
        #expect(DaemonCommand.parse("WORK 12") == .success(.work(chunks: 12)))
        #expect(DaemonCommand.parse("QUIT") == .success(.quit))
        #expect(DaemonCommand.parse("") == .failure(.empty))
        #expect(DaemonCommand.parse("SLEEP") == .failure(.missingArgument("SLEEP")))
        #expect(DaemonCommand.parse("SLEEP -5") == .failure(.invalidArgument("SLEEP", "-5")))
        #expect(DaemonCommand.parse("WORK 0") == .failure(.invalidArgument("WORK", "0")))
        #expect(DaemonCommand.parse("LAUNCH") == .failure(.unknown("LAUNCH")))
        for command in [DaemonCommand.echo(" x "), .time, .sleep(milliseconds: 0), .work(chunks: 3), .stats, .quit] {
            #expect(DaemonCommand.parse(command.requestLine) == .success(command))
        }
    }

    @Test("the segmented sieve counts primes exactly, whatever the chunk size")
    func sieve() {
        for (limit, primes) in [(2, 0), (3, 1), (10, 4), (100, 25), (1_000, 168), (1_000_000, 78_498)] {
            for chunk in [1, 7, 1_000, 1 << 20] where chunk > 1 || limit <= 1_000 {
                var sieve = PrimeSieve(limit: limit)
                while !sieve.isDone { sieve.sieveNext(chunk) }
                #expect(sieve.count == primes, "π(\(limit)) with chunks of \(chunk)")
                #expect(sieve.progress == 1)
            }
        }
    }
}
