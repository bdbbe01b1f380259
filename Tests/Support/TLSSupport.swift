import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// Certificates made at test time with the `openssl` command (no private key is committed):
/// a CA, a server certificate for `localhost` and `127.0.0.1` signed by it, one for another
/// host, an expired one, a self-signed one, a second CA and a client certificate from each.
/// Keys are EC P-256 (fast to make); made once per test process, in its own directory.
package struct TestCertificates: Sendable {
    package let directory: String
    package var caCertificate: String { directory + "/ca.pem" }
    package var serverCertificate: String { directory + "/server.pem" }
    package var serverKey: String { directory + "/server.key" }
    package var otherHostCertificate: String { directory + "/other.pem" }
    package var otherHostKey: String { directory + "/other.key" }
    package var expiredCertificate: String { directory + "/expired.pem" }
    package var expiredKey: String { directory + "/expired.key" }
    package var selfSignedCertificate: String { directory + "/self.pem" }
    package var selfSignedKey: String { directory + "/self.key" }
    package var clientCertificate: String { directory + "/client.pem" }
    package var clientKey: String { directory + "/client.key" }
    /// A second CA, and a client certificate from it (for "untrusted CA" tests).
    package var untrustedCACertificate: String { directory + "/ca2.pem" }
    package var untrustedClientCertificate: String { directory + "/client2.pem" }
    package var untrustedClientKey: String { directory + "/client2.key" }

    /// The process's certificates (made on first use); nil when `openssl` is not installed.
    package static let shared: TestCertificates? = make()

    private static func make() -> TestCertificates? {
        guard FileManager.default.isExecutableFile(atPath: "/usr/bin/openssl") else { return nil }
        let directory = uniqueTestPath("tls")
        try? FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let script = """
        set -e
        cd '\(directory)'
        key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:prime256v1 -out "$1" 2>/dev/null; }
        ca() { key "$1.key"; openssl req -x509 -new -key "$1.key" -out "$1.pem" -days 2 -subj "/CN=$2" 2>/dev/null; }
        cat > ca.cnf <<'CNF'
        [ ca ]
        default_ca = test
        [ test ]
        database = index.txt
        new_certs_dir = .
        serial = serial
        default_md = sha256
        policy = anything
        copy_extensions = copy
        unique_subject = no
        [ anything ]
        commonName = supplied
        CNF
        : > index.txt
        echo 1000 > serial
        ca ca "Mainspring Test CA"
        ca ca2 "Untrusted Test CA"
        issue() { # name subject san ca [startdate enddate]
            key "$1.key"
            openssl req -new -key "$1.key" -out "$1.csr" -subj "/CN=$2" -addext "subjectAltName=$3" 2>/dev/null
            if [ -n "$5" ]; then
                openssl ca -config ca.cnf -batch -cert "$4.pem" -keyfile "$4.key" -in "$1.csr" -out "$1.pem" \\
                    -startdate "$5" -enddate "$6" -notext 2>/dev/null
            else
                openssl ca -config ca.cnf -batch -cert "$4.pem" -keyfile "$4.key" -in "$1.csr" -out "$1.pem" -days 2 -notext 2>/dev/null
            fi
        }
        issue server localhost "DNS:localhost,IP:127.0.0.1,IP:::1" ca
        issue other elsewhere.example "DNS:elsewhere.example" ca
        issue expired localhost "DNS:localhost,IP:127.0.0.1" ca 20200101000000Z 20200102000000Z
        issue client "test client" "DNS:client.example" ca
        issue client2 "untrusted client" "DNS:client2.example" ca2
        key self.key
        openssl req -x509 -new -key self.key -out self.pem -days 2 -subj "/CN=localhost" -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" 2>/dev/null
        """
        guard let result = try? runProgramSynchronously("/bin/sh", arguments: ["-c", script]),
              result.status == 0, !result.crashedBySignal
        else { return nil }
        return TestCertificates(directory: directory)
    }
}
