#include "baselines.h"
#include "echo_line_protocol.h"

#include <event2/event.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static struct event_base *new_base(int max_dispatch_us) {
    struct event_config *cfg = event_config_new();
    event_config_set_flag(cfg, EVENT_BASE_FLAG_NOLOCK | EVENT_BASE_FLAG_PRECISE_TIMER);
    if (max_dispatch_us > 0) {
        struct timeval tv = {max_dispatch_us / 1000000, max_dispatch_us % 1000000};
        event_config_set_max_dispatch_interval(cfg, &tv, -1, 0);
    }
    struct event_base *base = event_base_new_with_config(cfg);
    event_config_free(cfg);
    return base;
}

/* ---- cost counts: the region callgrind counts ---- */

/* Not inlined, and not a tail call (the empty asm after the call): callgrind's
 * --toggle-collect=ms_counted_region switches counting on when a thread enters this function
 * and off when it returns, so it must stay on the stack around `body`. */
__attribute__((noinline)) void ms_counted_region(void (*body)(void *), void *context) {
    body(context);
    __asm__ volatile("" ::: "memory");
}

/* ---- post-local ---- */

struct local_state {
    struct event *ev;
    int64_t remaining;
};

static void local_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd; (void)what;
    struct local_state *s = arg;
    if (--s->remaining > 0) event_active(s->ev, EV_READ, 0);
}

static void local_chain(void *arg) {
    struct local_state *s = arg;
    event_active(s->ev, EV_READ, 0);
    while (s->remaining > 0) event_base_loop(event_get_base(s->ev), EVLOOP_ONCE);
}

static double post_local(int64_t count, int max_dispatch_us, int counted) {
    struct event_base *base = new_base(max_dispatch_us);
    struct local_state s = {NULL, count};
    s.ev = event_new(base, -1, 0, local_cb, &s);
    double start = now_seconds();
    if (counted) ms_counted_region(local_chain, &s); else local_chain(&s);
    double elapsed = now_seconds() - start;
    event_free(s.ev);
    event_base_free(base);
    return elapsed;
}

double ms_baseline_post_local(int64_t count, int max_dispatch_us) {
    return post_local(count, max_dispatch_us, 0);
}

void ms_count_post_local(int64_t count, int max_dispatch_us) {
    (void)post_local(count, max_dispatch_us, 1);
}

/* ---- post-remote ---- */

struct item { void (*fn)(void *); void *arg; };

struct remote_queue {
    pthread_mutex_t lock;
    struct item *items;
    int64_t count, capacity;
    int efd;
    int64_t processed, wakeups, total;
    struct event_base *base;
};

static void count_item(void *arg) { ((struct remote_queue *)arg)->processed++; }

static void remote_push(struct remote_queue *q, struct item it) {
    pthread_mutex_lock(&q->lock);
    if (q->count == q->capacity) {
        q->capacity = q->capacity ? q->capacity * 2 : 1024;
        q->items = realloc(q->items, (size_t)q->capacity * sizeof(struct item));
    }
    q->items[q->count++] = it;
    int wake = q->count == 1;
    pthread_mutex_unlock(&q->lock);
    if (wake) {
        uint64_t one = 1;
        while (write(q->efd, &one, 8) < 0) {}
    }
}

static void remote_cb(evutil_socket_t fd, short what, void *arg) {
    (void)what;
    struct remote_queue *q = arg;
    uint64_t value;
    while (read(fd, &value, 8) < 0) {}
    q->wakeups++;
    struct item *batch = NULL;
    int64_t n = 0;
    static __thread struct item *spare = NULL;
    static __thread int64_t spare_capacity = 0;
    pthread_mutex_lock(&q->lock);
    batch = q->items; n = q->count;
    int64_t batch_capacity = q->capacity;
    q->items = spare; q->capacity = spare_capacity; q->count = 0;
    pthread_mutex_unlock(&q->lock);
    for (int64_t i = 0; i < n; i++) batch[i].fn(batch[i].arg);
    spare = batch; spare_capacity = batch_capacity;
    if (q->processed >= q->total) event_base_loopbreak(q->base);
}

static void produce(void *arg) {
    struct remote_queue *q = arg;
    for (int64_t i = 0; i < q->total; i++) remote_push(q, (struct item){count_item, q});
}

static void *producer(void *arg) {
    produce(arg);
    return NULL;
}

static void *counted_producer(void *arg) {
    ms_counted_region(produce, arg);
    return NULL;
}

static void dispatch_base(void *arg) { event_base_dispatch(arg); }

