import ExampleServices
import Testing
import MainspringTestSupport

/// Junk against every parser on the simulated network (`JunkSoak`) — TLS's record layer among
/// them —, two seeds each in the suite
/// (the benchmark `simulation-junk` runs a thousand): clear events and errors only, every byte
/// accounted for, intact units whole and in order, a clean exchange once the junk stops, nothing
/// leaked — and the seed replays the run.
@Suite struct JunkSoakTests {
    @Test(arguments: JunkSoak.Parser.allCases, [1, 2] as [UInt64])
    func everyParserTakesJunkWithClearErrors(parser: JunkSoak.Parser, seed: UInt64) async throws {
        // The tls parser's server certificate: the test CA's, for localhost.
        let certificate = TestCertificates.shared.map {
            JunkSoak.Certificate(certificateFile: $0.serverCertificate, keyFile: $0.serverKey, trustedCertificateFile: $0.caCertificate)
        }
        if parser == .tls {
            _ = try #require(certificate, "the tls parser needs the openssl command (make test-tools installs it)")
        }
        let (result, again) = try await onPlainThread {
            (try JunkSoak.run(parser, seed: seed, certificate: certificate),
             try JunkSoak.run(parser, seed: seed, certificate: certificate))
        }
        #expect(result.failures.isEmpty, "\(result.failures)")
        #expect(result.junkRuns > 10, "junk was injected: \(result.junkRuns) runs")
        #expect(result.intact > 0 && result.leakedSources == 0)
        #expect(result.outcomes == again.outcomes && result.junkBytes == again.junkBytes, "the seed replays the run")
    }
}
