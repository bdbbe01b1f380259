/// Something built outside Mainspring that lives on a loop the way its sources do (libevent's
/// HTTP server, say): the loop closes it when it shuts down, and its in-flight work keeps a
/// graceful shutdown waiting (`EventLoopGroup.shutdown(gracePeriod:)`).
///
/// SPI for MainspringHTTP. Loop-bound: create it, change its work count and close it on the
/// loop's thread (preconditions). Costs one registered source; `beginWork`/`endWork` are an
/// integer add each.
@_spi(MainspringHTTP)
public final class LoopAttachment {
    private let source: AttachmentSource

    /// Registers an attachment on `loop`. `onClose` runs once, on the loop's thread, when the
    /// attachment is closed — by `close()` or because the loop shuts down (then after the grace
    /// period, with work possibly still in flight).
    public init(loop: EventLoop, onClose: @escaping () -> Void) {
        loop.preconditionOnLoop("LoopAttachment.init(loop:onClose:)")
        source = AttachmentSource(loop: loop, onClose: onClose)
    }

    /// Counts one more piece of in-flight work: the loop is not quiescent until `endWork()`.
    public func beginWork() { source.adjustWork(by: 1) }

    /// Ends one piece of in-flight work begun with `beginWork()`.
    public func endWork() { source.adjustWork(by: -1) }

    /// In-flight work counted now.
    public var workInFlight: Int { source.work }

    /// Whether the attachment is closed.
    public var isClosed: Bool { source.isClosed }

    /// Closes the attachment (its in-flight work stops counting) and runs `onClose`. Idempotent.
    public func close() {
        source.loop.preconditionOnLoop("LoopAttachment.close()")
        source.close()
    }
}

@available(*, unavailable)
extension LoopAttachment: Sendable {}

/// The loop side of a `LoopAttachment`: never ready, only closed.
private final class AttachmentSource: Source {
    private var onClose: (() -> Void)?
    private(set) var work = 0

    init(loop: EventLoop, onClose: @escaping () -> Void) {
        self.onClose = onClose
        super.init(loop: loop, priority: .input)
    }

    func adjustWork(by delta: Int) {
        withLoop { loop in
            loop.preconditionOnLoop("LoopAttachment.beginWork()/endWork()")
            guard !isClosed else { return }
            let before = work
            work = max(0, work + delta)
            loop.busySources += work - before
        }
    }

    override func didClose() {
        loop.busySources -= work
        work = 0
        let action = onClose
        onClose = nil
        action?()
    }
}
