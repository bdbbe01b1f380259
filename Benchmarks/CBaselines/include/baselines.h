// Plain-C libevent loops that mainspring-bench measures Mainspring against, side by side.
// Each function builds its own event_base, runs one scenario to completion and returns figures.
#ifndef MAINSPRING_BASELINES_H
#define MAINSPRING_BASELINES_H

#include <stdint.h>

/// post-local: one event re-activated with event_active() from its own callback `count` times.
/// `max_dispatch_us` > 0 sets event_config_set_max_dispatch_interval (the loop polls at least
/// that often); 0 means never poll while work is active. Returns elapsed seconds.
double ms_baseline_post_local(int64_t count, int max_dispatch_us);

/// post-remote: a producer thread posts `count` items into a mutex-protected queue; the loop
/// thread takes whole batches when an eventfd (written on the empty-to-non-empty transition)
/// wakes it. Returns elapsed seconds; `*wakeups` receives the number of eventfd wake-ups.
double ms_baseline_post_remote(int64_t count, int64_t *wakeups);

/// timers: a persistent timer every `interval_us` for `duration_ms` on a precise-timer base.
/// Writes each firing's lateness behind its ideal deadline (start + k × interval), in
/// nanoseconds, into `lateness_ns` (capacity `capacity`). Returns the number of firings.
int64_t ms_baseline_timers(int interval_us, int duration_ms, int64_t *lateness_ns, int64_t capacity);

/// daemon: a plain libevent line service on 127.0.0.1 (an ephemeral port, written to `*port`)
/// in a thread of its own: bufferevents, `evbuffer_readln`, "ECHO <text>" answered with
/// "<text>\n", anything else with "ERR\n". Returns a handle for `ms_baseline_echo_stop`.
void *ms_baseline_echo_start(uint16_t *port);

/// unix: the same line service on a Unix stream socket at `path` (a stale file there is
/// removed first). Returns a handle for `ms_baseline_echo_stop`, or NULL when it cannot listen.
/// The caller removes the file after stopping it.
void *ms_baseline_echo_start_unix(const char *path);

/// Stops the service started by `ms_baseline_echo_start` (or `_unix`) and waits for its thread.
void ms_baseline_echo_stop(void *handle);

/// actor-hop's floor: two threads, each with its own event_base (precise timers, like
/// Mainspring's), ping-pong `count` round trips through two eventfds — the kernel cost of any
/// hand-off between two sleeping loop threads. Returns elapsed seconds.
double ms_baseline_pingpong(int64_t count);

/* ---- Cost counts (`mainspring-bench --counts`, under valgrind's callgrind) ---- */

/// Runs `body(context)` on the calling thread. Does nothing else: it marks the region that
/// `valgrind --tool=callgrind --collect-atstart=no --toggle-collect=ms_counted_region` counts
/// (counting is per thread: on while this thread is inside the call, off again after).
void ms_counted_region(void (*body)(void *), void *context);

/// post-local as `ms_baseline_post_local`, with the chain (from the first `event_active` to the
/// last callback) run inside `ms_counted_region`.
void ms_count_post_local(int64_t count, int max_dispatch_us);

/// post-remote's queue: two uncounted rounds of `warmup` items (so both swapped arrays have
/// their capacity), then `count` items with the producer's pushes and the loop's dispatch each
/// inside `ms_counted_region`. `producer_first` != 0: the producer pushes all its items before
/// the loop starts (one wake-up, deterministic); 0: both run at once, as in the timed scenario.
/// Returns the counted round's eventfd wake-ups.
int64_t ms_count_post_remote(int64_t count, int64_t warmup, int producer_first);

/// The daemon's C line service as `ms_baseline_echo_start`, with the service thread's whole
/// `event_base_dispatch` (accepting included) inside `ms_counted_region`. Stop it with
/// `ms_baseline_echo_stop`.
void *ms_count_echo_start(uint16_t *port);

/// http: a plain-C evhttp server on 127.0.0.1 (an ephemeral port, written to `*port`) on a
/// thread of its own, with `/hello`, `/healthz` and `/work?n=` (n units of `ms_baseline_work_unit`
/// computed inline in the callback, answered `result <n> <checksum>`). Returns a handle for
/// `ms_baseline_http_stop`.
void *ms_baseline_http_start(uint16_t *port);

/// Stops the server started by `ms_baseline_http_start` (or `ms_count_http_start`) and waits
/// for its thread.
void ms_baseline_http_stop(void *handle);

/// CPU time (user and system, ns) the thread of the server started by `ms_baseline_http_start`
/// has used so far.
uint64_t ms_baseline_http_cpu_ns(void *handle);

/// The C evhttp server as `ms_baseline_http_start`, with the server thread's whole
/// `event_base_dispatch` (accepting included) inside `ms_counted_region`.
void *ms_count_http_start(uint16_t *port);

/// One unit of /work: the same arithmetic as ExampleServices' `WorkUnit.run`.
uint64_t ms_baseline_work_unit(uint64_t seed, uint64_t checksum);

/* ---- Processes (process_baseline.c) and the HTTP client (http_client_baseline.c) ---- */

/// spawn: `posix_spawn` of `path` (no arguments; stdin and stdout /dev/null, stderr inherited)
/// and `waitpid` for it, one child after the other, for `duration_ms`. No libevent: a C program
/// that runs children one at a time needs none. Returns the children that exited with status 0
/// (-1 if a spawn or an exit status failed); `*seconds` receives the time taken.
int64_t ms_baseline_spawn(const char *path, int64_t duration_ms, double *seconds);

