import Mainspring

// How an `async` route handler runs. Today: in a plain task (the global concurrent executor),
// with its response handed back to the request's loop by `HTTPResponder.send` (one `execute`).
//
// Once `EventLoop` conforms to `TaskExecutor`, this becomes
// `Task(executorPreference: request.loop) { … }`: the handler's body then runs on the request's
// loop thread (between the loop's other callbacks, so fairness applies to it too), and the
// responder's `send`, already on the loop, replies without a hop. Nothing else changes.
extension LoopEndpoint {
    func runAsync(_ body: @escaping @Sendable (HTTPRequest) async throws -> HTTPResponse,
                  request: HTTPRequest, responder: HTTPResponder)
    {
        Task {
            do {
                responder.send(try await body(request))
            } catch {
                responder.send(error: error)
            }
        }
    }
}
