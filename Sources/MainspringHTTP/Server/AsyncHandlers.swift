import MainspringCore

// How an `async` route handler runs: in a task that prefers the request's loop as its executor
// (`Task(executorPreference:)`), so the handler's body runs on the loop's thread, between the
// loop's other callbacks (fairness applies to it too: a handler that never suspends holds the
// loop like a long callback; `await request.loop.yield()` lets input in), and the responder's
// `send`, already on the loop, replies without a hop. What the handler awaits on other
// executors (an actor, `Task.sleep`) hops there and back as usual.
extension LoopEndpoint {
    func runAsync(_ body: @escaping @Sendable (HTTPRequest) async throws -> HTTPResponse,
                  request: HTTPRequest, responder: HTTPResponder)
    {
        Task(executorPreference: request.loop) {
            do {
                responder.send(try await body(request))
            } catch {
                responder.send(error: error)
            }
        }
    }
}
