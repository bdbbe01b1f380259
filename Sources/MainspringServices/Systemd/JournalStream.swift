import Foundation
import MainspringCore

/// Whether a descriptor writes to systemd's journal, which reads a syslog priority prefix
/// (`<3>` error, `<4>` warning, `<6>` info, …) at the start of each line it receives.
///
/// systemd connects a service's standard output and error to the journal through a stream
/// socket and tells the service which one in `$JOURNAL_STREAM` (`device:inode`). The variable
/// is inherited, so a child whose stderr was redirected elsewhere still has it: only a match
/// with the descriptor's own device and inode counts.
public enum JournalStream {
    /// Whether `descriptor` (standard error by default) is the stream `$JOURNAL_STREAM` in
    /// `environment` names. False when the variable is not set or malformed, or the descriptor
    /// is not open. Any thread; one `fstat(2)`.
    public static func isConnected(_ descriptor: Int32 = 2,
                                   environment: [String: String] = ProcessInfo.processInfo.environment) -> Bool
    {
        guard let value = environment["JOURNAL_STREAM"] else { return false }
        let parts = value.split(separator: ":", omittingEmptySubsequences: false)
        guard parts.count == 2, let device = UInt64(parts[0]), let inode = UInt64(parts[1]),
              let identity = FileIdentity(of: descriptor) else { return false }
        return identity.device == device && identity.inode == inode
    }
}
