// The operating-system calls Mainspring needs that Swift cannot call directly: variadic
// functions (`syscall`, `prctl`), an inline instruction (the cycle counter), and libdispatch's
// main-queue hooks, which are exported but declared only in libdispatch's private headers.
// Only Sources/Mainspring/System/ imports this module (and the tests, for `mallinfo2` and
// `malloc_usable_size`).
#ifndef MAINSPRING_SYSTEM_SHIM_H
#define MAINSPRING_SYSTEM_SHIM_H

#include <stdint.h>
// Linux-only calls that Swift's Glibc module does not export.
#include <malloc.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

/// The kernel thread id of the caller (`gettid(2)` through `syscall`, which is variadic).
static inline int ms_gettid(void) { return (int)syscall(SYS_gettid); }

/// The CPU's cycle counter (x86-64 `rdtsc`, AArch64 `cntvct_el0`), or 0 where there is none.
/// About 10 ns against about 24 ns for clock_gettime; see System/FastClock.swift.
static inline uint64_t ms_cycle_counter(void) {
#if defined(__x86_64__)
    unsigned lo, hi;
    __asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
    return ((uint64_t)hi << 32) | lo;
#elif defined(__aarch64__)
    uint64_t value;
    __asm__ volatile("mrs %0, cntvct_el0" : "=r"(value));
    return value;
#else
    return 0;
#endif
}

/// Sets the calling thread's timer slack (`prctl(PR_SET_TIMERSLACK)`, variadic in C): how late
/// the kernel may wake it from a timed sleep. The default, 50 µs, would blur a 100 µs pattern.
static inline int ms_set_timer_slack(unsigned long nanoseconds) {
    return prctl(PR_SET_TIMERSLACK, nanoseconds, 0, 0, 0);
}

/// `pipe2(2)` through `syscall` (glibc declares `pipe2` only under `_GNU_SOURCE`): a pipe made
/// close-on-exec and non-blocking atomically.
static inline int ms_pipe2(int fds[_Nonnull 2], int flags) { return (int)syscall(SYS_pipe2, fds, flags); }

// Signal delivery without libevent's signal events (and without a thread of their own): a
// handler that counts each catch and writes the signal's eventfd, which the watching loop polls
// like any descriptor. Installed and removed with sigaction(2) on the calling thread, so both
// take effect before the call returns. Numbers 1 to MS_SIGNAL_LIMIT - 1. Used only by
// System/SignalCalls.swift.
#include <signal.h>
#define MS_SIGNAL_LIMIT 65

/// Routes `signo` to the handler, which writes `eventfd` on every catch; `previous` receives
/// the disposition it replaces. 0, or -1 with errno (EINVAL for SIGKILL, SIGSTOP, a bad number).
int ms_signal_install(int signo, int eventfd, struct sigaction *_Nullable previous);
/// Puts `previous` back. 0, or -1 with errno.
int ms_signal_restore(int signo, const struct sigaction *_Nonnull previous);
/// The catches of `signo` since the last call (and resets the count); `first`, if given,
/// receives the order of the first of them among all signals' catches (0 if unknown).
unsigned long ms_signal_take(int signo, unsigned long *_Nullable first);

// Child processes (System/ProcessCalls.swift): posix_spawn with the file actions and attributes
// a child needs (glibc's `_np` actions are declared weak in system.c and looked for at run
// time), pidfds (`pidfd_open` and `pidfd_send_signal` through `syscall`, Linux 5.3 and 5.1), and
// reaping with `waitid(P_PIDFD, …)` or `waitpid` without waiting. siginfo_t's union is read
// here, not in Swift.
#include <spawn.h>
#include <sys/types.h>

/// What a child's standard descriptor 0, 1 or 2 becomes: one of these, or a descriptor of the
/// parent's (>= 0) that is duplicated onto it.
#define MS_SPAWN_INHERIT (-1)
#define MS_SPAWN_NULL (-2)

/// Starts `path` with `argv` and `envp` (NULL: the parent's environment). `stdio[i]` is what
/// descriptor i becomes (`MS_SPAWN_INHERIT`, `MS_SPAWN_NULL`, or a descriptor to duplicate);
/// every other descriptor is closed in the child (`posix_spawn_file_actions_addclosefrom_np`,
/// where glibc has it: 2.34 on). `directory` (or NULL) is changed to before the exec
/// (`posix_spawn_file_actions_addchdir_np`, glibc 2.29). A new process group when
/// `new_process_group`. The child starts with no signal blocked and every signal at its default
/// disposition. 0 with `*pid` set, or the errno (glibc reports a failed chdir or exec here).
int ms_spawn(pid_t *_Nonnull pid, const char *_Nonnull path, char *_Nullable const argv[_Nonnull],
             char *_Nullable const envp[_Nullable], const char *_Nullable directory, const int stdio[_Nonnull 3],
             int new_process_group);
