// The udp and unix scenarios' C sides: libevent UDP echo servers (recvfrom/sendto one datagram
// at a time, and recvmmsg/sendmmsg in batches), the load client every UDP variant shares, and a
// Unix-socket listener for the daemon's bufferevent echo service (in baselines.c).
#define _GNU_SOURCE
#include "baselines.h"

#include <arpa/inet.h>
#include <errno.h>
#include <event2/event.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define UDP_BATCH 32
#define UDP_PER_WAKEUP 64   /* as DatagramSocket's maximumDatagramsPerWakeup */
#define UDP_MAX_PAYLOAD 2048

static int64_t udp_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* ---- udp: echo servers ---- */

struct udp_echo {
    struct event_base *base;
    struct event *read_event;
    struct event *stop_event;
    int fd;
    int stop_pipe[2];
    int mmsg;
    pthread_t thread;
    /* recvmmsg/sendmmsg buffers */
    struct mmsghdr messages[UDP_BATCH];
    struct iovec vectors[UDP_BATCH];
    struct sockaddr_storage addresses[UDP_BATCH];
    char buffers[UDP_BATCH][UDP_MAX_PAYLOAD];
};

/* One datagram per recvfrom and per sendto, up to UDP_PER_WAKEUP per readiness. */
static void udp_echo_single_cb(evutil_socket_t fd, short what, void *arg) {
    (void)what;
    struct udp_echo *echo = arg;
    for (int i = 0; i < UDP_PER_WAKEUP; i++) {
        struct sockaddr_storage from;
        socklen_t length = sizeof from;
        ssize_t n = recvfrom(fd, echo->buffers[0], UDP_MAX_PAYLOAD, 0, (struct sockaddr *)&from, &length);
        if (n < 0) return;  /* EAGAIN: drained */
        sendto(fd, echo->buffers[0], (size_t)n, 0, (struct sockaddr *)&from, length);
    }
}

/* Batches of UDP_BATCH per recvmmsg, each batch echoed by one sendmmsg. */
static void udp_echo_mmsg_cb(evutil_socket_t fd, short what, void *arg) {
    (void)what;
    struct udp_echo *echo = arg;
    for (int taken = 0; taken < UDP_PER_WAKEUP;) {
        for (int i = 0; i < UDP_BATCH; i++) {
            echo->vectors[i].iov_base = echo->buffers[i];
            echo->vectors[i].iov_len = UDP_MAX_PAYLOAD;
            memset(&echo->messages[i].msg_hdr, 0, sizeof echo->messages[i].msg_hdr);
            echo->messages[i].msg_hdr.msg_iov = &echo->vectors[i];
            echo->messages[i].msg_hdr.msg_iovlen = 1;
            echo->messages[i].msg_hdr.msg_name = &echo->addresses[i];
            echo->messages[i].msg_hdr.msg_namelen = sizeof echo->addresses[i];
        }
        int n = recvmmsg(fd, echo->messages, UDP_BATCH, MSG_DONTWAIT, NULL);
        if (n <= 0) return;
        for (int i = 0; i < n; i++) echo->vectors[i].iov_len = echo->messages[i].msg_len;
        sendmmsg(fd, echo->messages, (unsigned)n, 0);
        taken += n;
        if (n < UDP_BATCH) return;
    }
}

static void udp_stop_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd; (void)what;
    event_base_loopbreak(((struct udp_echo *)arg)->base);
}

static void *udp_echo_thread(void *arg) {
    event_base_dispatch(((struct udp_echo *)arg)->base);
    return NULL;
}

void *ms_baseline_udp_echo_start(int use_mmsg, uint16_t *port) {
    struct udp_echo *echo = calloc(1, sizeof *echo);
    echo->mmsg = use_mmsg;
    struct event_config *config = event_config_new();
    event_config_set_flag(config, EVENT_BASE_FLAG_NOLOCK | EVENT_BASE_FLAG_PRECISE_TIMER);
    echo->base = event_base_new_with_config(config);
    event_config_free(config);
    echo->fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    struct sockaddr_in address;
    memset(&address, 0, sizeof address);
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(echo->fd, (struct sockaddr *)&address, sizeof address) != 0) abort();
    socklen_t length = sizeof address;
    getsockname(echo->fd, (struct sockaddr *)&address, &length);
    *port = ntohs(address.sin_port);
    echo->read_event = event_new(echo->base, echo->fd, EV_READ | EV_PERSIST,
                                 use_mmsg ? udp_echo_mmsg_cb : udp_echo_single_cb, echo);
    event_add(echo->read_event, NULL);
    if (pipe(echo->stop_pipe) != 0) abort();
    echo->stop_event = event_new(echo->base, echo->stop_pipe[0], EV_READ, udp_stop_cb, echo);
    event_add(echo->stop_event, NULL);
    pthread_create(&echo->thread, NULL, udp_echo_thread, echo);
    return echo;
}

