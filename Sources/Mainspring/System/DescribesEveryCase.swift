/// An error type with deprecated cases whose `description` still names every case.
///
/// A `switch` that names a deprecated case warns, unless the code around it is deprecated too.
/// So the type's exhaustive `switch` (no `default`: a new case cannot be forgotten) lives in a
/// deprecated `text`, and its `description` is ``caseDescription``, which reaches `text`
/// through this protocol: no warning, no `default`. `EventLoopError`, `Connection.CloseReason`
/// and `HTTPClientError` describe themselves so.
package protocol DescribesEveryCase {
    /// The text of every case, the deprecated ones included. Declared deprecated by the type
    /// (`@available(*, deprecated, message: "use description")`) so that it may name them.
    var text: String { get }
}

extension DescribesEveryCase {
    /// `text`, reached through the protocol (what the type's `description` returns).
    package var caseDescription: String { text }
}
