internal import CMainspringTLS

#if canImport(Glibc)
import Glibc
#endif

// OpenSSL's failures in words. Each says what happened once: OpenSSL's reason string for an
// error code ("certificate verify failed"), a system error's own text, or a named condition for
// an `SSL_get_error` code that came without one — never OpenSSL's placeholder "reason(N)", which
// is what `ERR_error_string_n` makes of a number that is no OpenSSL error (libevent puts
// `SSL_get_error`'s code, 1 or 5, among a bufferevent's errors).

/// A peer that closed its socket without close_notify (OpenSSL 3: "unexpected eof while
/// reading"), once the session is established.
let peerClosedWithoutCloseNotify = "the peer closed the connection without close_notify"

/// A peer that closed its socket before the handshake finished.
let peerClosedDuringHandshake = "the peer closed the connection during the handshake"

/// OpenSSL error codes — from this thread's queue, or a bufferevent's list — oldest first.
struct OpenSSLErrors {
    let codes: [UInt]

    /// This thread's queue, which is emptied.
    static func take() -> OpenSSLErrors {
        var codes: [UInt] = []
        while true {
            let code = ERR_get_error()
            if code == 0 { break }
            codes.append(code)
        }
        return OpenSSLErrors(codes: codes)
    }

    var isEmpty: Bool { codes.isEmpty }

    /// Whether one of them is OpenSSL 3's "unexpected eof while reading".
    var peerClosedWithoutCloseNotify: Bool { codes.contains { ms_err_is_unexpected_eof($0) != 0 } }

    /// What each code says, in order, each text once.
    var reasons: [String] {
        var reasons: [String] = []
        for code in codes {
            let reason = openSSLReason(code)
            if !reasons.contains(reason) { reasons.append(reason) }
        }
        return reasons
    }

    /// `reasons` as one line ("; " between them); empty when there are none.
    var text: String { reasons.joined(separator: "; ") }
}

/// One OpenSSL error code in words: its reason string, a system error's text, or — for a code
/// without a registered reason — its number and library.
func openSSLReason(_ code: UInt) -> String {
    if ms_err_is_unexpected_eof(code) != 0 { return peerClosedWithoutCloseNotify }
    let systemErrno = ms_err_system_errno(code)
    if systemErrno != 0 { return "system call failed: \(errnoText(systemErrno))" }
    if let reason = ERR_reason_error_string(code) { return String(cString: reason) }
    let library = ERR_lib_error_string(code).map { " (\(String(cString: $0)))" } ?? ""
    return "OpenSSL error 0x\(String(code, radix: 16, uppercase: true))\(library)"
}

/// OpenSSL's error queue (this thread's) in words, on one line, emptied; `fallback` when it is
/// empty.
func takeOpenSSLErrors(fallback: String = "unknown OpenSSL error") -> String {
    let text = OpenSSLErrors.take().text
    return text.isEmpty ? fallback : text
}

/// What an `SSL_get_error` code means, for a failure that left no reason in OpenSSL's queue.
/// `errno` is what the failing call left (for `SSL_ERROR_SYSCALL`; 0 when none).
func sslErrorCondition(_ code: Int32, errno: Int32) -> String {
    switch code {
    case SSL_ERROR_SYSCALL:
        // No reason and no errno: the socket just ended (OpenSSL 1.1's account of a peer gone
        // without close_notify; OpenSSL 3 says "unexpected eof while reading").
        return errno == 0 ? peerClosedWithoutCloseNotify : "system call failed: \(errnoText(errno))"
    case SSL_ERROR_ZERO_RETURN:
        return "the peer ended the TLS session (close_notify)"
    case SSL_ERROR_SSL:
        return "a TLS protocol error that OpenSSL gave no reason for"
    default:
        let names: [Int32: String] = [
            SSL_ERROR_WANT_READ: "SSL_ERROR_WANT_READ", SSL_ERROR_WANT_WRITE: "SSL_ERROR_WANT_WRITE",
            SSL_ERROR_WANT_X509_LOOKUP: "SSL_ERROR_WANT_X509_LOOKUP", SSL_ERROR_WANT_CONNECT: "SSL_ERROR_WANT_CONNECT",
            SSL_ERROR_WANT_ACCEPT: "SSL_ERROR_WANT_ACCEPT", SSL_ERROR_WANT_ASYNC: "SSL_ERROR_WANT_ASYNC",
            SSL_ERROR_WANT_ASYNC_JOB: "SSL_ERROR_WANT_ASYNC_JOB", SSL_ERROR_WANT_CLIENT_HELLO_CB: "SSL_ERROR_WANT_CLIENT_HELLO_CB",
        ]
        return "OpenSSL stopped without a reason, waiting for what Mainspring never supplies (\(names[code] ?? "SSL_get_error \(code)"))"
    }
}

/// `strerror`'s text for `code`.
private func errnoText(_ code: Int32) -> String { String(cString: strerror(code)) }
