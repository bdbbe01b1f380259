/// One piece of a feeder's work: a chunk, or a job's next chunk.
enum FeederItem: Sendable {
    case chunk(@Sendable () -> Void)
    case job(FeedJob)
}

/// A feeder's line of work, on its loop's thread: the items taken from its inbox, in order,
/// consumed from `head` (a paused job steps aside, others run).
final class FeederQueue {
    var items: [FeederItem?] = []
    var head = 0
    var epoch = 0

    var isEmpty: Bool { head == items.count }

    func append(contentsOf more: [FeederItem]) {
        if head > 0 && head == items.count {
            items.removeAll(keepingCapacity: true)
            head = 0
        }
        for item in more { items.append(item) }
    }

    /// The first item that can run now (a paused job steps aside), or nil.
    func firstRunnable() -> Int? {
        var index = head
        while index < items.count {
            switch items[index] {
            case .chunk?: return index
            case .job(let job)?: if job.isRunnable { return index }
            case nil: break
            }
            index += 1
        }
        return nil
    }

    func remove(at index: Int) {
        if index == head {
            items[index] = nil
            head += 1
            if head == items.count || (head >= 1_024 && head * 2 >= items.count) {
                items.removeSubrange(0..<head)
                head = 0
            }
        } else {
            items.remove(at: index)
        }
    }

    func removeAll() -> [FeederItem] {
        let removed = items[head...].compactMap { $0 }
        items.removeAll(keepingCapacity: true)
        head = 0
        return removed
    }
}