double ms_baseline_post_remote(int64_t count, int64_t *wakeups) {
    struct remote_queue q = {PTHREAD_MUTEX_INITIALIZER, NULL, 0, 0, -1, 0, 0, count, NULL};
    q.efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    q.base = new_base(0);
    struct event *ev = event_new(q.base, q.efd, EV_READ | EV_PERSIST, remote_cb, &q);
    event_add(ev, NULL);
    pthread_t thread;
    double start = now_seconds();
    pthread_create(&thread, NULL, producer, &q);
    event_base_dispatch(q.base);
    double elapsed = now_seconds() - start;
    pthread_join(thread, NULL);
    *wakeups = q.wakeups;
    event_free(ev);
    event_base_free(q.base);
    close(q.efd);
    free(q.items);
    return elapsed;
}

int64_t ms_count_post_remote(int64_t count, int64_t warmup, int producer_first) {
    struct remote_queue q = {PTHREAD_MUTEX_INITIALIZER, NULL, 0, 0, -1, 0, 0, 0, NULL};
    q.efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    q.base = new_base(0);
    struct event *ev = event_new(q.base, q.efd, EV_READ | EV_PERSIST, remote_cb, &q);
    event_add(ev, NULL);
    /* Two uncounted rounds of `warmup` items give both arrays (the queue's and the loop's spare,
     * swapped on every take) their capacity; the third round, of `count` items, is counted. */
    int64_t counted_wakeups = 0;
    for (int round = 0; round < 3; round++) {
        int counted = round == 2;
        q.processed = 0;
        q.total = counted ? count : warmup;
        int64_t wakeups_before = q.wakeups;
        pthread_t thread;
        pthread_create(&thread, NULL, counted ? counted_producer : producer, &q);
        if (producer_first) pthread_join(thread, NULL);
        if (counted) ms_counted_region(dispatch_base, q.base); else dispatch_base(q.base);
        if (!producer_first) pthread_join(thread, NULL);
        counted_wakeups = q.wakeups - wakeups_before;
    }
    event_free(ev);
    event_base_free(q.base);
    close(q.efd);
    free(q.items);
    return counted_wakeups;
}

/* ---- timers ---- */

struct timer_state {
    int64_t start, interval, end;
    int64_t *lateness;
    int64_t capacity, firings;
    struct event_base *base;
};

static void timer_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd; (void)what;
    struct timer_state *s = arg;
    int64_t now = now_ns();
    int64_t k = (now - s->start) / s->interval;
    int64_t ideal = s->start + k * s->interval;
    if (s->firings < s->capacity) s->lateness[s->firings] = now - ideal;
    s->firings++;
    if (now >= s->end) event_base_loopbreak(s->base);
}

int64_t ms_baseline_timers(int interval_us, int duration_ms, int64_t *lateness_ns, int64_t capacity) {
    struct timer_state s = {0, (int64_t)interval_us * 1000, 0, lateness_ns, capacity, 0, NULL};
    s.base = new_base(0);
    struct event *ev = event_new(s.base, -1, EV_PERSIST, timer_cb, &s);
    struct timeval tv = {interval_us / 1000000, interval_us % 1000000};
    s.start = now_ns();
    s.end = s.start + (int64_t)duration_ms * 1000000;
    event_add(ev, &tv);
    event_base_dispatch(s.base);
    event_free(ev);
    event_base_free(s.base);
    return s.firings;
}

/* ---- daemon: bufferevent echo service ---- */

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/listener.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>

struct echo_service {
    struct event_base *base;
    struct evconnlistener *listener;
    struct event *stop_event;
    int stop_pipe[2];
    pthread_t thread;
};

void ms_echo_line_read_cb(struct bufferevent *bev, void *ctx) {
    (void)ctx;
    struct evbuffer *input = bufferevent_get_input(bev);
    struct evbuffer *output = bufferevent_get_output(bev);
    size_t length;
    char *line;
    while ((line = evbuffer_readln(input, &length, EVBUFFER_EOL_LF)) != NULL) {
        if (length >= 5 && memcmp(line, "ECHO ", 5) == 0) {
            evbuffer_add(output, line + 5, length - 5);
            evbuffer_add(output, "\n", 1);
        } else {
            evbuffer_add(output, "ERR\n", 4);
        }
        free(line);
    }
}

void ms_echo_line_event_cb(struct bufferevent *bev, short what, void *ctx) {
    (void)ctx;
    if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR)) bufferevent_free(bev);
}

