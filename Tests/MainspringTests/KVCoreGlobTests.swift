import Testing
import KVCore
import MainspringTestSupport

@Suite("KVCore glob matching (Redis's stringmatchlen)")
struct KVCoreGlobTests {
    static let cases: [(pattern: String, string: String, matches: Bool)] = [
        ("*", "", true), ("*", "anything", true), ("", "", true), ("", "a", false),
        ("h?llo", "hello", true), ("h?llo", "hllo", false), ("h*llo", "hllo", true), ("h*llo", "heeeello", true),
        ("h*llo", "hellox", false), ("h[ae]llo", "hallo", true), ("h[ae]llo", "hillo", false),
        ("h[^e]llo", "hallo", true), ("h[^e]llo", "hello", false), ("h[a-b]llo", "hbllo", true),
        ("h[a-b]llo", "hcllo", false), ("h[b-a]llo", "hallo", true), ("h\\*llo", "h*llo", true),
        ("h\\*llo", "hello", false), ("h[\\]]llo", "h]llo", true), ("h[\\-]llo", "h-llo", true),
        ("a*b*c", "aXXbYYc", true), ("a*b*c", "aXXbYY", false), ("*a", "bbba", true), ("a*", "a", true),
        ("a**", "a", true), ("a?", "a", false), ("[abc", "a", true), ("[abc", "b", true), ("[abc", "d", false),
        ("ab\\", "ab\\", true), ("k[0-9]*", "k1x", true), ("k[0-9]*", "kx", false), ("*.*", "file.txt", true),
        ("user:*:name", "user:42:name", true), ("user:*:name", "user:42:age", false),
    ]

    @Test("patterns match as in Redis")
    func table() {
        for entry in Self.cases {
            #expect(GlobPattern(kvBytes(entry.pattern)).matches(kvBytes(entry.string)) == entry.matches,
                    "\(entry.pattern) ~ \(entry.string)")
        }
    }

    @Test("matching is binary-safe and optionally case-insensitive")
    func binaryAndCase() {
        #expect(GlobPattern([0, 42]).matches([0, 1, 2]))
        #expect(!GlobPattern([0, 42]).matches([1, 0]))
        #expect(GlobPattern(kvBytes("MAX*"), ignoresCase: true).matches(kvBytes("maxclients")))
        #expect(!GlobPattern(kvBytes("MAX*")).matches(kvBytes("maxclients")))
        #expect(GlobPattern(kvBytes("[A-C]x"), ignoresCase: true).matches(kvBytes("bx")))
    }

    @Test("ranges compare bytes as signed chars, as Redis on x86-64")
    func signedRanges() {
        // 0xE9 is negative as a signed char, so it is below 'a' and inside [\x80-z] written backwards.
        #expect(!GlobPattern(kvBytes("[a-z]")).matches([0xE9]))
        #expect(GlobPattern([91, 0x80, 45, 122, 93]).matches([0xE9]))
    }

    @Test("a pathological pattern finishes quickly (no exponential backtracking)")
    func pathological() {
        let pattern = GlobPattern(kvBytes(String(repeating: "a*", count: 30) + "b"))
        #expect(!pattern.matches(kvBytes(String(repeating: "a", count: 2000))))
    }
}
