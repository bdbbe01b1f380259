// The one door from outside Mainspring to a loop's libevent base, for MainspringTLS's OpenSSL
// bufferevents (an established session's, and the filter over a simulated stream). It is SPI
// (named `MainspringHTTP`): not part of the public API, and only for code that follows the
// loop's rules — touch the base on the loop's thread only, and from libevent's callbacks only
// record what happened and hand the rest to the loop (`execute`), never run user code inside them.
internal import CLibevent

extension EventLoop {
    /// The loop's `struct event_base *`. Valid while the loop lives; use it on the loop's thread
    /// only (the base is created without locks).
    @_spi(MainspringHTTP)
    public var eventBasePointer: OpaquePointer { base.raw }
}
