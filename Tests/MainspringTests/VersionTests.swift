import Foundation
import Mainspring
import MainspringTestSupport
import Testing

@Suite("Version")
struct VersionTests {
    /// CHANGELOG.md at the package root.
    static let changelog = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("CHANGELOG.md")

    @Test("Mainspring.version is major.minor.patch and is the newest release in CHANGELOG.md")
    func versionMatchesChangelog() throws {
        let parts = Mainspring.version.split(separator: ".", omittingEmptySubsequences: false)
        #expect(parts.count == 3 && parts.allSatisfy { UInt($0) != nil }, "not semantic: \(Mainspring.version)")

        let text = try String(contentsOf: Self.changelog, encoding: .utf8)
        let headings = text.split(separator: "\n").filter { $0.hasPrefix("## [") }
        #expect(headings.first == "## [Unreleased]", "the first section is for unreleased changes")
        let newest = headings.first { $0 != "## [Unreleased]" }
        #expect(newest?.hasPrefix("## [\(Mainspring.version)] - ") == true,
                "newest release in CHANGELOG.md: \(newest ?? "none"), Mainspring.version: \(Mainspring.version)")
    }
}