void ms_baseline_udp_echo_stop(void *handle) {
    struct udp_echo *echo = handle;
    char byte = 1;
    while (write(echo->stop_pipe[1], &byte, 1) < 0) {}
    pthread_join(echo->thread, NULL);
    event_free(echo->read_event);
    event_free(echo->stop_event);
    event_base_free(echo->base);
    close(echo->fd);
    close(echo->stop_pipe[0]);
    close(echo->stop_pipe[1]);
    free(echo);
}

/* ---- udp: the client every variant shares ---- */

int64_t ms_udp_echo_client(uint16_t port, int window, int payload, int duration_ms, int64_t *sent_out,
                           int64_t *timeouts_out) {
    if (window > 1024) window = 1024;
    if (payload > UDP_MAX_PAYLOAD) payload = UDP_MAX_PAYLOAD;
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    struct sockaddr_in address;
    memset(&address, 0, sizeof address);
    address.sin_family = AF_INET;
    address.sin_port = htons(port);
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&address, sizeof address) != 0) abort();
    char (*out)[UDP_MAX_PAYLOAD] = malloc(sizeof(char[UDP_BATCH * 2][UDP_MAX_PAYLOAD]));
    char (*in)[UDP_MAX_PAYLOAD] = malloc(sizeof(char[UDP_BATCH * 2][UDP_MAX_PAYLOAD]));
    struct mmsghdr send_messages[UDP_BATCH * 2], receive_messages[UDP_BATCH * 2];
    struct iovec send_vectors[UDP_BATCH * 2], receive_vectors[UDP_BATCH * 2];
    for (int i = 0; i < UDP_BATCH * 2; i++) {
        memset(out[i], 'u', (size_t)payload);
        send_vectors[i] = (struct iovec){out[i], (size_t)payload};
        receive_vectors[i] = (struct iovec){in[i], UDP_MAX_PAYLOAD};
        memset(&send_messages[i], 0, sizeof send_messages[i]);
        send_messages[i].msg_hdr.msg_iov = &send_vectors[i];
        send_messages[i].msg_hdr.msg_iovlen = 1;
        memset(&receive_messages[i], 0, sizeof receive_messages[i]);
        receive_messages[i].msg_hdr.msg_iov = &receive_vectors[i];
        receive_messages[i].msg_hdr.msg_iovlen = 1;
    }
    int64_t sent = 0, received = 0, timeouts = 0;
    int in_flight = 0;
    int64_t end = udp_now_ns() + (int64_t)duration_ms * 1000000;
    while (udp_now_ns() < end) {
        /* Refill the window. */
        while (in_flight < window) {
            int want = window - in_flight;
            if (want > UDP_BATCH * 2) want = UDP_BATCH * 2;
            int n = sendmmsg(fd, send_messages, (unsigned)want, 0);
            if (n <= 0) break;  /* EAGAIN (buffer full), or ECONNREFUSED: wait for echoes */
            sent += n;
            in_flight += n;
        }
        struct pollfd ready = {fd, POLLIN, 0};
        if (poll(&ready, 1, 5) <= 0) {
            /* Nothing for 5 ms: what is in flight was dropped (loopback drops under overload). */
            timeouts++;
            in_flight = 0;
            continue;
        }
        for (;;) {
            int n = recvmmsg(fd, receive_messages, UDP_BATCH * 2, MSG_DONTWAIT, NULL);
            if (n <= 0) break;
            received += n;
            in_flight = in_flight > n ? in_flight - n : 0;
            if (n < UDP_BATCH * 2) break;
        }
    }
    /* Echoes still arriving are not counted; let them land before the socket closes. */
    close(fd);
    free(out);
    free(in);
    if (sent_out) *sent_out = sent;
    if (timeouts_out) *timeouts_out = timeouts;
    return received;
}
