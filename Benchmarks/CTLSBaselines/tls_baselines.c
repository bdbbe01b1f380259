#include "tls_baselines.h"

#include "baselines.h"
#include "echo_line_protocol.h"
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/listener.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

struct tls_server {
    struct event_base *base;
    struct evconnlistener *listener;
    struct evhttp *http;
    struct event *stop_event;
    SSL_CTX *ctx;
    int stop_pipe[2];
    pthread_t thread;
    /* A counted server (`ms_tls_count_echo_start`): `ms_tls_count_begin` writes to count_pipe,
       the thread leaves its uncounted dispatch and posts `counting` from inside the region. */
    struct event *count_event;
    int count_pipe[2];
    sem_t counting;
};

/* A write to a socket the peer has closed fails with EPIPE instead of killing the process, as
   Mainspring arranges for its own sockets (OpenSSL writes with write(2), not MSG_NOSIGNAL).
   Without it a run of the C variants alone (MAINSPRING_BENCH_VARIANTS=libevent-c) died of
   SIGPIPE: only Mainspring's first connection had set it before. */
static void ignore_sigpipe(void) {
    signal(SIGPIPE, SIG_IGN);
}

static SSL_CTX *server_context(const char *certificate, const char *key) {
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    if (!ctx) return NULL;
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION | SSL_OP_CIPHER_SERVER_PREFERENCE);
    SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
    if (SSL_CTX_use_certificate_chain_file(ctx, certificate) != 1
        || SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1
        || SSL_CTX_check_private_key(ctx) != 1) {
        SSL_CTX_free(ctx);
        return NULL;
    }
    unsigned char id[] = "mainspring-c";
    SSL_CTX_set_session_id_context(ctx, id, sizeof id - 1);
    return ctx;
}

static void stop_cb(evutil_socket_t fd, short what, void *ctx) {
    (void)fd; (void)what;
    event_base_loopbreak(((struct tls_server *)ctx)->base);
}

static void *server_thread(void *ctx) {
    event_base_dispatch(((struct tls_server *)ctx)->base);
    return NULL;
}

static void count_cb(evutil_socket_t fd, short what, void *ctx) {
    (void)what;
    char byte;
    while (read(fd, &byte, 1) < 0) {}
    event_base_loopbreak(((struct tls_server *)ctx)->base);
}

static void dispatch_counted(void *ctx) {
    struct tls_server *server = ctx;
    sem_post(&server->counting);
    event_base_dispatch(server->base);
}

/* Uncounted until `ms_tls_count_begin` (the handshake and the warm-up: an RSA signature's
   instructions vary by a few thousand from one to the next), then the rest of the dispatch
   inside the region callgrind counts (`mainspring-bench --counts`). */
static void *counted_server_thread(void *ctx) {
    struct tls_server *server = ctx;
    event_base_dispatch(server->base);
    ms_counted_region(dispatch_counted, server);
    return NULL;
}

static struct tls_server *new_server(const char *certificate, const char *key) {
    ignore_sigpipe();
    struct tls_server *server = calloc(1, sizeof *server);
    server->ctx = server_context(certificate, key);
    if (!server->ctx) {
        free(server);
        return NULL;
    }
    struct event_config *config = event_config_new();
    event_config_set_flag(config, EVENT_BASE_FLAG_NOLOCK | EVENT_BASE_FLAG_PRECISE_TIMER);
    server->base = event_base_new_with_config(config);
    event_config_free(config);
    if (pipe(server->stop_pipe) != 0) abort();
    server->stop_event = event_new(server->base, server->stop_pipe[0], EV_READ, stop_cb, server);
    event_add(server->stop_event, NULL);
    return server;
}

/* ---- the line protocol over TLS ---- */

static void echo_accept_cb(struct evconnlistener *listener, evutil_socket_t fd, struct sockaddr *address,
                           int length, void *ctx) {
    (void)listener; (void)address; (void)length;
    struct tls_server *server = ctx;
    /* As Mainspring does on every TCP connection it accepts. */
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    SSL *ssl = SSL_new(server->ctx);
    struct bufferevent *bev = bufferevent_openssl_socket_new(server->base, fd, ssl, BUFFEREVENT_SSL_ACCEPTING,
                                                             BEV_OPT_CLOSE_ON_FREE);
    if (!bev) {
        SSL_free(ssl);
        close(fd);
        return;
    }
    bufferevent_openssl_set_allow_dirty_shutdown(bev, 1);
    bufferevent_setcb(bev, ms_echo_line_read_cb, NULL, ms_echo_line_event_cb, server);
    bufferevent_enable(bev, EV_READ | EV_WRITE);
}

static void bind_loopback(struct tls_server *server, evconnlistener_cb callback, uint16_t *port) {
    struct sockaddr_in address;
    memset(&address, 0, sizeof address);
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    server->listener = evconnlistener_new_bind(server->base, callback, server, LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE,
                                               511, (struct sockaddr *)&address, sizeof address);
    struct sockaddr_in bound;
    socklen_t bound_length = sizeof bound;
    getsockname(evconnlistener_get_fd(server->listener), (struct sockaddr *)&bound, &bound_length);
    *port = ntohs(bound.sin_port);
}

