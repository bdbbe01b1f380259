import Foundation
import MainspringFuzzing
import Testing
import MainspringTestSupport

/// The committed seed corpus (Fuzz/Corpus/<harness>/), replayed through the fuzz harnesses on
/// every test run: the inputs that once mattered keep mattering.
@Suite("Fuzz corpus replay")
struct FuzzCorpusTests {
    static let corpus = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fuzz/Corpus")

    @Test("every committed input passes its harness", arguments: FuzzHarness.names)
    func replay(harness name: String) throws {
        let files = try FuzzHarness.corpusFiles(at: Self.corpus.appendingPathComponent(name).path)
        #expect(!files.isEmpty, "no corpus for \(name)")
        let harness = try #require(FuzzHarness.named(name))
        for file in files { harness(Array(try Data(contentsOf: URL(fileURLWithPath: file)))) }
    }
}
