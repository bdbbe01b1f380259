#if canImport(Glibc)
import Glibc
#endif

/// A value behind a `pthread_mutex_t`: Mainspring's one lock, in every module of the package
/// (what `Synchronization.Mutex` would be, but for the sanitizer; see below).
///
/// Why not `Synchronization.Mutex`: on Linux its contended path parks in a futex inside the
/// uninstrumented Synchronization library, so ThreadSanitizer misses the happens-before edge
/// and reports false races on every contended lock. ThreadSanitizer intercepts pthread mutexes,
/// so with this lock a TSan run of the suite reports only real races. Uncontended cost is the
/// same (one atomic to lock, one to unlock).
///
/// Never call user code or resume a continuation inside `withLock`.
///
/// `package`: every module of the package locks with it (Patterns, Services, HTTP, TLS, Testing);
/// `withLock` is inlinable so that HTTP's per-request locking costs what the core's does.
package final class Protected<Value>: @unchecked Sendable {
    @usableFromInline let mutex: UnsafeMutablePointer<pthread_mutex_t>
    /// Only touched inside `withLock`, under the mutex: the mutex is the exclusivity check (a
    /// dynamic one would cost some 80 instructions per access).
    @exclusivity(unchecked) @usableFromInline var value: Value

    package init(_ value: Value) {
        self.value = value
        mutex = .allocate(capacity: 1)
        mutex.initialize(to: pthread_mutex_t())
        let rc = pthread_mutex_init(mutex, nil)
        precondition(rc == 0, "Mainspring: pthread_mutex_init failed (\(rc))")
    }

    deinit {
        pthread_mutex_destroy(mutex)
        mutex.deinitialize(count: 1)
        mutex.deallocate()
    }

    /// Runs `body` with exclusive access to the value.
    @inlinable @inline(__always)
    package func withLock<Result, Failure: Error>(_ body: (inout Value) throws(Failure) -> Result) throws(Failure) -> Result {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return try body(&value)
    }
}
