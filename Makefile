# make demo : set up, build, write stores from real data, read them back.
# make test : set up, build, the C++ gates (clang-format, clang-tidy), the docs check, every C++ test
#             (plain, ASan/UBSan, TSan), every Python test, the fuzz targets (bounded).
SHELL := /bin/bash
PY    := .venv/bin/python
JOBS  ?= $(shell nproc)
CMAKE := .venv/bin/cmake
# ccache, where installed, shares compiled objects between checkouts (CCACHE_BASEDIR).
CCACHE := $(shell command -v ccache 2>/dev/null)
CMAKE_COMMON := -G Ninja -DCMAKE_MAKE_PROGRAM=$(CURDIR)/.venv/bin/ninja -DPython_EXECUTABLE=$(CURDIR)/$(PY) \
  $(if $(CCACHE),-DCMAKE_CXX_COMPILER_LAUNCHER=$(CCACHE) -DCMAKE_C_COMPILER_LAUNCHER=$(CCACHE))

.PHONY: test-windows setup build demo demo-daemon test test-cpp test-asan test-tsan test-py bench bench-write-profile clean wheel sdist test-install lint fuzz fuzz-long fuzz-seeds soak tidy format format-check docs-check

setup:
	@scripts/setup.sh

# The build also links this checkout into .venv (scripts/venv_link.py):
# `.venv/bin/python -m loaderx`, `import loaderx`, and `loaderx` / `loaderxd`
# on the venv's PATH, with no PYTHONPATH.
build: setup
	@$(CMAKE) -S . -B build $(CMAKE_COMMON) -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	@$(CMAKE) --build build -j $(JOBS)
	@$(PY) scripts/venv_link.py build

demo: build
	PYTHONPATH=python $(PY) scripts/demo.py

demo-daemon: build
	PYTHONPATH=python $(PY) scripts/demo.py --daemon

test: build format-check tidy docs-check test-cpp test-py test-asan test-tsan fuzz

test-cpp: build
	cd build && ctest --output-on-failure -j $(JOBS) --timeout 600

# The report is written only when pytest finishes its session: a test that
# ends the process early (os._exit(0) from some library's signal handler)
# must not pass for a green run.
test-py: build
	rm -f build/pytest-report.xml
	PYTHONPATH=python LOADERXD=$(CURDIR)/build/daemon/loaderxd $(PY) -m pytest -q -p no:cacheprovider --timeout 600 --junitxml=build/pytest-report.xml
	@test -s build/pytest-report.xml || { echo "pytest ended without finishing its session (no build/pytest-report.xml)"; exit 1; }

test-asan: setup
	@$(CMAKE) -S . -B build-asan $(CMAKE_COMMON) -DCMAKE_BUILD_TYPE=Debug -DLOADERX_BUILD_PYTHON=OFF -DLOADERX_BUILD_BENCH=OFF -DLOADERX_SANITIZE=address,undefined >/dev/null
	@$(CMAKE) --build build-asan -j $(JOBS)
	cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j $(JOBS) --timeout 900

test-tsan: setup
	@$(CMAKE) -S . -B build-tsan $(CMAKE_COMMON) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLOADERX_BUILD_PYTHON=OFF -DLOADERX_BUILD_BENCH=OFF -DLOADERX_SANITIZE=thread >/dev/null
	@$(CMAKE) --build build-tsan -j $(JOBS)
	cd build-tsan && TSAN_OPTIONS=halt_on_error=1 ctest --output-on-failure -j $(JOBS) --timeout 900

