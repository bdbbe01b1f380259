#if canImport(Glibc)
import Glibc
#endif

/// Told when the thread that held it in a `ThreadLocalReference` exits.
protocol ThreadExitObserver: AnyObject {
    func threadDidExit()
}

/// A per-thread strong reference to an object, released when its thread exits
/// (a `pthread_key_t` with a destructor). Used for `EventLoop.current`.
final class ThreadLocalReference<Object: AnyObject>: @unchecked Sendable {
    private var key = pthread_key_t()

    init() {
        // Ownership: `set` stores a +1 reference (passRetained); the destructor below releases it
        // exactly once when the thread exits.
        let rc = pthread_key_create(&key) { pointer in
            guard let pointer else { return }
            let object = Unmanaged<AnyObject>.fromOpaque(pointer)
            (object.takeUnretainedValue() as? ThreadExitObserver)?.threadDidExit()
            object.release()
        }
        precondition(rc == 0, "Mainspring: pthread_key_create failed (\(rc))")
    }

    /// The calling thread's object, if it set one.
    var value: Object? {
        guard let pointer = pthread_getspecific(key) else { return nil }
        return Unmanaged<AnyObject>.fromOpaque(pointer).takeUnretainedValue() as? Object
    }

    /// Stores `object` for the calling thread (once; the thread keeps it until it exits).
    func set(_ object: Object) {
        precondition(pthread_getspecific(key) == nil, "Mainspring: thread-local set twice")
        pthread_setspecific(key, Unmanaged<AnyObject>.passRetained(object).toOpaque())
    }
}

/// A per-thread *unretained* reference (a `pthread_key_t` without a destructor). The owner must
/// keep the object alive while it is set and clear it before letting go: used for the loop a
/// thread is running right now, set and restored around `run`/`spin`/`runOnce`.
final class ThreadLocalUnretained<Object: AnyObject>: @unchecked Sendable {
    private var key = pthread_key_t()

    init() {
        let rc = pthread_key_create(&key, nil)
        precondition(rc == 0, "Mainspring: pthread_key_create failed (\(rc))")
    }

    /// The calling thread's object, if one is set.
    var value: Object? {
        guard let pointer = pthread_getspecific(key) else { return nil }
        return Unmanaged<Object>.fromOpaque(pointer).takeUnretainedValue()
    }

    /// Sets (or with `nil` clears) the calling thread's object, without retaining it.
    func set(_ object: Object?) {
        pthread_setspecific(key, object.map { Unmanaged.passUnretained($0).toOpaque() })
    }
}
