import Foundation
import Mainspring
import Synchronization

/// A chat room: every line a member sends goes to every other member — fan-out that stays
/// bounded whatever the members do.
///
/// Each member's output is capped by its connection's `outputLimit`: a message is offered with
/// `trySend`, which never suspends and never buffers past the limit. A member that is full gets
/// a grace period — the sender waits for it with `waitUntilWritable(timeout:)`, reading nothing
/// meanwhile, so its own peer slows down through TCP — and when the grace runs out the
/// slow-consumer policy applies: its messages are dropped until it catches up (`.drop`), or it
/// is disconnected (`.disconnect`). Either way it is counted, its memory stays bounded (its
/// buffered output plus what the kernel holds for it), and every other member keeps receiving
/// every message, in order.
///
/// Members are served by tasks on their own loops (`connection.loop`); the member list is
/// shared by all of them under one lock, copied on change, so a broadcast reads it once.
public final class ChatRoom: Sendable {
    /// What happens to a member that stays full for longer than the grace period.
    public enum SlowConsumerPolicy: String, Sendable {
        /// Drop the messages it cannot take, until it is writable again (counted).
        case drop
        /// Close its connection (counted).
        case disconnect
    }

    /// Counters, readable from any thread.
    public struct Statistics: Sendable, Equatable {
        public var members: Int
        public var messages: Int
        public var delivered: Int
        public var dropped: Int
        public var disconnected: Int
    }

    public let policy: SlowConsumerPolicy
    /// How long a sender waits for a full member before the policy applies.
    public let grace: Duration
    /// An `NSLock` (`Guarded`), not `Mutex`: ThreadSanitizer does not see `Mutex`'s futex as
    /// synchronisation, and reported the members' list as raced.
    private let members = Guarded<[Member]>([])
    private let counters = Counters()

    private final class Member: Sendable {
        let connection: Connection
        /// Its grace ran out: messages are dropped until it is writable again (`.drop`).
        let isLagging = Atomic<Bool>(false)
        init(_ connection: Connection) { self.connection = connection }
    }

    private final class Counters: Sendable {
        let messages = Atomic<Int>(0)
        let delivered = Atomic<Int>(0)
        let dropped = Atomic<Int>(0)
        let disconnected = Atomic<Int>(0)
    }

    public init(policy: SlowConsumerPolicy = .drop, grace: Duration = .seconds(2)) {
        self.policy = policy
        self.grace = grace
    }

    public var statistics: Statistics {
        Statistics(members: members.withLock { $0.count }, messages: counters.messages.load(ordering: .relaxed),
                   delivered: counters.delivered.load(ordering: .relaxed),
                   dropped: counters.dropped.load(ordering: .relaxed),
                   disconnected: counters.disconnected.load(ordering: .relaxed))
    }

    /// Serves one member until it leaves: its lines go to the others; `/stats` is answered to
    /// it alone. Run it in a task that prefers `connection.loop`.
    public func serve(_ connection: Connection) async {
        let member = Member(connection)
        members.withLock { $0.append(member) }
        defer {
            members.withLock { list in list.removeAll { $0 === member } }
            connection.close()
        }
        do {
            for try await event in connection.lines {
                guard case .line(let text) = event else { continue }
                if text == "/stats" {
                    let figures = statistics
                    try await connection.send(line: "stats members=\(figures.members) messages=\(figures.messages) "
                        + "delivered=\(figures.delivered) dropped=\(figures.dropped) disconnected=\(figures.disconnected)")
                    continue
                }
                await broadcast(text, from: member)
            }
        } catch {
            // Reset, closed as a slow consumer, shut down: this member leaves.
        }
    }

    /// Offers `text` to every member but the sender, in one pass.
    private func broadcast(_ text: String, from sender: Member) async {
        counters.messages.add(1, ordering: .relaxed)
        let everyone = members.withLock { $0 }
        for member in everyone where member !== sender {
            if member.connection.trySend(line: text) {
                if member.isLagging.load(ordering: .relaxed) { member.isLagging.store(false, ordering: .relaxed) }
                counters.delivered.add(1, ordering: .relaxed)
                continue
            }
            if !member.connection.isOpen { continue }
            if member.isLagging.load(ordering: .relaxed) {
                // Still behind (or being closed): no second grace.
                if policy == .drop { counters.dropped.add(1, ordering: .relaxed) }
                continue
            }
            // Full: give it the grace period (this sender reads nothing meanwhile).
            let writable = (try? await member.connection.waitUntilWritable(timeout: grace)) ?? false
            if writable && member.connection.trySend(line: text) {
                counters.delivered.add(1, ordering: .relaxed)
                continue
            }
            switch policy {
            case .drop:
                member.isLagging.store(true, ordering: .relaxed)
                counters.dropped.add(1, ordering: .relaxed)
            case .disconnect:
                member.isLagging.store(true, ordering: .relaxed)  // counted once, however long the close takes
                counters.disconnected.add(1, ordering: .relaxed)
                member.connection.close()
            }
        }
    }
}
