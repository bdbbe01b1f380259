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

// ---- Child processes ----

#include <fcntl.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_send_signal
#define SYS_pidfd_send_signal 424
#endif
#ifndef P_PIDFD
#define P_PIDFD 3
#endif

extern char **environ;

// glibc declares these only under _GNU_SOURCE, and has them only from 2.29 (chdir) and 2.34
// (closefrom): weak, so that a glibc without them leaves them NULL instead of failing to load.
extern int posix_spawn_file_actions_addclosefrom_np(posix_spawn_file_actions_t *, int) __attribute__((weak));
extern int posix_spawn_file_actions_addchdir_np(posix_spawn_file_actions_t *, const char *) __attribute__((weak));

int ms_spawn_has_closefrom(void) { return posix_spawn_file_actions_addclosefrom_np != NULL; }
int ms_spawn_has_chdir(void) { return posix_spawn_file_actions_addchdir_np != NULL; }

int ms_spawn(pid_t *pid, const char *path, char *const argv[], char *const envp[], const char *directory,
             const int stdio[3], int new_process_group) {
    posix_spawn_file_actions_t actions;
    posix_spawnattr_t attributes;
    int rc = posix_spawn_file_actions_init(&actions);
    if (rc != 0) return rc;
    rc = posix_spawnattr_init(&attributes);
    if (rc != 0) {
        posix_spawn_file_actions_destroy(&actions);
        return rc;
    }
    for (int fd = 0; fd < 3 && rc == 0; fd++) {
        if (stdio[fd] == MS_SPAWN_NULL) {
            rc = posix_spawn_file_actions_addopen(&actions, fd, "/dev/null", fd == 0 ? O_RDONLY : O_WRONLY, 0);
        } else if (stdio[fd] >= 0) {
            // dup2 onto itself is no copy: it only clears close-on-exec (glibc 2.29 on), which is
            // what a descriptor that is already in place needs.
            rc = posix_spawn_file_actions_adddup2(&actions, stdio[fd], fd);
        }
    }
    // After the dup2s (the actions run in order): everything from 3 up is closed in the child.
    if (rc == 0 && posix_spawn_file_actions_addclosefrom_np != NULL) {
        rc = posix_spawn_file_actions_addclosefrom_np(&actions, 3);
    }
    if (rc == 0 && directory != NULL) {
        rc = posix_spawn_file_actions_addchdir_np != NULL ? posix_spawn_file_actions_addchdir_np(&actions, directory)
                                                          : ENOSYS;
    }
    short flags = POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF;
    if (new_process_group) flags |= POSIX_SPAWN_SETPGROUP;
    sigset_t none, all;
    sigemptyset(&none);
    sigfillset(&all);
    if (rc == 0) rc = posix_spawnattr_setsigmask(&attributes, &none);
    if (rc == 0) rc = posix_spawnattr_setsigdefault(&attributes, &all);
    if (rc == 0 && new_process_group) rc = posix_spawnattr_setpgroup(&attributes, 0);
    if (rc == 0) rc = posix_spawnattr_setflags(&attributes, flags);
    if (rc == 0) rc = posix_spawn(pid, path, &actions, &attributes, argv, envp != NULL ? envp : environ);
    posix_spawnattr_destroy(&attributes);
    posix_spawn_file_actions_destroy(&actions);
    return rc;
}

int ms_pidfd_open(pid_t pid) { return (int)syscall(SYS_pidfd_open, pid, 0); }

int ms_pidfd_send_signal(int pidfd, int signal) { return (int)syscall(SYS_pidfd_send_signal, pidfd, signal, NULL, 0); }

int ms_reap_pidfd(int pidfd, struct ms_exit *result) {
    siginfo_t info;
    memset(&info, 0, sizeof info);
    int rc;
    do {
        rc = waitid((idtype_t)P_PIDFD, (id_t)pidfd, &info, WEXITED | WNOHANG);
    } while (rc < 0 && errno == EINTR);
    if (rc < 0) return -1;
    if (info.si_pid == 0) return 0;  // still running
    result->exited = info.si_code == CLD_EXITED;
    result->value = info.si_status;
    return 1;
}

int ms_reap_pid(pid_t pid, struct ms_exit *result) {
    int status = 0;
    pid_t rc;
    do {
        rc = waitpid(pid, &status, WNOHANG);
    } while (rc < 0 && errno == EINTR);
    if (rc < 0) return -1;
    if (rc == 0) return 0;
    result->exited = WIFEXITED(status);
    result->value = WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status);
    return 1;
}
