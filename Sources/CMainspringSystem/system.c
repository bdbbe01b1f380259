// Most of this module is static inline functions and declarations in
// include/CMainspringSystem.h; this file holds what must exist once: the signal handler and
// its tables.
#include "CMainspringSystem.h"

#include <errno.h>
#include <stdatomic.h>
#include <string.h>

// Per signal number: the eventfd the handler writes, plus one (0: none yet, so that the table
// needs no initialisation that could race), and the catches not yet taken. Written by the
// handler (async-signal-safe: lock-free atomics and write(2) only).
static _Atomic int ms_signal_fds[MS_SIGNAL_LIMIT];
static _Atomic unsigned long ms_signal_caught[MS_SIGNAL_LIMIT];
// The order of catches across signals: each signal's first catch since it was last taken gets
// the next number, so that a loop delivers signals caught together in the order they came.
static _Atomic unsigned long ms_signal_sequence;
static _Atomic unsigned long ms_signal_first[MS_SIGNAL_LIMIT];

static void ms_signal_handler(int signo) {
    if (signo <= 0 || signo >= MS_SIGNAL_LIMIT) return;
    int saved = errno;
    if (atomic_fetch_add(&ms_signal_caught[signo], 1) == 0) {
        atomic_store(&ms_signal_first[signo], atomic_fetch_add(&ms_signal_sequence, 1) + 1);
    }
    int fd = atomic_load(&ms_signal_fds[signo]) - 1;
    if (fd >= 0) {
        uint64_t one = 1;
        ssize_t written = write(fd, &one, sizeof one);
        (void)written;  // EAGAIN: the eventfd is already readable, which is all that matters
    }
    errno = saved;
}

int ms_signal_install(int signo, int eventfd, struct sigaction *previous) {
    if (signo <= 0 || signo >= MS_SIGNAL_LIMIT) {
        errno = EINVAL;
        return -1;
    }
    atomic_store(&ms_signal_fds[signo], eventfd + 1);
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = ms_signal_handler;
    // Every other signal waits while the handler runs: signals pending together are then taken
    // one handler after the other, in the kernel's order (lowest number first), instead of
    // nesting — a nested handler runs before the one it interrupted, which would invert their
    // order numbers.
    sigfillset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    return sigaction(signo, &action, previous);
}

int ms_signal_restore(int signo, const struct sigaction *previous) {
    if (signo <= 0 || signo >= MS_SIGNAL_LIMIT) {
        errno = EINVAL;
        return -1;
    }
    return sigaction(signo, previous, NULL);
}

unsigned long ms_signal_take(int signo, unsigned long *_Nullable first) {
    if (signo <= 0 || signo >= MS_SIGNAL_LIMIT) return 0;
    unsigned long count = atomic_exchange(&ms_signal_caught[signo], 0);
    unsigned long order = atomic_exchange(&ms_signal_first[signo], 0);
    if (first) *first = order;
    return count;
}
