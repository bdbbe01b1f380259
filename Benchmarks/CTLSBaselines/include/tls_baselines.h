// Plain-C TLS peers for mainspring-bench's `tls` scenario: a libevent + bufferevent_openssl line
// service and evhttp HTTPS server on one thread each (the handshakes run where libevent calls
// them), and a blocking OpenSSL client for the load generators (the same client drives both the
// Mainspring server and the C one).
#ifndef MAINSPRING_TLS_BASELINES_H
#define MAINSPRING_TLS_BASELINES_H

#include <stdint.h>

/// The daemon's ECHO protocol over TLS ("ECHO <text>" answered with "<text>\n"), on
/// 127.0.0.1 (an ephemeral port, written to `*port`), in a thread of its own, with the PEM
/// certificate chain and key of the given files. NULL if they cannot be loaded.
void *_Nullable ms_tls_echo_start(const char *_Nonnull certificate, const char *_Nonnull key, uint16_t *_Nonnull port);

/// The same service for `mainspring-bench --counts`: its thread dispatches outside
/// `ms_counted_region` (CBaselines) until `ms_tls_count_begin`, then inside it until
/// `ms_tls_server_stop`.
void *_Nullable ms_tls_count_echo_start(const char *_Nonnull certificate, const char *_Nonnull key,
                                        uint16_t *_Nonnull port);

/// Moves the server of `ms_tls_count_echo_start` into the counted region; returns once it is
/// there (so the next request sent is counted).
void ms_tls_count_begin(void *_Nonnull handle);

/// evhttp over TLS (bufferevent_openssl through evhttp's bevcb), `/hello` answered "hello\n".
void *_Nullable ms_tls_http_start(const char *_Nonnull certificate, const char *_Nonnull key, uint16_t *_Nonnull port);

/// Stops a server started by `ms_tls_echo_start` or `ms_tls_http_start` and waits for its thread.
void ms_tls_server_stop(void *_Nonnull handle);

/// A blocking TLS client: TCP connect to 127.0.0.1:`port`, full handshake, certificate checked
/// against `ca_file`. NULL on failure.
void *_Nullable ms_tls_client_connect(uint16_t port, const char *_Nonnull ca_file);

/// Writes all of `length` bytes; 0, or -1 when the connection failed.
int ms_tls_client_write(void *_Nonnull client, const void *_Nonnull bytes, int length);

/// Reads up to `capacity` bytes; the count, 0 at the end, -1 on failure.
int ms_tls_client_read(void *_Nonnull client, void *_Nonnull buffer, int capacity);

/// Sends close_notify and closes.
void ms_tls_client_close(void *_Nonnull client);

/// A handshake storm from the calling thread until `deadline_ns` (CLOCK_MONOTONIC): keeps
/// `in_flight` (at most 256) non-blocking connections handshaking to 127.0.0.1:`port` at once,
/// each closed as soon as its handshake is done and replaced by a new one. Returns the number of
/// handshakes completed.
int ms_tls_storm(uint16_t port, const char *_Nonnull ca_file, int in_flight, uint64_t deadline_ns);

#endif