static void echo_accept_cb(struct evconnlistener *listener, evutil_socket_t fd, struct sockaddr *address,
                           int length, void *ctx) {
    (void)listener; (void)length;
    struct echo_service *service = ctx;
    /* As Mainspring does on every TCP connection it accepts (not on a Unix socket). */
    if (address->sa_family != AF_UNIX) {
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    struct bufferevent *bev = bufferevent_socket_new(service->base, fd, BEV_OPT_CLOSE_ON_FREE);
    bufferevent_setcb(bev, ms_echo_line_read_cb, NULL, ms_echo_line_event_cb, service);
    bufferevent_enable(bev, EV_READ | EV_WRITE);
}

static void echo_stop_cb(evutil_socket_t fd, short what, void *ctx) {
    (void)fd; (void)what;
    event_base_loopbreak(((struct echo_service *)ctx)->base);
}

static void *echo_thread(void *ctx) {
    event_base_dispatch(((struct echo_service *)ctx)->base);
    return NULL;
}

static void *counted_echo_thread(void *ctx) {
    ms_counted_region(dispatch_base, ((struct echo_service *)ctx)->base);
    return NULL;
}

static void *echo_start_on(struct sockaddr *address, socklen_t length, int counted) {
    struct echo_service *service = calloc(1, sizeof *service);
    service->base = new_base(0);
    service->listener = evconnlistener_new_bind(service->base, echo_accept_cb, service,
        LEV_OPT_CLOSE_ON_FREE | (address->sa_family == AF_UNIX ? 0 : LEV_OPT_REUSEABLE), 511, address, (int)length);
    if (service->listener == NULL) {
        event_base_free(service->base);
        free(service);
        return NULL;
    }
    if (pipe(service->stop_pipe) != 0) abort();
    service->stop_event = event_new(service->base, service->stop_pipe[0], EV_READ, echo_stop_cb, service);
    event_add(service->stop_event, NULL);
    pthread_create(&service->thread, NULL, counted ? counted_echo_thread : echo_thread, service);
    return service;
}

static void *echo_start(uint16_t *port, int counted) {
    struct sockaddr_in address;
    memset(&address, 0, sizeof address);
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct echo_service *service = echo_start_on((struct sockaddr *)&address, sizeof address, counted);
    if (service == NULL) abort();
    struct sockaddr_in bound;
    socklen_t bound_length = sizeof bound;
    getsockname(evconnlistener_get_fd(service->listener), (struct sockaddr *)&bound, &bound_length);
    *port = ntohs(bound.sin_port);
    return service;
}

void *ms_baseline_echo_start_unix(const char *path) {
    struct sockaddr_un address;
    memset(&address, 0, sizeof address);
    address.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof address.sun_path) return NULL;
    strcpy(address.sun_path, path);
    unlink(path);
    return echo_start_on((struct sockaddr *)&address, sizeof address, 0);
}

void *ms_baseline_echo_start(uint16_t *port) {
    return echo_start(port, 0);
}

void *ms_count_echo_start(uint16_t *port) {
    return echo_start(port, 1);
}

void ms_baseline_echo_stop(void *handle) {
    struct echo_service *service = handle;
    char byte = 1;
    while (write(service->stop_pipe[1], &byte, 1) < 0) {}
    pthread_join(service->thread, NULL);
    evconnlistener_free(service->listener);
    event_free(service->stop_event);
    event_base_free(service->base);
    close(service->stop_pipe[0]);
    close(service->stop_pipe[1]);
    free(service);
}

/* ---- actor-hop: the two-thread floor ---- */

struct pingpong_side {
    struct event_base *base;
    int in_fd;      /* this side's eventfd: readable when the peer sent */
    int out_fd;     /* the peer's eventfd */
    int64_t remaining;
    int starts;     /* the main side sends first */
};

static void pingpong_cb(evutil_socket_t fd, short what, void *arg) {
    (void)what;
    struct pingpong_side *s = arg;
    uint64_t value, one = 1;
    if (read(fd, &value, sizeof value) != sizeof value) return;
    if (s->starts) {
        /* The main side got a pong: send the next ping, or stop after `count` round trips. */
        if (--s->remaining > 0) {
            if (write(s->out_fd, &one, sizeof one) < 0) event_base_loopbreak(s->base);
        } else {
            event_base_loopbreak(s->base);
        }
    } else {
        /* The peer got a ping: answer it. */
        if (write(s->out_fd, &one, sizeof one) < 0 || --s->remaining == 0) event_base_loopbreak(s->base);
    }
}

static void *pingpong_peer(void *arg) {
    struct pingpong_side *s = arg;
    struct event *ev = event_new(s->base, s->in_fd, EV_READ | EV_PERSIST, pingpong_cb, s);
    event_add(ev, NULL);
    event_base_dispatch(s->base);
    event_free(ev);
    return NULL;
}

double ms_baseline_pingpong(int64_t count) {
    int a = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC), b = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    struct pingpong_side main_side = {new_base(0), a, b, count, 1};
    struct pingpong_side peer_side = {new_base(0), b, a, count, 0};
    pthread_t thread;
    pthread_create(&thread, NULL, pingpong_peer, &peer_side);
    struct event *ev = event_new(main_side.base, a, EV_READ | EV_PERSIST, pingpong_cb, &main_side);
    event_add(ev, NULL);
    double start = now_seconds();
    uint64_t one = 1;
    if (write(b, &one, sizeof one) < 0) return -1;
    event_base_dispatch(main_side.base);
    double elapsed = now_seconds() - start;
    pthread_join(thread, NULL);
    event_free(ev);
    event_base_free(main_side.base);
    event_base_free(peer_side.base);
    close(a);
    close(b);
    return elapsed;
}