static void *echo_start(const char *certificate, const char *key, uint16_t *port, int counted) {
    struct tls_server *server = new_server(certificate, key);
    if (!server) return NULL;
    bind_loopback(server, echo_accept_cb, port);
    if (counted) {
        if (pipe(server->count_pipe) != 0) abort();
        sem_init(&server->counting, 0, 0);
        server->count_event = event_new(server->base, server->count_pipe[0], EV_READ, count_cb, server);
        event_add(server->count_event, NULL);
    }
    pthread_create(&server->thread, NULL, counted ? counted_server_thread : server_thread, server);
    return server;
}

void *ms_tls_echo_start(const char *certificate, const char *key, uint16_t *port) {
    return echo_start(certificate, key, port, 0);
}

void *ms_tls_count_echo_start(const char *certificate, const char *key, uint16_t *port) {
    return echo_start(certificate, key, port, 1);
}

void ms_tls_count_begin(void *handle) {
    struct tls_server *server = handle;
    char byte = 1;
    while (write(server->count_pipe[1], &byte, 1) < 0) {}
    while (sem_wait(&server->counting) != 0) {}
}

/* ---- evhttp over TLS ---- */

static struct bufferevent *https_bevcb(struct event_base *base, void *arg) {
    struct tls_server *server = arg;
    struct bufferevent *bev = bufferevent_openssl_socket_new(base, -1, SSL_new(server->ctx), BUFFEREVENT_SSL_ACCEPTING,
                                                             BEV_OPT_CLOSE_ON_FREE);
    if (bev) bufferevent_openssl_set_allow_dirty_shutdown(bev, 1);
    return bev;
}

/* TCP_NODELAY once per connection, as Mainspring's HTTP server does before its first response
   (evhttp gives bevcb no socket yet, so at its first request): a bit per descriptor, cleared when the connection closes. */
static unsigned char nodelay_set[65536];

static void nodelay_closed_cb(struct evhttp_connection *evcon, void *arg) {
    (void)evcon;
    nodelay_set[(intptr_t)arg] = 0;
}

static void nodelay_once(struct evhttp_request *req) {
    struct evhttp_connection *evcon = evhttp_request_get_connection(req);
    struct bufferevent *bev = evcon ? evhttp_connection_get_bufferevent(evcon) : NULL;
    evutil_socket_t fd = bev ? bufferevent_getfd(bev) : -1;
    if (fd >= 0 && fd < 65536 && !nodelay_set[fd]) {
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        nodelay_set[fd] = 1;
        evhttp_connection_set_closecb(evcon, nodelay_closed_cb, (void *)(intptr_t)fd);
    }
}

static void hello_cb(struct evhttp_request *req, void *arg) {
    (void)arg;
    nodelay_once(req);
    struct evbuffer *body = evbuffer_new();
    evbuffer_add(body, "hello\n", 6);
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", "text/plain; charset=utf-8");
    evhttp_send_reply(req, 200, "OK", body);
    evbuffer_free(body);
}

void *ms_tls_http_start(const char *certificate, const char *key, uint16_t *port) {
    struct tls_server *server = new_server(certificate, key);
    if (!server) return NULL;
    server->http = evhttp_new(server->base);
    evhttp_set_bevcb(server->http, https_bevcb, server);
    evhttp_set_cb(server->http, "/hello", hello_cb, NULL);
    struct evhttp_bound_socket *bound = evhttp_bind_socket_with_handle(server->http, "127.0.0.1", 0);
    struct sockaddr_in address;
    socklen_t length = sizeof address;
    getsockname(evhttp_bound_socket_get_fd(bound), (struct sockaddr *)&address, &length);
    *port = ntohs(address.sin_port);
    pthread_create(&server->thread, NULL, server_thread, server);
    return server;
}

void ms_tls_server_stop(void *handle) {
    struct tls_server *server = handle;
    char byte = 1;
    while (write(server->stop_pipe[1], &byte, 1) < 0) {}
    pthread_join(server->thread, NULL);
    if (server->listener) evconnlistener_free(server->listener);
    if (server->http) evhttp_free(server->http);
    event_free(server->stop_event);
    if (server->count_event) {
        event_free(server->count_event);
        close(server->count_pipe[0]);
        close(server->count_pipe[1]);
        sem_destroy(&server->counting);
    }
    event_base_free(server->base);
    SSL_CTX_free(server->ctx);
    close(server->stop_pipe[0]);
    close(server->stop_pipe[1]);
    free(server);
}

/* ---- a blocking client ---- */

struct tls_client {
    SSL *ssl;
    int fd;
};

