// The plain-C process baselines that `mainspring-bench spawn` and `child-output` measure
// Subprocess against: posix_spawn and waitpid in a loop (no libevent: a C program that starts
// children one after the other needs none), and a child's output read through a bufferevent
// and split with evbuffer_readln on an event_base of its own.
#define _GNU_SOURCE  /* pipe2 */
#include "baselines.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static int64_t monotonic_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int wait_for(pid_t pid, int *status) {
    while (waitpid(pid, status, 0) < 0) {
        if (errno != EINTR) return -1;
    }
    return 0;
}

/* ---- spawn ---- */

int64_t ms_baseline_spawn(const char *path, int64_t duration_ms, double *seconds) {
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
    char *argv[] = {(char *)path, NULL};
    int64_t start = monotonic_ns();
    int64_t deadline = start + duration_ms * 1000000;
    int64_t count = 0;
    int64_t now = start;
    while (now < deadline) {
        pid_t pid;
        int status = 0;
        if (posix_spawn(&pid, path, &actions, NULL, argv, environ) != 0) { count = -1; break; }
        if (wait_for(pid, &status) != 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) { count = -1; break; }
        count++;
        now = monotonic_ns();
    }
    posix_spawn_file_actions_destroy(&actions);
    *seconds = (double)(now - start) / 1e9;
    return count;
}

/* ---- child-output ---- */

struct output_state {
    struct event_base *base;
    int64_t volume;
    int64_t bytes;
    int64_t lines;
    int64_t end_ns;
    int failed;
};

static void output_read_cb(struct bufferevent *bev, void *ctx) {
    struct output_state *s = ctx;
    struct evbuffer *input = bufferevent_get_input(bev);
    size_t length;
    char *line;
    while ((line = evbuffer_readln(input, &length, EVBUFFER_EOL_LF)) != NULL) {
        s->bytes += (int64_t)length + 1;
        s->lines++;
        free(line);
        if (s->bytes >= s->volume) {
            s->end_ns = monotonic_ns();
            event_base_loopbreak(s->base);
            return;
        }
    }
}

static void output_event_cb(struct bufferevent *bev, short what, void *ctx) {
    (void)bev; (void)what;
    struct output_state *s = ctx;
    s->failed = 1;  /* the end of output (or an error) before the volume */
    event_base_loopbreak(s->base);
}

double ms_baseline_child_output(const char *path, const char *argument, int64_t volume, int64_t *lines) {
    int ends[2];
    if (pipe2(ends, O_CLOEXEC) != 0) return -1;
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&actions, ends[1], 1);
    char *argv[] = {(char *)path, (char *)argument, NULL};
    int64_t start = monotonic_ns();
    pid_t pid;
    int rc = posix_spawn(&pid, path, &actions, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&actions);
    close(ends[1]);
    if (rc != 0) {
        close(ends[0]);
        return -1;
    }
    struct event_config *cfg = event_config_new();
    event_config_set_flag(cfg, EVENT_BASE_FLAG_NOLOCK | EVENT_BASE_FLAG_PRECISE_TIMER);
    struct output_state s = {event_base_new_with_config(cfg), volume, 0, 0, 0, 0};
    event_config_free(cfg);
    evutil_make_socket_nonblocking(ends[0]);
    struct bufferevent *bev = bufferevent_socket_new(s.base, ends[0], BEV_OPT_CLOSE_ON_FREE);
    bufferevent_setcb(bev, output_read_cb, NULL, output_event_cb, &s);
    bufferevent_enable(bev, EV_READ);
    event_base_dispatch(s.base);
    bufferevent_free(bev);  /* closes the pipe: yes ends with SIGPIPE if SIGTERM has not come first */
    kill(pid, SIGTERM);
    int status;
    wait_for(pid, &status);
    event_base_free(s.base);
    *lines = s.lines;
    if (s.failed) return -1;
    return (double)(s.end_ns - start) / 1e9;
}