/// child-output: spawns `path argument` (`yes <line>`) with stdout a pipe, reads the pipe
/// through a bufferevent on an event_base of its own and splits it with `evbuffer_readln`
/// (a malloc'd line each, freed) until `volume` bytes of lines have arrived; then closes the
/// pipe, sends SIGTERM and reaps the child. Returns the seconds from the spawn to the last
/// line (-1 on failure); `*lines` receives the lines read.
double ms_baseline_child_output(const char *path, const char *argument, int64_t volume, int64_t *lines);

/// http-client: `connections` evhttp_connections to 127.0.0.1:`port` on an event_base of the
/// calling thread, each keeping one `GET /hello` in flight (the next made in the previous
/// one's completion callback, keep-alive). Counts the responses with status 200 completed in
/// the `duration_ms` after `warmup_ms`; `*seconds` receives the measured time, `*failures` the
/// requests that failed (whole run).
int64_t ms_baseline_http_client(uint16_t port, int connections, int warmup_ms, int duration_ms, double *seconds,
                                int64_t *failures);

/// Counted: one evhttp_connection to `port`, `warmup` sequential `GET /hello` requests, then
/// `count` more inside `ms_counted_region` (each made from the previous one's completion).
/// Returns the number of failed requests.
int64_t ms_count_http_client(uint16_t port, int64_t warmup, int64_t count);

/* ---- udp (socket_baselines.c) ---- */

/// udp: a plain-C libevent UDP echo server on 127.0.0.1 (an ephemeral port, written to `*port`)
/// on a thread of its own: a persistent read event; each readiness echoes up to 64 datagrams —
/// one `recvfrom` and one `sendto` each when `use_mmsg` is 0, batches of 32 per `recvmmsg` and
/// one `sendmmsg` per batch otherwise. Returns a handle for `ms_baseline_udp_echo_stop`.
void *ms_baseline_udp_echo_start(int use_mmsg, uint16_t *port);

/// Stops the server started by `ms_baseline_udp_echo_start` and waits for its thread.
void ms_baseline_udp_echo_stop(void *handle);

/// udp's load, the same for every server: a connected UDP socket on the calling thread keeps
/// `window` datagrams of `payload` bytes in flight to 127.0.0.1:`port` for `duration_ms`
/// (`sendmmsg` to refill, `recvmmsg` to take echoes). Loopback drops under overload: after 5 ms
/// without an echo the window counts as lost and is sent again (`*timeouts_out` counts those).
/// Returns the echoes received; `*sent_out` receives the datagrams sent.
int64_t ms_udp_echo_client(uint16_t port, int window, int payload, int duration_ms, int64_t *sent_out,
                           int64_t *timeouts_out);

/* ---- websocket (echo_client.c): the load both of its servers get, and a counting relay ---- */

/// What `ms_echo_client_*` send: a line (the payload and "\n"), or after the WebSocket opening
/// handshake one masked text or binary frame with the payload. The echo expected back: the
/// same line, or one unmasked frame of the same opcode and payload.
enum {
    MS_ECHO_LINE = 0,
    MS_ECHO_WS_TEXT = 1,
    MS_ECHO_WS_BINARY = 2,
};

/// A blocking loopback TCP connection to 127.0.0.1:`port` (TCP_NODELAY). For the WebSocket
/// kinds it also makes the opening handshake (`GET path`, the fixed key of RFC 6455 §1.3) and
/// checks the answer (`101` with the matching `Sec-WebSocket-Accept`). Returns the descriptor,
/// or -1.
int ms_echo_client_open(uint16_t port, int kind, const char *path);

/// One echo on a connection from `ms_echo_client_open`: sends `payload` (`length` bytes; no
/// "\n" in it for a line) as `kind` says, reads the reply and compares it byte for byte.
/// Returns 0 when it is the echo, -1 otherwise.
int ms_echo_client_roundtrip(int fd, int kind, const uint8_t *payload, int length);

/// Closes a connection from `ms_echo_client_open`; a WebSocket first sends a close frame (1000).
void ms_echo_client_close(int fd, int kind);

/// The websocket scenario's load, on the calling thread: `clients` connections from
/// `ms_echo_client_open`, one epoll set, each keeping one message in flight (sent again as soon
/// as its echo has arrived and compared equal). Counts the echoes completed in the
/// `duration_ms` after `warmup_ms`; `*seconds` receives the measured time, `*failures` the
/// connections that failed (refused, a wrong echo, closed early). Returns the echoes counted.
int64_t ms_echo_client_run(uint16_t port, int kind, const char *path, const uint8_t *payload, int length, int clients,
                           int warmup_ms, int duration_ms, double *seconds, int64_t *failures);

/// A TCP relay from 127.0.0.1:`*port` (an ephemeral port, written there) to
/// 127.0.0.1:`target_port`, for one connection, on a thread of its own; it counts the bytes each
/// way after the first "\r\n\r\n" of that direction (after an HTTP head: a WebSocket's frames).
/// Returns a handle for `ms_counting_relay_stop`.
void *ms_counting_relay_start(uint16_t target_port, uint16_t *port);

/// Stops the relay (closing both sides if they are still open), waits for its thread, and
/// writes the bytes it counted client → server and server → client.
void ms_counting_relay_stop(void *handle, int64_t *client_to_server, int64_t *server_to_client);

#endif