static SSL_CTX *client_context(const char *ca_file) {
    /* One context per CA file and thread would be cheaper; one per process is enough here. */
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    static SSL_CTX *ctx;
    static char loaded[4096];
    pthread_mutex_lock(&lock);
    if (!ctx || strcmp(loaded, ca_file) != 0) {
        if (ctx) SSL_CTX_free(ctx);
        ctx = SSL_CTX_new(TLS_client_method());
        SSL_CTX_load_verify_locations(ctx, ca_file, NULL);
        SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
        /* No session resumption: every connection a full handshake. */
        SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
        SSL_CTX_set_options(ctx, SSL_OP_NO_TICKET);
        strncpy(loaded, ca_file, sizeof loaded - 1);
    }
    SSL_CTX *result = ctx;
    pthread_mutex_unlock(&lock);
    return result;
}

void *ms_tls_client_connect(uint16_t port, const char *ca_file) {
    ignore_sigpipe();
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return NULL;
    struct sockaddr_in address;
    memset(&address, 0, sizeof address);
    address.sin_family = AF_INET;
    address.sin_port = htons(port);
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&address, sizeof address) != 0) {
        close(fd);
        return NULL;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct timeval timeout = {10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
    SSL *ssl = SSL_new(client_context(ca_file));
    SSL_set_fd(ssl, fd);
    SSL_set_tlsext_host_name(ssl, "localhost");
    if (SSL_connect(ssl) != 1) {
        ERR_clear_error();
        SSL_free(ssl);
        close(fd);
        return NULL;
    }
    struct tls_client *client = malloc(sizeof *client);
    client->ssl = ssl;
    client->fd = fd;
    return client;
}

int ms_tls_client_write(void *handle, const void *bytes, int length) {
    struct tls_client *client = handle;
    int done = 0;
    while (done < length) {
        int n = SSL_write(client->ssl, (const char *)bytes + done, length - done);
        if (n <= 0) {
            ERR_clear_error();
            return -1;
        }
        done += n;
    }
    return 0;
}

int ms_tls_client_read(void *handle, void *buffer, int capacity) {
    struct tls_client *client = handle;
    int n = SSL_read(client->ssl, buffer, capacity);
    if (n > 0) return n;
    int error = SSL_get_error(client->ssl, n);
    ERR_clear_error();
    return error == SSL_ERROR_ZERO_RETURN ? 0 : -1;
}

void ms_tls_client_close(void *handle) {
    struct tls_client *client = handle;
    SSL_shutdown(client->ssl);
    ERR_clear_error();
    SSL_free(client->ssl);
    close(client->fd);
    free(client);
}

/* ---- a handshake storm: many handshakes in flight from one thread ---- */

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <time.h>

static uint64_t storm_now(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec;
}

struct storm_slot {
    int fd;
    SSL *ssl;
    short events;
};

static void storm_end(struct storm_slot *slot) {
    if (slot->ssl) SSL_free(slot->ssl);
    if (slot->fd >= 0) close(slot->fd);
    slot->ssl = NULL;
    slot->fd = -1;
    ERR_clear_error();
}

static int storm_open(struct storm_slot *slot, uint16_t port, SSL_CTX *ctx) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return -1;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct sockaddr_in address;
    memset(&address, 0, sizeof address);
    address.sin_family = AF_INET;
    address.sin_port = htons(port);
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&address, sizeof address) != 0 && errno != EINPROGRESS) {
        close(fd);
        return -1;
    }
    slot->fd = fd;
    slot->ssl = SSL_new(ctx);
    SSL_set_fd(slot->ssl, fd);
    SSL_set_tlsext_host_name(slot->ssl, "localhost");
    SSL_set_connect_state(slot->ssl);
    slot->events = POLLOUT;
    return 0;
}

int ms_tls_storm(uint16_t port, const char *ca_file, int in_flight, uint64_t deadline_ns) {
    ignore_sigpipe();
    SSL_CTX *ctx = client_context(ca_file);
    if (in_flight < 1) in_flight = 1;
    if (in_flight > 256) in_flight = 256;
    struct storm_slot slots[256];
    struct pollfd polls[256];
    int completed = 0;
    for (int i = 0; i < in_flight; i++) {
        slots[i].fd = -1;
        slots[i].ssl = NULL;
    }
    while (storm_now() < deadline_ns) {
        for (int i = 0; i < in_flight; i++) {
            if (slots[i].fd < 0) storm_open(&slots[i], port, ctx);
            polls[i].fd = slots[i].fd;
            polls[i].events = slots[i].events;
            polls[i].revents = 0;
        }
        if (poll(polls, (nfds_t)in_flight, 10) <= 0) continue;
        for (int i = 0; i < in_flight; i++) {
            if (slots[i].fd < 0 || polls[i].revents == 0) continue;
            int done = SSL_do_handshake(slots[i].ssl);
            if (done == 1) {
                completed++;
                storm_end(&slots[i]);
                continue;
            }
            int error = SSL_get_error(slots[i].ssl, done);
            if (error == SSL_ERROR_WANT_READ) slots[i].events = POLLIN;
            else if (error == SSL_ERROR_WANT_WRITE) slots[i].events = POLLOUT;
            else storm_end(&slots[i]);
        }
    }
    for (int i = 0; i < in_flight; i++) storm_end(&slots[i]);
    return completed;
}
