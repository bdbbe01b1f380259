// mainspring-fixture <scenario>: programs the test suite runs as subprocesses, for behaviour that
// needs the process main thread (EventLoop.main, DispatchQueue.main, @MainActor).
//
// Each scenario prints `key=value` lines on stdout and exits 0; a failed check prints
// `FAIL: …` on stderr and exits 1. A watchdog ends a hung scenario with status 3.
// The tests (Tests/Support/Fixture.swift runs it) assert the exit status and the lines.
import Foundation
import Mainspring

var scenarios: [String: @MainActor () throws -> Void] = [
    "interleave": interleaveScenario,
    "run-off-main": runOffMainScenario,
    "main-sync": mainSyncScenario,
    "nested-spin": nestedSpinScenario,
    "actors": actorsScenario,
    "wait-for-start": waitForStartScenario,
    "echo": echoScenario,
    "readme-daemon": readmeDaemonScenario,
    "readme-systemd": readmeSystemdScenario,
    "operations-main-wait": operationsMainWaitScenario,
    "leak-check": leakCheckScenario,
    "signal-default": signalDefaultScenario,
    "async-cancel": asyncCancelScenario,
    "async-signals": asyncSignalsScenario,
    "async-stdin": asyncStdinScenario,
    "async-second-consumer": asyncSecondConsumerScenario,
    "group-takeover": groupTakeoverScenario,
    "duration-misuse": durationMisuseScenario,
    "thousand-children": thousandChildrenScenario,
    "foundation-process-beside": foundationProcessBesideScenario,
    "descriptor-exhaustion": descriptorExhaustionScenario,
    "service-group": serviceGroupScenario,
]
#if MAINSPRING_MAIN_EXECUTOR
scenarios["main-executor"] = mainExecutorScenario
#endif

let arguments = CommandLine.arguments.dropFirst()
guard let name = arguments.first, let scenario = scenarios[name] else {
    FileHandle.standardError.write(Data("usage: mainspring-fixture <\(scenarios.keys.sorted().joined(separator: "|"))>\n".utf8))
    exit(2)
}
// 1,000 children take longer than the rest under the sanitizers. 90 s for the others: the test
// driving a scenario runs on a cooperative pool the suite keeps busy, and was seen to read a
// scenario's `ready` line 30 s late — the watchdog then ended a scenario that was only waiting
// for the test's next step (its signal).
startWatchdog(seconds: name == "thousand-children" ? 150 : 90)
do {
    try scenario()
} catch {
    fail("\(name) threw \(error)")
}
exit(0)