/// Whether glibc has the close-from spawn action (otherwise only close-on-exec keeps a child's
/// descriptors to the three it is given).
int ms_spawn_has_closefrom(void);
/// Whether glibc has the chdir spawn action (a working directory needs it).
int ms_spawn_has_chdir(void);

/// `pidfd_open(pid, 0)`: a descriptor that becomes readable when the process exits, or -1 with
/// errno (ENOSYS before Linux 5.3).
int ms_pidfd_open(pid_t pid);
/// `pidfd_send_signal(pidfd, signal, NULL, 0)`: 0, or -1 with errno.
int ms_pidfd_send_signal(int pidfd, int signal);

/// How a reaped child ended (`ms_reap_*`): `exited` 1 with its status in `value`, or 0 with the
/// signal that ended it.
struct ms_exit { int exited; int value; };
/// Reaps the child behind `pidfd` if it has exited (`waitid(P_PIDFD, …, WEXITED | WNOHANG)`):
/// 1 with `*result` set, 0 while it runs, -1 with errno (EINVAL where the kernel lacks P_PIDFD:
/// before 5.4; ECHILD when something else reaped it).
int ms_reap_pidfd(int pidfd, struct ms_exit *_Nonnull result);
/// The same for a process ID (`waitpid(pid, …, WNOHANG)`).
int ms_reap_pid(pid_t pid, struct ms_exit *_Nonnull result);

// File watching (System/InotifyCalls.swift): inotify, declared by <sys/inotify.h>.
#include <sys/inotify.h>

// libdispatch's main-queue hooks for run loops (the two CoreFoundation's CFRunLoop uses). On
// Linux the handle is an eventfd that libdispatch writes whenever the main queue goes from empty
// to non-empty (and again after a drain that left work behind); it never reads it: the run loop
// resets it before draining. The callback runs the blocks queued when it starts, on the main
// thread only, and returns at once when called re-entrantly from inside one of those blocks.
// Used only by System/DispatchMainQueue.swift.
int _dispatch_get_main_queue_handle_4CF(void);
void _dispatch_main_queue_callback_4CF(void *_Nullable msg);

// Datagrams in batches: recvmmsg(2) and sendmmsg(2), which glibc declares only under
// _GNU_SOURCE (datagrams.c defines it). Used only by System/DatagramCalls.swift.
#include <stddef.h>
#define MS_DATAGRAM_ADDRESS_SIZE 128  /* sizeof(struct sockaddr_storage) */

/// Receives up to `count` datagrams (at most 64) with one recvmmsg(2), non-blocking. Datagram
/// i goes to `buffers + i * size`; its real length (the sender's, even when longer than
/// `size`: MSG_TRUNC is asked for) to `lengths[i]`, 1 to `truncated[i]` when it was cut; its
/// sender to `addresses + i * MS_DATAGRAM_ADDRESS_SIZE` with length `address_lengths[i]`.
/// The number received, or -1 with errno (EAGAIN when none is waiting).
int ms_receive_datagrams(int fd, unsigned char *_Nonnull buffers, size_t size, unsigned count,
                         size_t *_Nonnull lengths, unsigned char *_Nonnull truncated,
                         unsigned char *_Nonnull addresses, unsigned *_Nonnull address_lengths);

/// Sends up to `count` datagrams (at most 64) with one sendmmsg(2), non-blocking: datagram i is
/// `sizes[i]` bytes of `payload` after the previous ones, to the address at
/// `addresses + i * MS_DATAGRAM_ADDRESS_SIZE` of length `address_lengths[i]` (0: the connected
/// peer). The number sent (fewer when the socket's buffer filled), or -1 with errno for the
/// first datagram (EAGAIN: the buffer is full; EMSGSIZE: too large).
int ms_send_datagrams(int fd, const unsigned char *_Nonnull payload, const size_t *_Nonnull sizes, unsigned count,
                      const unsigned char *_Nonnull addresses, const unsigned *_Nonnull address_lengths);

#endif