# libFuzzer targets (tests/fuzz: the wire decoder, the client's ring
# validation, open-and-read of a mutated store), built with Debian's clang
# (C++ and the vendored zstd's C alike) under ASan/UBSan and run
# FUZZ_SECONDS each from the checked-in seed corpus (copied: the repo corpus
# is not rewritten). CI runs 20 s each;
# `make fuzz-long` runs 10 minutes each. A crash leaves its input in
# build-fuzz/artifacts/ and fails the target.
FUZZ_SECONDS ?= 20
FUZZ_TARGETS := fuzz_wire fuzz_ring fuzz_store
fuzz: setup
	@CC=clang CXX=clang++ $(CMAKE) -S . -B build-fuzz $(CMAKE_COMMON) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLOADERX_FUZZ=ON -DLOADERX_SANITIZE=address,undefined -DLOADERX_BUILD_PYTHON=OFF -DLOADERX_BUILD_TESTS=OFF -DLOADERX_BUILD_DAEMON=OFF -DLOADERX_BUILD_BENCH=OFF >/dev/null
	@$(CMAKE) --build build-fuzz -j $(JOBS)
	@mkdir -p build-fuzz/artifacts
	@set -e; for t in $(FUZZ_TARGETS); do \
	  work=build-fuzz/corpus/$$t; rm -rf $$work; mkdir -p $$work; \
	  if [ -d tests/fuzz/corpus/$$t ]; then cp tests/fuzz/corpus/$$t/* $$work/; fi; \
	  echo "fuzz: $$t for $(FUZZ_SECONDS) s"; \
	  build-fuzz/tests/fuzz/$$t -max_total_time=$(FUZZ_SECONDS) -max_len=65536 -timeout=10 -rss_limit_mb=2048 \
	    -artifact_prefix=build-fuzz/artifacts/$$t- -print_final_stats=1 $$work 2>build-fuzz/$$t.log \
	    || { tail -40 build-fuzz/$$t.log; exit 1; }; \
	  grep -E "^(Done|stat::number_of_executed_units|stat::peak_rss_mb)" build-fuzz/$$t.log || true; \
	done

# The long crash and soak matrix (tests/integration/test_reliability.py):
# 8 clients for 10 minutes, 100 client SIGKILLs, broadcast groups included.
soak: build
	PYTHONPATH=python LOADERXD=$(CURDIR)/build/daemon/loaderxd LOADERX_SOAK_SECONDS=600 LOADERX_CRASH_KILLS=100 LOADERX_WRITER_KILLS=100 \
	  $(PY) -m pytest -q -s -p no:cacheprovider tests/integration/test_reliability.py tests/python/test_store_crash.py

fuzz-long:
	$(MAKE) fuzz FUZZ_SECONDS=600

fuzz-seeds: build
	PYTHONPATH=python $(PY) tests/fuzz/make_seeds.py

# Typing and lint gates (the same commands as tests/python/test_typing.py).
lint: build
	PYTHONPATH=python $(PY) -m mypy.stubtest loaderx._loaderx --mypy-config-file pyproject.toml --allowlist tests/python/stubtest_allowlist.txt
	$(PY) -m mypy --no-incremental python/loaderx
	$(PY) -m ruff check --no-cache python/loaderx tests/python tests/compat bench

# C++ gates (Debian's clang-format and clang-tidy 14): every C++ file of the
# tree is clang-format clean (.clang-format); clang-tidy (.clang-tidy) finds
# nothing in the sources of common/, daemon/, client/ and python/src.
CXX_FILES = $(shell git ls-files '*.cc' '*.h')
format-check:
	@clang-format --dry-run -Werror $(CXX_FILES) && echo "clang-format: $(words $(CXX_FILES)) files clean"

format:
	clang-format -i $(CXX_FILES)

# Docs gate: README, docs/*.md and the comments and docstrings of the C++ and
# Python sources cite only files that exist (scripts/check_docs.py).
docs-check:
	@python3 scripts/check_docs.py

tidy: build
	@run-clang-tidy -quiet -j $(JOBS) -p build '/(common|daemon|client|python)/src/.*\.cc$$' > build/clang-tidy.log 2>&1 \
	  || { grep -E "(warning|error):" build/clang-tidy.log | sort -u; echo "clang-tidy: findings above (full log: build/clang-tidy.log)"; exit 1; }
	@echo "clang-tidy: no findings"

# dist/: a manylinux wheel (pip wheel, then auditwheel repair: scripts/wheel.py)
# and an sdist carrying .deps/zstd-1.5.7. tests/python/test_packaging.py builds
# one wheel in the default suite (pip, from a plain clone); `make test-install`
# also builds and installs the sdist (a second compile).
#
# `make wheel ARCH=aarch64`: the same for Linux aarch64, cross-compiled with
# cmake/aarch64-linux-gnu.cmake against the arm64 Debian root of
# test-aarch64 (made first if missing; as root), built in build-wheel-aarch64
# (docs/platforms.md, "An aarch64 wheel"). `make test-wheel-aarch64` installs
# it into a bare venv inside that root and runs the README there under qemu.
ARCH ?=
wheel: setup
	@$(if $(filter aarch64,$(ARCH)),ROOT_ONLY=1 CMAKE=$(CMAKE) scripts/test_aarch64.sh &&) \
	  CMAKE_BUILD_PARALLEL_LEVEL=$(JOBS) $(PY) scripts/wheel.py dist $(if $(ARCH),--arch $(ARCH))

.PHONY: test-wheel-aarch64
test-wheel-aarch64: setup
	@JOBS=$(JOBS) scripts/test_wheel_aarch64.sh

sdist: setup
	$(PY) -c "from scikit_build_core.build import build_sdist; print('dist/' + build_sdist('dist'))"

test-install: build
	PYTHONPATH=python LOADERX_TEST_SDIST_BUILD=1 $(PY) -m pytest -q -p no:cacheprovider tests/python/test_packaging.py

bench: build
	PYTHONPATH=python $(PY) bench/run_all.py

# Where a zstd store write's CPU goes against the compressor alone (perf
# cpu-clock samples by area, callgrind instruction counts of the compressor):
# docs/benchmarks.md, "Where a zstd write's CPU goes". Needs perf and valgrind;
# run it with nothing else running, after `bash bench/setup.sh`.
bench-write-profile: build
	PYTHONPATH=python $(PY) bench/write_profile.py --callgrind

clean:
	rm -rf build build-asan build-tsan build-tsan-py build-fuzz build-mingw build-noclient build-wheel-aarch64 dist python/loaderx/_loaderx*.so

# The extension without the loaderxd client, as macOS and Windows build it
# (docs/platforms.md, "The extension without the client"): _loaderx alone
# into build-noclient with -DLOADERX_PYTHON_CLIENT=OFF, its symbols checked
# with nm and its import, an embedded round trip, daemon= refused and
# daemon="auto" falling back run against build/'s loaderxd
# (scripts/test_noclient.sh, tests/integration/test_noclient.py).
# The Python thread stress test with _loaderx and loaderxd built under
# ThreadSanitizer (docs/platforms.md, "Thread safety"; in CI).
.PHONY: test-tsan-py
test-tsan-py: setup
	@CMAKE=$(CMAKE) CMAKE_ARGS="$(CMAKE_COMMON)" JOBS=$(JOBS) PY=$(PY) scripts/test_tsan_py.sh

.PHONY: test-noclient
test-noclient: build
	@CMAKE=$(CMAKE) CMAKE_ARGS="$(CMAKE_COMMON)" JOBS=$(JOBS) PY=$(PY) LOADERXD=$(CURDIR)/build/daemon/loaderxd \
	  scripts/test_noclient.sh

# The embedded engine on Windows (docs/platforms.md, "Windows"): its portable
# gtests cross-compiled with mingw-w64 into build-mingw/ and run under wine64.
test-windows: setup
	@CMAKE=$(CMAKE) JOBS=$(JOBS) scripts/test_windows.sh

# Other CPythons (docs/platforms.md): for each version in PYTHONS, a venv
# build-py3X/.venv from pyenv (else python3.X on PATH), the extension built
# into build-py3X with it, and the smoke subset of the Python suite
# (tests/smoke_subset.txt) run on it against build/'s loaderxd. The full
# suite runs on the project venv's CPython (3.11) in test-py. CI runs
# `make test-interpreters PYTHONS=3.13` after `make test` (.ci/run).
PYTHONS ?= 3.10 3.12 3.13
.PHONY: test-interpreters clean-interpreters
test-interpreters: build
	@set -e; for v in $(PYTHONS); do \
	  CMAKE=$(CMAKE) CMAKE_ARGS="$(CMAKE_COMMON)" JOBS=$(JOBS) LOADERXD=$(CURDIR)/build/daemon/loaderxd \
	    scripts/test_interpreter.sh $$v; \
	done

clean-interpreters:
	rm -rf build-py3*

# CPython 3.14 (docs/platforms.md): a Debian unstable root made with
# debootstrap in build-sid/ (kept; remade when its package list changes), the
# extension and loaderxd built in it with its python3.14 into build-py314,
# and the smoke subset run there (scripts/test_py314.sh). Needs root. Not in
# CI: a fresh run takes longer than CI's budget allows.
.PHONY: test-py314 clean-py314
test-py314: setup
	@JOBS=$(JOBS) scripts/test_py314.sh

clean-py314:
	@scripts/test_py314.sh --clean

# Linux aarch64 under emulation (docs/platforms.md, "Linux aarch64"), as root:
# an arm64 Debian 12 root (debootstrap, kept in build-aarch64-root/), the
# engine, loaderxd, the client and the gtests cross-compiled into
# build-aarch64 (cmake/aarch64-linux-gnu.cmake) and run by ctest under
# qemu-aarch64-static, then _loaderx cross-compiled for the root's python3
# (build-aarch64-py) and the smoke subset run in the root. AARCH64_CTEST
# selects the ctest run (default: every test).
AARCH64_CTEST ?= --timeout 600
.PHONY: test-aarch64 clean-aarch64
test-aarch64: setup
	@CMAKE=$(CMAKE) CMAKE_ARGS="$(CMAKE_COMMON)" JOBS=$(JOBS) CTEST_ARGS="$(AARCH64_CTEST)" scripts/test_aarch64.sh

# The builds; the root (build-aarch64-root, ~700 MB, minutes to make) stays.
clean-aarch64:
	rm -rf build-aarch64 build-aarch64-py python/loaderx/_loaderx.*-aarch64-linux-gnu.so
