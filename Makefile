# Mainspring: `make demo` and `make test` work on a fresh machine (they install libevent-dev).
SWIFT ?= swift

.PHONY: all deps build test demo bench clean

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

clean:
	$(SWIFT) package clean
