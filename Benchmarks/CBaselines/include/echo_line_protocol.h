// The daemon's line protocol as the C baselines serve it, on any bufferevent (plain sockets in
// baselines.c, OpenSSL in CTLSBaselines): one implementation, so the plain and TLS baselines
// answer exactly the same thing.
#ifndef MAINSPRING_ECHO_LINE_PROTOCOL_H
#define MAINSPRING_ECHO_LINE_PROTOCOL_H

struct bufferevent;

/// A bufferevent read callback: each LF-terminated line "ECHO <text>" is answered with
/// "<text>\n", anything else with "ERR\n". `ctx` is not used.
void ms_echo_line_read_cb(struct bufferevent *bev, void *ctx);

/// A bufferevent event callback: frees the bufferevent (closing its socket, with
/// BEV_OPT_CLOSE_ON_FREE) at end of input or on an error. `ctx` is not used.
void ms_echo_line_event_cb(struct bufferevent *bev, short what, void *ctx);

#endif
