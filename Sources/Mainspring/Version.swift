/// The version of Mainspring this program is built with, in semantic-versioning form
/// (`major.minor.patch`): `"0.1.0"`. What each version brings is listed in the package's
/// CHANGELOG.md.
///
/// Refer to it qualified, as `Mainspring.version` (or `MainspringCore.version` where only the
/// core is imported): inside your own code a plain `version` names your own declaration first. Handy for a `--version` flag or a start-up log line:
///
/// ```swift
/// print("mydaemon 1.4 (Mainspring \(Mainspring.version))")
/// ```
///
/// While the major version is 0, a minor release (0.2.0) may change the API; pin with
/// `.upToNextMinor(from: "0.1.0")` to take only its patch releases.
public let version = "0.1.0"
