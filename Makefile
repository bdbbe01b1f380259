# Mainspring: `make demo` and `make test` work on a fresh machine (they install libevent-dev, and
# systemd's tools for the tests that use them).
SWIFT ?= swift
LSAN_SUPPRESSIONS := $(CURDIR)/.ci/lsan.supp
TSAN_SUPPRESSIONS := $(CURDIR)/.ci/tsan.supp

DOCC ?= docc
DOCS_OUTPUT ?= .build/docs
DOCS_SYMBOL_GRAPHS := .build/docs-symbol-graphs

FUZZ_RUNS ?= 200000
FUZZ_TARGETS := $(notdir $(wildcard Fuzz/Corpus/*))

.PHONY: all deps test-tools kv-venv bench-tools build test test-release docs demo bench bench-counts sanitize tsan asan stress fuzz leaks soak ci clean check-dependents

all: build

## libevent-dev and pkg-config when missing; a target that needs more runs the script with
## the extra Debian packages as arguments (`./scripts/install-deps.sh valgrind`).
deps:
	@./scripts/install-deps.sh

## Tools of the HTTP and TLS tests (curl, the Prometheus text parser of python3-prometheus-client and
## promtool of prometheus,
## the openssl command that makes the test certificates) and
## of the http benchmark (wrk), from Debian's packages when missing; and systemd's tools for the
## systemd tests and testssl.sh for the TLS scan test (best effort: without them those tests are
## skipped, saying so).
## And the KV server's oracles: redis-server and redis-cli/redis-benchmark (redis-server,
## redis-tools) and a Python virtual environment with redis-py, pytest and websockets (kv-venv).
test-tools:
	@./scripts/install-deps.sh curl python3-prometheus-client prometheus openssl redis-server redis-tools strace \
		nghttp2-client nghttp2-server
	@./scripts/install-tools.sh
	@$(MAKE) --no-print-directory kv-venv

## A virtual environment under .build/kv-venv with redis-py, pytest and websockets from PyPI
## (PIP_FIND_LINKS may point at local wheels), for the KV server's tests (Examples/KV/tests) and
## the WebSocket interop tests. Best effort, like systemd's tools: without it those tests are
## skipped, saying so.
KV_VENV := .build/kv-venv
kv-venv:
	@if [ -x $(KV_VENV)/bin/python ] && $(KV_VENV)/bin/python -c "import redis, pytest, websockets" 2>/dev/null; then exit 0; fi; \
	echo "Making $(KV_VENV) (redis, pytest, websockets)…" >&2; \
	{ python3 -m venv $(KV_VENV) || { ./scripts/install-deps.sh python3-venv && python3 -m venv $(KV_VENV); }; } \
		&& $(KV_VENV)/bin/pip install -q --disable-pip-version-check redis pytest websockets \
		|| echo "note: could not make $(KV_VENV); the KV server's pytest tests and the WebSocket interop tests will be skipped." >&2

bench-tools:
	@./scripts/install-deps.sh wrk redis-server redis-tools nginx-light nghttp2-client nghttp2-server

build: deps
	$(SWIFT) build

## Builds and runs the whole test suite (under a deadline, TEST_TIMEOUT seconds: a run that hangs
## fails naming the tests that never finished; see scripts/run-tests.sh).
test: deps test-tools
	$(SWIFT) build --build-tests
	SWIFT=$(SWIFT) ./scripts/run-tests.sh --skip-build

## The whole suite again, optimised: some defects only show in release builds (timers created
## within one microsecond, a task kept on an actor between two calls). One test at a time, like
## the sanitizer suites, so the stress tests do not starve the timing tests. The build is shared
## with `make stress`.
test-release: deps test-tools
	$(SWIFT) build --build-tests -c release -Xswiftc -enable-testing --scratch-path .build/release-tests
	SWIFT=$(SWIFT) ./scripts/run-tests.sh --skip-build --no-parallel -c release --scratch-path .build/release-tests

## The documentation: DocC renders each module's catalog (Sources/<folder>/<Module>.docc: the
## landing page and the articles) with the module's doc comments, from its symbol graphs, into
## .build/docs-<module> (a static site), and the umbrella's catalog (the library's layout, no
## symbols of its own) into $(DOCS_OUTPUT). Any docc warning (an unresolved symbol link, a
## parameter documented that does not exist or one left undocumented, ...) fails the target, so
## that CI keeps the documentation clean. The logs are in .build/docs-<module>.log. The symbol
## graphs come from the debug build that make test uses (after it, this takes seconds);
## dump-symbol-graph needs the test modules built too, or it fails on them.
DOCS_MODULES := MainspringCore:Sources/Mainspring MainspringPatterns:Sources/MainspringPatterns \
	MainspringServices:Sources/MainspringServices MainspringHTTP:Sources/MainspringHTTP \
	MainspringTLS:Sources/MainspringTLS MainspringTesting:Sources/MainspringTesting

docs: deps
	@command -v $(DOCC) >/dev/null || { echo "make docs needs docc, which ships with the Swift toolchain (next to swift)"; exit 1; }
	$(SWIFT) build --build-tests
	@rm -rf "$$(dirname "$$($(SWIFT) build --show-bin-path)")/symbolgraph"
	$(SWIFT) package dump-symbol-graph --emit-extension-block-symbols
	@graphs="$$(dirname "$$($(SWIFT) build --show-bin-path)")/symbolgraph"; \
	for entry in $(DOCS_MODULES); do \
		module=$${entry%%:*}; folder=$${entry#*:}; \
		rm -rf $(DOCS_SYMBOL_GRAPHS)-$$module .build/docs-$$module .build/docs-$$module.log && \
		mkdir -p $(DOCS_SYMBOL_GRAPHS)-$$module && \
		cp "$$graphs"/$$module.symbols.json $(DOCS_SYMBOL_GRAPHS)-$$module/ && \
		{ cp "$$graphs"/$$module@*.symbols.json $(DOCS_SYMBOL_GRAPHS)-$$module/ 2>/dev/null || true; } && \
		$(DOCC) convert $$folder/$$module.docc --additional-symbol-graph-dir $(DOCS_SYMBOL_GRAPHS)-$$module \
			--output-path .build/docs-$$module --fallback-display-name $$module \
			--fallback-bundle-identifier mainspring.$$module --fallback-default-module-kind Library \
			--warnings-as-errors > .build/docs-$$module.log 2>&1; \
		status=$$?; cat .build/docs-$$module.log; \
		if [ $$status -ne 0 ] || grep -qE "(warning|error):" .build/docs-$$module.log; then \
			echo "make docs: docc reported problems in $$module (above); fix them, warnings included"; exit 1; fi; \
	done
	@rm -rf $(DOCS_OUTPUT)
	@$(DOCC) convert Sources/MainspringUmbrella/Mainspring.docc --output-path $(DOCS_OUTPUT) \
		--fallback-display-name Mainspring --fallback-bundle-identifier mainspring.Mainspring \
		--warnings-as-errors > .build/docs-Mainspring.log 2>&1; \
		status=$$?; cat .build/docs-Mainspring.log; \
		if [ $$status -ne 0 ] || grep -qE "(warning|error):" .build/docs-Mainspring.log; then \
			echo "make docs: docc reported problems in the umbrella's catalog (above); fix them, warnings included"; exit 1; fi
	@echo "documentation written to $(DOCS_OUTPUT) (the layout) and .build/docs-<module> for $(foreach e,$(DOCS_MODULES),$(firstword $(subst :, ,$(e)))) (open documentation/<module>/index.html in each through a web server)"

## Builds and runs the interactive example (simulated input when stdin is not a terminal).
demo: deps
	$(SWIFT) build -c release --product mainspring-demo
	$(SWIFT) run -c release --skip-build mainspring-demo $(ARGS)

## Runs the side-by-side benchmarks (release build). ARGS="post-local --runs 7" to choose.
bench: deps bench-tools
	$(SWIFT) build -c release --product mainspring-bench
	$(SWIFT) build -c release --product mainspring-kv
	$(SWIFT) build -c release --product mainspring-daemon
	$(SWIFT) run -c release --skip-build mainspring-bench $(ARGS)

## Deterministic per-item costs (instructions, retains/releases, heap allocations) of post-local,
## post-remote, a daemon request (plain and over TLS), an HTTP request (server and client) and a Feeder chunk, counted under valgrind's callgrind (about
## 2 minutes; installs valgrind, and openssl for the TLS certificate, when they are missing). ARGS="post-local --callers" to choose and to
## see which functions make the calls; ARGS=--json for records.
## Its own build, with DWARF 4 debug information: valgrind 3.19 cannot read the DWARF 5 that
## the toolchain emits by default for this binary ("possibly corrupted debuginfo").
bench-counts:
	@./scripts/install-deps.sh valgrind openssl
	$(SWIFT) build -c release --product mainspring-bench --scratch-path .build/counts \
		-Xswiftc -dwarf-version=4 -Xcc -gdwarf-4
	.build/counts/release/mainspring-bench --counts $(ARGS)

## The suite under ThreadSanitizer and AddressSanitizer (+ LeakSanitizer), one test at a time
## (sanitizers slow everything down; a 2-core machine running 30 tests at once would starve the
## timing tests). Each has its own build directory. ASan's quarantine of freed memory is capped
## at 32 MB (use-after-free is still caught for recent frees) so that memory-bound tests measure
## the program, not the quarantine; MAINSPRING_SANITIZER tells such tests where they run.
sanitize: tsan asan

tsan: deps test-tools
	$(SWIFT) build --build-tests --sanitize=thread --scratch-path .build/tsan
	MAINSPRING_SANITIZER=thread TSAN_OPTIONS=halt_on_error=0:exitcode=66:suppressions=$(TSAN_SUPPRESSIONS) \
		timeout --kill-after=10 2400 $(SWIFT) test --skip-build --no-parallel --sanitize=thread --scratch-path .build/tsan

asan: deps test-tools
	$(SWIFT) build --build-tests --sanitize=address --scratch-path .build/asan
	MAINSPRING_SANITIZER=address ASAN_OPTIONS=quarantine_size_mb=32 LSAN_OPTIONS=suppressions=$(LSAN_SUPPRESSIONS):print_suppressions=0 \
		timeout --kill-after=10 2400 $(SWIFT) test --skip-build --no-parallel --sanitize=address --scratch-path .build/asan

## The stress tests scaled up ×100 (minutes), and the async server tests scaled up (5,000
## concurrent connections × 100 lines).
stress: deps
	$(SWIFT) build --build-tests -c release -Xswiftc -enable-testing --scratch-path .build/release-tests
	STRESS=1 $(SWIFT) test --skip-build -c release --scratch-path .build/release-tests --filter "StressTests|AsyncServerTests"

## Each libFuzzer harness for FUZZ_RUNS executions, starting from the committed seed corpus
## (new finds go to .build/fuzz-corpus, not into the repository). A crash stops it and leaves
## the input in fuzz-artifacts/.
fuzz: deps
	$(SWIFT) build --sanitize=fuzzer -Xswiftc -DFUZZING --product mainspring-fuzz --scratch-path .build/fuzz
	@mkdir -p fuzz-artifacts
	@for target in $(FUZZ_TARGETS); do \
		mkdir -p .build/fuzz-corpus/$$target && cp Fuzz/Corpus/$$target/* .build/fuzz-corpus/$$target/ && \
		echo "== fuzzing $$target ($(FUZZ_RUNS) runs)" && \
		MAINSPRING_FUZZ_TARGET=$$target .build/fuzz/debug/mainspring-fuzz -runs=$(FUZZ_RUNS) -max_len=4096 \
			-artifact_prefix=fuzz-artifacts/$$target- -print_final_stats=1 .build/fuzz-corpus/$$target \
			> .build/fuzz-$$target.log 2>&1; status=$$?; \
		grep -E "^(Done|stat::number_of_executed_units|stat::peak_rss_mb|==[0-9]+==ERROR|SUMMARY)" .build/fuzz-$$target.log; \
		[ $$status -eq 0 ] || { echo "fuzzing $$target failed: see .build/fuzz-$$target.log and fuzz-artifacts/"; exit 1; }; \
	done

## A short scenario (loops, timers, watchers, readers, signals, connections, a feeder, a group)
## under valgrind memcheck: it fails on any "definitely lost" block.
leaks:
	@./scripts/install-deps.sh valgrind
	$(SWIFT) build --product mainspring-fixture
	@valgrind --leak-check=full --errors-for-leak-kinds=definite --error-exitcode=1 \
		--suppressions=.ci/valgrind.supp .build/debug/mainspring-fixture leak-check > .build/leaks.log 2>&1; \
		status=$$?; grep -E "^(fired|closed|job)=|definitely lost:|indirectly lost:|possibly lost:|ERROR SUMMARY" .build/leaks.log; \
		[ $$status -eq 0 ] || { echo "memcheck found definitely lost blocks: see .build/leaks.log"; exit 1; }

## The daemon soak (minutes, not in CI): 100 connections × 10,000 lines, 1,000 connection
## cycles and a client that never reads; lost/reordered replies, memory, p99.
soak: deps
	$(SWIFT) build -c release --product mainspring-bench
	$(SWIFT) build -c release --product mainspring-daemon
	$(SWIFT) run -c release --skip-build mainspring-bench soak

## A package that depends on one library product compiles only the targets that product needs
## (scripts/check-dependents.sh builds one throw-away dependent per product and checks).
check-dependents: deps
	SWIFT=$(SWIFT) ./scripts/check-dependents.sh

## What CI runs: the plain suite, the optimised suite, the documentation, the dependents check,
## then the sanitizer suites.
ci: test test-release docs check-dependents sanitize

clean:
	$(SWIFT) package clean
	rm -rf .build/tsan .build/asan .build/release-tests .build/stress .build/fuzz .build/counts $(DOCS_OUTPUT) .build/docs-* $(DOCS_SYMBOL_GRAPHS)*
