// The plain-C evhttp client that `mainspring-bench http-client` measures HTTPClient against:
// `connections` evhttp_connections on one event_base (the calling thread), each with one
// `GET /hello` in flight, the next one made from the previous one's completion callback.
#include "baselines.h"

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <stdlib.h>
#include <time.h>

struct client_run;

struct client_connection {
    struct client_run *run;
    struct evhttp_connection *connection;
};

struct client_run {
    struct event_base *base;
    int64_t completed;
    int64_t failed;
    int64_t completed_at_start;
    int64_t start_ns;
    int64_t end_ns;
};

static int64_t monotonic_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void issue(struct client_connection *c);

static void response_cb(struct evhttp_request *request, void *arg) {
    struct client_connection *c = arg;
    if (request == NULL || evhttp_request_get_response_code(request) != 200) {
        c->run->failed++;
    } else {
        struct evbuffer *body = evhttp_request_get_input_buffer(request);
        evbuffer_drain(body, evbuffer_get_length(body));
        c->run->completed++;
    }
    issue(c);
}

static void issue(struct client_connection *c) {
    struct evhttp_request *request = evhttp_request_new(response_cb, c);
    evhttp_add_header(evhttp_request_get_output_headers(request), "Host", "bench");
    if (evhttp_make_request(c->connection, request, EVHTTP_REQ_GET, "/hello") != 0) c->run->failed++;
}

static void start_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd; (void)what;
    struct client_run *run = arg;
    run->completed_at_start = run->completed;
    run->start_ns = monotonic_ns();
}

static void stop_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd; (void)what;
    struct client_run *run = arg;
    run->end_ns = monotonic_ns();
    event_base_loopbreak(run->base);
}

int64_t ms_baseline_http_client(uint16_t port, int connections, int warmup_ms, int duration_ms, double *seconds,
                                int64_t *failures) {
    struct event_config *cfg = event_config_new();
    event_config_set_flag(cfg, EVENT_BASE_FLAG_NOLOCK | EVENT_BASE_FLAG_PRECISE_TIMER);
    struct client_run run = {event_base_new_with_config(cfg), 0, 0, 0, 0, 0};
    event_config_free(cfg);
    struct client_connection *clients = calloc((size_t)connections, sizeof *clients);
    for (int i = 0; i < connections; i++) {
        clients[i].run = &run;
        clients[i].connection = evhttp_connection_base_new(run.base, NULL, "127.0.0.1", port);
        issue(&clients[i]);
    }
    struct timeval warmup = {warmup_ms / 1000, (warmup_ms % 1000) * 1000};
    int total_ms = warmup_ms + duration_ms;
    struct timeval total = {total_ms / 1000, (total_ms % 1000) * 1000};
    struct event *start = evtimer_new(run.base, start_cb, &run);
    struct event *stop = evtimer_new(run.base, stop_cb, &run);
    run.start_ns = monotonic_ns();
    evtimer_add(start, &warmup);
    evtimer_add(stop, &total);
    event_base_dispatch(run.base);
    for (int i = 0; i < connections; i++) evhttp_connection_free(clients[i].connection);
    free(clients);
    event_free(start);
    event_free(stop);
    event_base_free(run.base);
    *seconds = (double)(run.end_ns - run.start_ns) / 1e9;
    *failures = run.failed;
    return run.completed - run.completed_at_start;
}

/* ---- cost counts: one connection, one request at a time ---- */

struct counted_client {
    struct event_base *base;
    struct evhttp_connection *connection;
    int64_t remaining;
    int64_t failed;
};

static void counted_issue(struct counted_client *c);

static void counted_response_cb(struct evhttp_request *request, void *arg) {
    struct counted_client *c = arg;
    if (request == NULL || evhttp_request_get_response_code(request) != 200) {
        c->failed++;
    } else {
        struct evbuffer *body = evhttp_request_get_input_buffer(request);
        evbuffer_drain(body, evbuffer_get_length(body));
    }
    if (--c->remaining > 0) {
        counted_issue(c);
    } else {
        event_base_loopbreak(c->base);
    }
}

static void counted_issue(struct counted_client *c) {
    struct evhttp_request *request = evhttp_request_new(counted_response_cb, c);
    evhttp_add_header(evhttp_request_get_output_headers(request), "Host", "bench");
    if (evhttp_make_request(c->connection, request, EVHTTP_REQ_GET, "/hello") != 0) c->failed++;
}

static void counted_dispatch(void *arg) {
    struct counted_client *c = arg;
    counted_issue(c);
    event_base_dispatch(c->base);
}

int64_t ms_count_http_client(uint16_t port, int64_t warmup, int64_t count) {
    struct event_config *cfg = event_config_new();
    event_config_set_flag(cfg, EVENT_BASE_FLAG_NOLOCK | EVENT_BASE_FLAG_PRECISE_TIMER);
    struct counted_client c = {event_base_new_with_config(cfg), NULL, warmup, 0};
    event_config_free(cfg);
    c.connection = evhttp_connection_base_new(c.base, NULL, "127.0.0.1", port);
    counted_dispatch(&c);
    c.remaining = count;
    ms_counted_region(counted_dispatch, &c);
    evhttp_connection_free(c.connection);
    event_base_free(c.base);
    return c.failed;
}
