#!/bin/sh
# Builds a throw-away package that depends on one of Mainspring's library products, for each of
# them (the Mainspring umbrella, MainspringCore, MainspringPatterns, MainspringServices,
# MainspringHTTP, MainspringTLS, MainspringTesting), and checks that the build compiled exactly the library targets that product
# needs: a dependent compiles only what it uses (no HTTP for a TLS user, no patterns for a core
# user). Exits non-zero naming the product and the targets that should not have been compiled.
# Then a dependent that calls a loop-thread-only method from async code must not compile, and
# the compiler's error must name the method's any-thread twin (one rule for loop-only calls).
set -eu
root="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
status=0
check() {
    product="$1"; expected="$2"
    dir="$work/$product"
    mkdir -p "$dir/Sources/app"
    cat > "$dir/Package.swift" <<PACKAGE
// swift-tools-version:6.2
import PackageDescription
let package = Package(name: "app", dependencies: [.package(path: "$root")], targets: [
    .executableTarget(name: "app", dependencies: [.product(name: "$product", package: "$(basename "$root")")])
])
PACKAGE
    echo "import $product" > "$dir/Sources/app/main.swift"
    if ! ${SWIFT:-swift} build --package-path "$dir" -q; then
        echo "check-dependents: a package depending on $product does not build (above)"
        status=1
        return 0
    fi
    compiled="$(for d in "$dir"/.build/debug/*.build; do
        name="$(basename "$d" .build)"
        [ "$name" = app ] && continue
        ls "$d" | grep -q '\.o$' && echo "$name"
    done | sort | tr '\n' ' ')"
    if [ "$compiled" = "$expected " ]; then
        echo "check-dependents: $product compiles $compiled"
    else
        echo "check-dependents: $product compiled [$compiled], expected [$expected]"
        status=1
    fi
}
check Mainspring "CMainspringSystem Mainspring MainspringCore MainspringPatterns MainspringServices"
check MainspringCore "CMainspringSystem MainspringCore"
check MainspringPatterns "CMainspringSystem MainspringCore MainspringPatterns"
check MainspringServices "CMainspringSystem MainspringCore MainspringServices"
check MainspringTLS "CMainspringSystem MainspringCore MainspringTLS"
check MainspringHTTP "CMainspringSystem MainspringCore MainspringHTTP"
check MainspringTesting "CMainspringSystem MainspringCore MainspringTesting"

# The misuse a dependent once shipped: it built, then stopped the program with status 132.
misuse="$work/misuse"
mkdir -p "$misuse/Sources/app"
cp "$work/MainspringCore/Package.swift" "$misuse/Package.swift"
cat > "$misuse/Sources/app/main.swift" <<'SWIFT'
import MainspringCore
let loop = EventLoop.main
Task.detached { _ = loop.schedule(after: .milliseconds(10)) {} }
SWIFT
if output="$(${SWIFT:-swift} build --package-path "$misuse" -q 2>&1)"; then
    echo "check-dependents: loop.schedule(after:) from a detached task compiled; it must be refused"
    status=1
elif echo "$output" | grep -q "unavailable from asynchronous contexts.*execute(after:_:)"; then
    echo "check-dependents: loop.schedule(after:) from async code is refused, naming execute(after:_:)"
else
    echo "check-dependents: loop.schedule(after:) from async code failed, but not with the expected error:"
    echo "$output" | grep "error" | head -5
    status=1
fi
exit $status
