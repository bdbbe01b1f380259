// The plain-C evhttp server that `mainspring-bench http` measures Mainspring's HTTP server
// against: one event_base on a thread of its own, the same routes, and the work of /work done
// inline in its callback, the way a C evhttp server does it (nothing else runs meanwhile).
#include "baselines.h"

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct http_baseline {
    struct event_base *base;
    struct evhttp *http;
    struct event *stop_event;
    int stop_pipe[2];
    pthread_t thread;
};

/* The same arithmetic as ExampleServices' WorkUnit: 20,000 rounds of a 64-bit xorshift. */
uint64_t ms_baseline_work_unit(uint64_t seed, uint64_t checksum) {
    uint64_t x = (seed * 0x9E3779B97F4A7C15ULL) | 1;
    for (int i = 0; i < 20000; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
    }
    return checksum + x;
}

static void reply_text(struct evhttp_request *req, int code, const char *reason, const char *text) {
    struct evbuffer *body = evhttp_request_get_output_buffer(req);
    evbuffer_add(body, text, strlen(text));
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", "text/plain; charset=utf-8");
    evhttp_send_reply(req, code, reason, NULL);
}

static void hello_cb(struct evhttp_request *req, void *arg) {
    (void)arg;
    reply_text(req, 200, "OK", "hello\n");
}

static void health_cb(struct evhttp_request *req, void *arg) {
    (void)arg;
    reply_text(req, 200, "OK", "ok\n");
}

static void work_cb(struct evhttp_request *req, void *arg) {
    (void)arg;
    struct evkeyvalq query;
    long n = 0;
    const char *uri_query = evhttp_uri_get_query(evhttp_request_get_evhttp_uri(req));
    if (uri_query && evhttp_parse_query_str(uri_query, &query) == 0) {
        const char *value = evhttp_find_header(&query, "n");
        if (value) n = strtol(value, NULL, 10);
        evhttp_clear_headers(&query);
    }
    if (n < 1 || n > 1000000) {
        reply_text(req, 400, "Bad Request", "n must be a number in 1...1000000\n");
        return;
    }
    uint64_t checksum = 0;
    for (long i = 0; i < n; i++) checksum = ms_baseline_work_unit((uint64_t)i, checksum);
    char text[96];
    snprintf(text, sizeof text, "result %ld %llu\n", n, (unsigned long long)checksum);
    reply_text(req, 200, "OK", text);
}

static void stop_cb(evutil_socket_t fd, short what, void *ctx) {
    (void)fd; (void)what;
    event_base_loopbreak(((struct http_baseline *)ctx)->base);
}

static void *http_thread(void *ctx) {
    event_base_dispatch(((struct http_baseline *)ctx)->base);
    return NULL;
}

static void dispatch_http_base(void *base) {
    event_base_dispatch(base);
}

static void *counted_http_thread(void *ctx) {
    ms_counted_region(dispatch_http_base, ((struct http_baseline *)ctx)->base);
    return NULL;
}

static void *http_start(uint16_t *port, int counted) {
    struct http_baseline *server = calloc(1, sizeof *server);
    struct event_config *cfg = event_config_new();
    event_config_set_flag(cfg, EVENT_BASE_FLAG_NOLOCK | EVENT_BASE_FLAG_PRECISE_TIMER);
    server->base = event_base_new_with_config(cfg);
    event_config_free(cfg);
    server->http = evhttp_new(server->base);
    evhttp_set_cb(server->http, "/hello", hello_cb, NULL);
    evhttp_set_cb(server->http, "/healthz", health_cb, NULL);
    evhttp_set_cb(server->http, "/work", work_cb, NULL);
    struct evhttp_bound_socket *bound = evhttp_bind_socket_with_handle(server->http, "127.0.0.1", 0);
    if (!bound) abort();
    struct sockaddr_storage address;
    socklen_t length = sizeof address;
    getsockname(evhttp_bound_socket_get_fd(bound), (struct sockaddr *)&address, &length);
    *port = ntohs(((struct sockaddr_in *)&address)->sin_port);
    if (pipe(server->stop_pipe) != 0) abort();
    server->stop_event = event_new(server->base, server->stop_pipe[0], EV_READ, stop_cb, server);
    event_add(server->stop_event, NULL);
    pthread_create(&server->thread, NULL, counted ? counted_http_thread : http_thread, server);
    return server;
}

void *ms_baseline_http_start(uint16_t *port) {
    return http_start(port, 0);
}

void *ms_count_http_start(uint16_t *port) {
    return http_start(port, 1);
}

uint64_t ms_baseline_http_cpu_ns(void *handle) {
    struct http_baseline *server = handle;
    clockid_t clock;
    struct timespec now;
    if (pthread_getcpuclockid(server->thread, &clock) != 0 || clock_gettime(clock, &now) != 0) return 0;
    return (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec;
}

void ms_baseline_http_stop(void *handle) {
    struct http_baseline *server = handle;
    char byte = 1;
    while (write(server->stop_pipe[1], &byte, 1) < 0) {}
    pthread_join(server->thread, NULL);
    evhttp_free(server->http);
    event_free(server->stop_event);
    event_base_free(server->base);
    close(server->stop_pipe[0]);
    close(server->stop_pipe[1]);
    free(server);
}
