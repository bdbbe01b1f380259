# Mainspring: `make demo` and `make test` work on a fresh machine (they install libevent-dev).
SWIFT ?= swift
LSAN_SUPPRESSIONS := $(CURDIR)/.ci/lsan.supp

FUZZ_RUNS ?= 200000
FUZZ_TARGETS := $(notdir $(wildcard Fuzz/Corpus/*))

.PHONY: all deps build test demo bench sanitize tsan asan stress fuzz leaks soak ci clean

all: build

deps:
	@./scripts/install-deps.sh

build: deps
	$(SWIFT) build

## Builds and runs the whole test suite.
test: deps
	$(SWIFT) build --build-tests
	$(SWIFT) test --skip-build

## Builds and runs the interactive example (simulated input when stdin is not a terminal).
demo: deps
	$(SWIFT) build -c release --product mainspring-demo
	$(SWIFT) run -c release --skip-build mainspring-demo $(ARGS)

## Runs the side-by-side benchmarks (release build). ARGS="post-local --runs 7" to choose.
bench: deps
	$(SWIFT) build -c release --product mainspring-bench
	$(SWIFT) run -c release --skip-build mainspring-bench $(ARGS)

## The suite under ThreadSanitizer and AddressSanitizer (+ LeakSanitizer), one test at a time
## (sanitizers slow everything down; a 2-core machine running 30 tests at once would starve the
## timing tests). Each has its own build directory. ASan's quarantine of freed memory is capped
## at 32 MB (use-after-free is still caught for recent frees) so that memory-bound tests measure
## the program, not the quarantine; MAINSPRING_SANITIZER tells such tests where they run.
sanitize: tsan asan

tsan: deps
	$(SWIFT) build --build-tests --sanitize=thread --scratch-path .build/tsan
	MAINSPRING_SANITIZER=thread TSAN_OPTIONS=halt_on_error=0:exitcode=66 \
		$(SWIFT) test --skip-build --no-parallel --sanitize=thread --scratch-path .build/tsan

asan: deps
	$(SWIFT) build --build-tests --sanitize=address --scratch-path .build/asan
	MAINSPRING_SANITIZER=address ASAN_OPTIONS=quarantine_size_mb=32 LSAN_OPTIONS=suppressions=$(LSAN_SUPPRESSIONS) \
		$(SWIFT) test --skip-build --no-parallel --sanitize=address --scratch-path .build/asan

## The stress tests scaled up ×100 (minutes), and the async server tests scaled up (5,000
## concurrent connections × 100 lines).
stress: deps
	$(SWIFT) build --build-tests -c release -Xswiftc -enable-testing --scratch-path .build/stress
	STRESS=1 $(SWIFT) test --skip-build -c release --scratch-path .build/stress --filter "StressTests|AsyncServerTests"

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
leaks: deps
	@command -v valgrind >/dev/null || { echo "make leaks needs valgrind (apt-get install valgrind)"; exit 1; }
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

## What CI runs: the plain suite, then the sanitizer suites.
ci: test sanitize

clean:
	$(SWIFT) package clean
	rm -rf .build/tsan .build/asan .build/stress .build/fuzz
