// The C surface of MainspringTLS: OpenSSL 3 (libssl-dev) and libevent's OpenSSL bufferevents
// (libevent_openssl, in libevent-dev). Only Sources/MainspringTLS/OpenSSL/ imports this module.
// Helpers here are limited to what Swift cannot import directly (OpenSSL's macros).
#ifndef MAINSPRING_TLS_SHIM_H
#define MAINSPRING_TLS_SHIM_H

// See CLibevent/shim.h: settle glibc's feature macros the way the other modules see them.
#include <features.h>

#include <openssl/ssl.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>

/// `SSL_CTX_set_min_proto_version` (a macro).
static inline int ms_ssl_ctx_set_min_version(SSL_CTX *_Nonnull ctx, int version) {
    return (int)SSL_CTX_set_min_proto_version(ctx, version);
}

/// `SSL_CTX_set_max_proto_version` (a macro).
static inline int ms_ssl_ctx_set_max_version(SSL_CTX *_Nonnull ctx, int version) {
    return (int)SSL_CTX_set_max_proto_version(ctx, version);
}

/// `SSL_set_tlsext_host_name` (a macro): the name sent as SNI.
static inline int ms_ssl_set_server_name(SSL *_Nonnull ssl, const char *_Nonnull name) {
    return (int)SSL_set_tlsext_host_name(ssl, name);
}

/// `SSL_CTX_set_tlsext_servername_callback` and its argument (macros).
static inline void ms_ssl_ctx_set_server_name_callback(SSL_CTX *_Nonnull ctx,
                                                       int (*_Nullable callback)(SSL *_Nonnull, int *_Nonnull, void *_Nullable),
                                                       void *_Nullable argument) {
    SSL_CTX_set_tlsext_servername_callback(ctx, callback);
    SSL_CTX_set_tlsext_servername_arg(ctx, argument);
}

/// The options every Mainspring context gets: no renegotiation (a client asking for one gets an
/// alert), no compression (CRIME), the server's cipher order, and buffers released while a
/// connection is idle (some 34 KB a connection otherwise).
static inline void ms_ssl_ctx_harden(SSL_CTX *_Nonnull ctx) {
    SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION | SSL_OP_CIPHER_SERVER_PREFERENCE);
    SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
}

/// The errno an OpenSSL error code carries when it is a system error (`ERR_SYSTEM_ERROR`,
/// `ERR_SYSTEM_MASK`: macros), else 0.
static inline int ms_err_system_errno(unsigned long code) {
    return ERR_SYSTEM_ERROR(code) ? (int)(code & ERR_SYSTEM_MASK) : 0;
}

/// The library of an OpenSSL error code (`ERR_GET_LIB`, over macros). 0 for a number that is
/// no OpenSSL error: libevent puts `SSL_get_error`'s code (`SSL_ERROR_SSL` = 1,
/// `SSL_ERROR_SYSCALL` = 5) among a bufferevent's OpenSSL errors.
static inline int ms_err_library(unsigned long code) { return ERR_GET_LIB(code); }

/// Whether an OpenSSL error code is "unexpected eof while reading" (OpenSSL 3): the peer closed
/// its socket without close_notify (`ERR_GET_REASON`, `SSL_R_UNEXPECTED_EOF_WHILE_READING`).
static inline int ms_err_is_unexpected_eof(unsigned long code) {
#ifdef SSL_R_UNEXPECTED_EOF_WHILE_READING
    return !ERR_SYSTEM_ERROR(code) && ERR_GET_LIB(code) == ERR_LIB_SSL
        && ERR_GET_REASON(code) == SSL_R_UNEXPECTED_EOF_WHILE_READING;
#else
    return 0;
#endif
}

/// `SSL_CTX_set_dh_auto` (a macro): DHE key exchange with a built-in RFC 7919 group sized to
/// the certificate's key, for the DHE suites of the cipher list.
static inline long ms_ssl_ctx_set_dh_auto(SSL_CTX *_Nonnull ctx) { return SSL_CTX_set_dh_auto(ctx, 1); }

/// `XN_FLAG_RFC2253` (a composite macro): names printed as "CN=localhost,O=…".
static const unsigned long ms_xn_flag_rfc2253 = XN_FLAG_RFC2253;

/// `SSL_CTX_set_mode` (a macro).
static inline long ms_ssl_ctx_set_mode(SSL_CTX *_Nonnull ctx, long mode) { return SSL_CTX_set_mode(ctx, mode); }

/// `SSL_set_mode(ssl, SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER)` (macros): a write that blocked may be
/// finished from another copy of the same bytes (`TLSLayer.writeNow`).
static inline void ms_ssl_accept_moving_write_buffer(SSL *_Nonnull ssl) {
    SSL_set_mode(ssl, SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
}

/// `SSL_CTX_set_session_cache_mode` (a macro).
static inline long ms_ssl_ctx_set_session_cache_mode(SSL_CTX *_Nonnull ctx, long mode) {
    return SSL_CTX_set_session_cache_mode(ctx, mode);
}

/// `sk_GENERAL_NAME_num` / `sk_GENERAL_NAME_value` (macros over OpenSSL's stacks).
static inline int ms_general_names_count(const GENERAL_NAMES *_Nullable names) { return sk_GENERAL_NAME_num(names); }
static inline const GENERAL_NAME *_Nullable ms_general_name_at(const GENERAL_NAMES *_Nonnull names, int index) {
    return sk_GENERAL_NAME_value(names, index);
}
static inline void ms_general_names_free(GENERAL_NAMES *_Nullable names) { GENERAL_NAMES_free(names); }

/// `sk_X509_NAME` for the CA names a server sends when it asks for a client certificate.
static inline STACK_OF(X509_NAME) *_Nullable ms_load_client_ca_names(const char *_Nonnull file) {
    return SSL_load_client_CA_file(file);
}

/// The type of a `GENERAL_NAME` (DNS, IP, …) and its value.
static inline int ms_general_name_type(const GENERAL_NAME *_Nonnull name) { return name->type; }
static inline const ASN1_STRING *_Nullable ms_general_name_dns(const GENERAL_NAME *_Nonnull name) {
    return name->type == GEN_DNS ? name->d.dNSName : NULL;
}
static inline const ASN1_OCTET_STRING *_Nullable ms_general_name_ip(const GENERAL_NAME *_Nonnull name) {
    return name->type == GEN_IPADD ? name->d.iPAddress : NULL;
}

#endif
