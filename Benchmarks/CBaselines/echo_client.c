// The websocket scenario's C side: the load generator both of its servers get (the WebSocket echo
// and the line echo), so that only the server differs, and a byte-counting relay for the
// compression figures. Plain sockets, no libevent: a client that only has to keep up needs none.
//
// One message format per kind: `MS_ECHO_LINE` sends the payload and "\n" and expects them back;
// `MS_ECHO_WS_TEXT` / `MS_ECHO_WS_BINARY` send one masked FIN frame (text or binary) with the
// payload after the opening handshake and expect one unmasked FIN frame of the same opcode and
// payload back (RFC 6455: a client's frames are masked, a server's are not). Every echo is
// compared byte for byte with what it must be.
#define _GNU_SOURCE
#include "baselines.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* The opening handshake's fixed key and the Sec-WebSocket-Accept it must get (RFC 6455 §1.3). */
#define WS_KEY "dGhlIHNhbXBsZSBub25jZQ=="
#define WS_ACCEPT "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
/* The masking key of every client frame: fixed (the server unmasks whatever the key). */
static const uint8_t ws_mask[4] = {0x37, 0xfa, 0x21, 0x3d};

static int64_t echo_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int send_all(int fd, const uint8_t *bytes, size_t count) {
    while (count > 0) {
        ssize_t n = send(fd, bytes, count, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        bytes += n;
        count -= (size_t)n;
    }
    return 0;
}

static int receive_all(int fd, uint8_t *bytes, size_t count) {
    while (count > 0) {
        ssize_t n = recv(fd, bytes, count, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return -1;
        bytes += n;
        count -= (size_t)n;
    }
    return 0;
}

/* A WebSocket frame header (FIN, `opcode`, `length`, the mask bit and key when `masked`) into
   `header` (at least 14 bytes); returns its size. */
static size_t ws_header(uint8_t *header, int opcode, size_t length, int masked) {
    size_t size = 0;
    header[size++] = (uint8_t)(0x80 | opcode);
    uint8_t mask_bit = masked ? 0x80 : 0;
    if (length < 126) {
        header[size++] = (uint8_t)(mask_bit | length);
    } else if (length < 65536) {
        header[size++] = mask_bit | 126;
        header[size++] = (uint8_t)(length >> 8);
        header[size++] = (uint8_t)length;
    } else {
        header[size++] = mask_bit | 127;
        for (int shift = 56; shift >= 0; shift -= 8) header[size++] = (uint8_t)((uint64_t)length >> shift);
    }
    if (masked) {
        memcpy(header + size, ws_mask, 4);
        size += 4;
    }
    return size;
}

/* What one echo sends and what it must get back. */
struct echo_message {
    uint8_t *request;
    size_t request_length;
    uint8_t *reply;
    size_t reply_length;
};

static int echo_message_make(struct echo_message *message, int kind, const uint8_t *payload, int length) {
    if (length < 0) return -1;
    size_t n = (size_t)length;
    if (kind == MS_ECHO_LINE) {
        if (memchr(payload, '\n', n) != NULL) return -1;
        message->request = malloc(n + 1);
        message->reply = malloc(n + 1);
        memcpy(message->request, payload, n);
        message->request[n] = '\n';
        memcpy(message->reply, message->request, n + 1);
        message->request_length = message->reply_length = n + 1;
        return 0;
    }
    if (kind != MS_ECHO_WS_TEXT && kind != MS_ECHO_WS_BINARY) return -1;
    int opcode = kind == MS_ECHO_WS_TEXT ? 1 : 2;
    uint8_t header[14];
    message->request = malloc(n + 14);
    message->reply = malloc(n + 14);
    size_t request_header = ws_header(header, opcode, n, 1);
    memcpy(message->request, header, request_header);
    for (size_t i = 0; i < n; i++) message->request[request_header + i] = payload[i] ^ ws_mask[i & 3];
    message->request_length = request_header + n;
    size_t reply_header = ws_header(header, opcode, n, 0);
    memcpy(message->reply, header, reply_header);
    memcpy(message->reply + reply_header, payload, n);
    message->reply_length = reply_header + n;
    return 0;
}

static void echo_message_free(struct echo_message *message) {
    free(message->request);
    free(message->reply);
}

int ms_echo_client_open(uint16_t port, int kind, const char *path) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    struct sockaddr_in address;
    memset(&address, 0, sizeof address);
    address.sin_family = AF_INET;
    address.sin_port = htons(port);
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&address, sizeof address) != 0) {
        close(fd);
        return -1;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (kind == MS_ECHO_LINE) return fd;
    char request[512];
    int length = snprintf(request, sizeof request,
                          "GET %s HTTP/1.1\r\nHost: 127.0.0.1:%u\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                          "Sec-WebSocket-Key: " WS_KEY "\r\nSec-WebSocket-Version: 13\r\n\r\n",
                          path, (unsigned)port);
    if (length <= 0 || (size_t)length >= sizeof request || send_all(fd, (const uint8_t *)request, (size_t)length) != 0) {
        close(fd);
        return -1;
    }
    /* The response head; the server sends nothing after it before the first message. */
    char head[2048];
    size_t got = 0;
    while (got < sizeof head - 1) {
        ssize_t n = recv(fd, head + got, sizeof head - 1 - got, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        got += (size_t)n;
        head[got] = 0;
        char *end = strstr(head, "\r\n\r\n");
        if (end == NULL) continue;
        if (end + 4 == head + got && strncmp(head, "HTTP/1.1 101 ", 13) == 0 && strstr(head, WS_ACCEPT) != NULL)
            return fd;
        break;
    }
    close(fd);
    return -1;
}

int ms_echo_client_roundtrip(int fd, int kind, const uint8_t *payload, int length) {
    struct echo_message message;
    if (echo_message_make(&message, kind, payload, length) != 0) return -1;
    uint8_t *reply = malloc(message.reply_length);
    int result = -1;
    if (send_all(fd, message.request, message.request_length) == 0 &&
        receive_all(fd, reply, message.reply_length) == 0 &&
        memcmp(reply, message.reply, message.reply_length) == 0)
        result = 0;
    free(reply);
    echo_message_free(&message);
    return result;
}

void ms_echo_client_close(int fd, int kind) {
    if (kind != MS_ECHO_LINE) {
        /* A close frame, 1000: the server's handler sees its messages end, not a lost peer. */
        uint8_t frame[8] = {0x88, 0x82, ws_mask[0], ws_mask[1], ws_mask[2], ws_mask[3],
                            (uint8_t)(0x03 ^ ws_mask[0]), (uint8_t)(0xe8 ^ ws_mask[1])};
        (void)send_all(fd, frame, sizeof frame);
    }
    close(fd);
}

int64_t ms_echo_client_run(uint16_t port, int kind, const char *path, const uint8_t *payload, int length, int clients,
                           int warmup_ms, int duration_ms, double *seconds, int64_t *failures) {
    int64_t failed = 0, counted = 0;
    struct echo_message message;
    if (clients <= 0 || echo_message_make(&message, kind, payload, length) != 0) {
        if (failures) *failures = 1;
        return 0;
    }
    int *fds = calloc((size_t)clients, sizeof *fds);
    size_t *got = calloc((size_t)clients, sizeof *got);
    uint8_t *buffers = malloc((size_t)clients * message.reply_length);
    int poller = epoll_create1(EPOLL_CLOEXEC);
    int open = 0;
    for (int i = 0; i < clients; i++) {
        fds[i] = ms_echo_client_open(port, kind, path);
        if (fds[i] < 0) {
            failed++;
            continue;
        }
        struct epoll_event interest = {.events = EPOLLIN, .data.u32 = (uint32_t)i};
        epoll_ctl(poller, EPOLL_CTL_ADD, fds[i], &interest);
        open++;
    }
    int64_t started = echo_now_ns();
    int64_t measured_from = started + (int64_t)warmup_ms * 1000000;
    int64_t end = measured_from + (int64_t)duration_ms * 1000000;
    for (int i = 0; i < clients; i++) {
        if (fds[i] >= 0 && send_all(fds[i], message.request, message.request_length) != 0) {
            failed++;
            close(fds[i]);
            fds[i] = -1;
            open--;
        }
    }
    struct epoll_event events[64];
    while (open > 0) {
        int64_t now = echo_now_ns();
        if (now >= end) break;
        int timeout_ms = (int)((end - now) / 1000000) + 1;
        int ready = epoll_wait(poller, events, 64, timeout_ms < 20 ? timeout_ms : 20);
        for (int e = 0; e < ready; e++) {
            int i = (int)events[e].data.u32;
            if (fds[i] < 0) continue;
            uint8_t *buffer = buffers + (size_t)i * message.reply_length;
            ssize_t n = recv(fds[i], buffer + got[i], message.reply_length - got[i], MSG_DONTWAIT);
            if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
            int broken = n <= 0;
            if (!broken) {
                got[i] += (size_t)n;
                if (got[i] < message.reply_length) continue;
                got[i] = 0;
                if (memcmp(buffer, message.reply, message.reply_length) != 0) {
                    broken = 1;
                } else {
                    int64_t done = echo_now_ns();
                    if (done >= measured_from && done < end) counted++;
                    broken = send_all(fds[i], message.request, message.request_length) != 0;
                }
            }
            if (broken) {
                failed++;
                epoll_ctl(poller, EPOLL_CTL_DEL, fds[i], NULL);
                close(fds[i]);
                fds[i] = -1;
                open--;
            }
        }
    }
    for (int i = 0; i < clients; i++) {
        if (fds[i] >= 0) ms_echo_client_close(fds[i], kind);
    }
    close(poller);
    free(buffers);
    free(got);
    free(fds);
    echo_message_free(&message);
    if (seconds) *seconds = (double)duration_ms / 1000.0;
    if (failures) *failures = failed;
    return counted;
}

/* ---- The counting relay ---- */

struct counting_relay {
    int listener;
    int target_port;
    int stop_pipe[2];
    pthread_t thread;
    int64_t counts[2];   /* after the HTTP head: client → server, server → client */
};

/* Moves what `from` has to `to`; counts the bytes after the first "\r\n\r\n" of the direction
   (`*matched` tracks how much of it has been seen). Returns 0 at end of input or on an error. */
static int relay_move(int from, int to, int *matched, int64_t *count) {
    uint8_t buffer[65536];
    ssize_t n = recv(from, buffer, sizeof buffer, 0);
    if (n < 0 && errno == EINTR) return 1;
    if (n <= 0) return 0;
    ssize_t start = 0;
    static const char terminator[4] = {'\r', '\n', '\r', '\n'};
    while (*matched < 4 && start < n) {
        if (buffer[start] == (uint8_t)terminator[*matched]) {
            (*matched)++;
        } else {
            *matched = buffer[start] == '\r' ? 1 : 0;
        }
        start++;
    }
    if (*matched == 4) *count += n - start;
    return send_all(to, buffer, (size_t)n) == 0;
}

static void *relay_thread(void *argument) {
    struct counting_relay *relay = argument;
    struct pollfd waiting[2] = {{relay->listener, POLLIN, 0}, {relay->stop_pipe[0], POLLIN, 0}};
    if (poll(waiting, 2, -1) <= 0 || !(waiting[0].revents & POLLIN)) return NULL;
    int client = accept4(relay->listener, NULL, NULL, SOCK_CLOEXEC);
    if (client < 0) return NULL;
    int server = ms_echo_client_open((uint16_t)relay->target_port, MS_ECHO_LINE, NULL);  /* a plain connection */
    if (server < 0) {
        close(client);
        return NULL;
    }
    int one = 1;
    setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    int matched[2] = {0, 0};
    for (;;) {
        struct pollfd fds[3] = {{client, POLLIN, 0}, {server, POLLIN, 0}, {relay->stop_pipe[0], POLLIN, 0}};
        if (poll(fds, 3, -1) < 0) {
            if (errno == EINTR) continue;
            break;
        }
        if (fds[2].revents) break;
        if (fds[0].revents && !relay_move(client, server, &matched[0], &relay->counts[0])) break;
        if (fds[1].revents && !relay_move(server, client, &matched[1], &relay->counts[1])) break;
    }
    close(client);
    close(server);
    return NULL;
}

void *ms_counting_relay_start(uint16_t target_port, uint16_t *port) {
    struct counting_relay *relay = calloc(1, sizeof *relay);
    relay->target_port = target_port;
    relay->listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in address;
    memset(&address, 0, sizeof address);
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t size = sizeof address;
    if (bind(relay->listener, (struct sockaddr *)&address, size) != 0 || listen(relay->listener, 4) != 0 ||
        getsockname(relay->listener, (struct sockaddr *)&address, &size) != 0 || pipe2(relay->stop_pipe, O_CLOEXEC) != 0)
        abort();
    *port = ntohs(address.sin_port);
    pthread_create(&relay->thread, NULL, relay_thread, relay);
    return relay;
}

void ms_counting_relay_stop(void *handle, int64_t *client_to_server, int64_t *server_to_client) {
    struct counting_relay *relay = handle;
    (void)!write(relay->stop_pipe[1], "x", 1);
    pthread_join(relay->thread, NULL);
    close(relay->listener);
    close(relay->stop_pipe[0]);
    close(relay->stop_pipe[1]);
    if (client_to_server) *client_to_server = relay->counts[0];
    if (server_to_client) *server_to_client = relay->counts[1];
    free(relay);
}
