import Testing
@testable import MainspringCore

/// The library's one heap (a loop's timers, a simulated network's events), against a sorted
/// array: the same order out, equal keys in insertion order, every element's reported place
/// right after every operation.
@Suite("MinHeap: the one heap of timers and simulated events")
struct MinHeapTests {
    /// An element that records its place, as a timer does.
    final class Item: MinHeapElement {
        let key: Int
        let sequence: Int
        var place = -1
        init(key: Int, sequence: Int) { self.key = key; self.sequence = sequence }
        func precedes(_ other: Item) -> Bool { (key, sequence) < (other.key, other.sequence) }
        func movedTo(index: Int) { place = index }
    }

    @Test func randomInsertsRemovalsAndRekeysComeOutInOrderWithTheirPlacesKept() {
        var generator = SplitMix(state: 7)
        var heap = MinHeap<Item>()
        var live: [Item] = []
        var sequence = 0
        var popped: [(Int, Int)] = []
        for step in 0..<5_000 {
            switch Int.random(in: 0..<10, using: &generator) {
            case 0..<5:
                sequence += 1
                let item = Item(key: Int.random(in: 0..<50, using: &generator), sequence: sequence)
                heap.insert(item)
                live.append(item)
            case 5..<7 where !live.isEmpty:
                // Remove one by its place, as a cancelled timer is.
                let item = live.remove(at: Int.random(in: 0..<live.count, using: &generator))
                #expect(heap[item.place] === item, "step \(step)")
                heap.remove(at: item.place)
                #expect(item.place == -1)
            case 7..<9 where !live.isEmpty:
                // Re-key one in place, as a re-armed timer is (its entry replaced by one with the new key).
                let position = Int.random(in: 0..<live.count, using: &generator)
                let item = live[position]
                let replacement = Item(key: Int.random(in: 0..<50, using: &generator), sequence: item.sequence)
                heap.update(at: item.place) { $0 = replacement }
                live[position] = replacement
            default:
                guard let first = heap.first else { continue }
                let expected = live.min { $0.precedes($1) }!
                #expect(first === expected, "step \(step)")
                #expect(heap.removeFirst() === first)
                live.removeAll { $0 === first }
                popped.append((first.key, first.sequence))
            }
            #expect(heap.count == live.count)
            for item in live where heap[item.place] !== item {
                Issue.record("step \(step): an element's reported place is wrong")
                return
            }
        }
        var rest: [(Int, Int)] = []
        while let first = heap.first {
            heap.removeFirst()
            rest.append((first.key, first.sequence))
        }
        #expect(rest.elementsEqual(rest.sorted { $0 < $1 }) { $0 == $1 }, "drained in (key, sequence) order")
        #expect(rest.count == live.count && !popped.isEmpty)
    }
}
