# The front door. Contract names (targets and variables) are documented in docs/reference.md
# and relied upon by users and CI: keep them, extend them.

SHELL := /bin/bash
.DEFAULT_GOAL := help

# Interpreter used to create the virtual environment (the OS/pyenv Python).
PYTHON ?= $(shell command -v python3.11 || command -v python3)
TORCH ?= 2.13.0
VENV ?= .venv
PY_VENV := $(VENV)/bin/python
PIP := $(PY_VENV) -m pip
PYTEST_ARGS ?=
# Test workers (pytest-xdist): builds spend much of their time waiting (pip, the engine, QEMU),
# so a second stream fills the waits; tests/conftest.py keeps engine tests in one stream.
# TEST_WORKERS=0 runs everything in one process (e.g. to debug with pdb).
TEST_WORKERS ?= 2

# Builder front door variables (docs/reference.md): left empty so the builder's own
# precedence (defaults < config < environment < command line) decides.
ARCH ?=
PY ?=
# the cuda axis (cpu or a CUDA version such as 13.0; docs/cuda-wheels.md)
CUDA ?=
BACKEND ?=
CONFIG ?=
JOBS ?=
OFFLINE ?=

KERNEL_SOURCES := $(wildcard kernels/*.cpp kernels/*.h kernels/*/*.h kernels/*/*.cpp)

.PHONY: help setup test promises lint fuzz soak docs bench bench-ascend bench-build bench-arm bench-matrix demo clean distclean

help:
	@echo "make builder-env            set up .venv with the builder alone (builder/requirements.lock; no torch)"
	@echo "make builder-lock           re-pin builder/requirements.lock from pyproject.toml's builder extra"
	@echo "make test                   set up .venv (Python $(PYTHON), torch==$(TORCH)) and run the test suite"
	@echo "                            (TEST_WORKERS=$(TEST_WORKERS) parallel workers; PYTEST_ARGS=... passed to pytest)"
	@echo "make test-torch TORCH=2.1.0 PYTHON=python3.8   amp's suites on that torch, in .venv-torch2.1.0"
	@echo "                            (COMPAT_SUITES=$(COMPAT_SUITES))"
	@echo "make lint                   ruff check + format --check over the tree, mypy over amp/ and builder/"
	@echo "make promises               rewrite docs/promises.md from the tests' promise markers"
	@echo "make fuzz [FUZZ_MINUTES=$(FUZZ_MINUTES) FUZZ_EXAMPLES=$(FUZZ_EXAMPLES)]   the config parsers' fuzz targets for minutes (a failing input: build/fuzz/)"
	@echo "make soak [N=$(N)] [SOAK_ARGS=...]   N builds of one cell killed at random moments (SIGINT/TERM/KILL) beside cache prune; dist/ and the cache checked after each"
	@echo "make docs                   the docs/ site: mkdocs build --strict into build/site"
	@echo "make bench                  benchmarks (tables, baseline side by side)"
	@echo "make bench-ascend [BENCH_ASCEND_ARGS=]   Ascend's combined tensors: device ops per step, CPU step"
	@echo "make bench-matrix [BEFORE=REV]   a whole matrix, the project at REV against now, side by side"
	@echo "make demo [DEMO_ARGS=]      loss and memory, fp32 vs amp O1/O2: tables + build/amp_demo.png"
	@echo "make wheel [ARCH= PY= TORCH= CUDA= BACKEND= CONFIG= PROJECT=]   repaired, verified wheel(s) in dist/"
	@echo "make matrix [CONFIG= JOBS= PARALLEL=]   every cell of the build matrix (PARALLEL cells at once, JOBS compile jobs each)"
	@echo "make dockerfiles [CONFIG=]  render every cell's Dockerfile"
	@echo "make fetch BUNDLE=DIR [ARCH= PY= TORCH= BASE_IMAGE=]   offline bundle (wheels + images)"
	@echo "make update-images [CONFIG= ARCH= CHECK=1]   re-pin the base images (tag@sha256:digest) in the config"
	@echo "make wheel OFFLINE=1 BUNDLE=DIR   build from the bundle, no network"
	@echo "make cache                  the builder's caches: size, last use, superseded or not"
	@echo "make cache-prune [OLDER_THAN=7d DRY_RUN=1]   remove superseded cache entries and those unused for 30 days"
	@echo "make index [OUT= INDEX_DIR=] PEP 503 index of OUT (dist/) for pip --index-url"
	@echo "make publish REPOSITORY_URL=URL [OUT= SKIP_EXISTING=1]   upload OUT with twine"

# --- set-up (each step leaves a stamp so a second run does nothing) ------------
# Two environments in one .venv, one stamp each:
#  * the builder's ($(BUILDER_STAMP)): builder/requirements.lock and nothing else -- no torch,
#    no compile. Every builder target (plan, dockerfiles, wheel, matrix, fetch, index, ...)
#    needs only this. With OFFLINE=1 BUNDLE=DIR it comes from the bundle's builder wheels
#    (pip --no-index): a fresh checkout plus the bundle is enough on an air-gapped machine.
#  * the development one (`make setup`: tests, lint, bench, demo): the builder's, plus torch
#    and the project editable with its dev extra (compiling amp._C), kept to the lock's pins.
BUILDER_LOCK := builder/requirements.lock
BUILDER_STAMP := $(VENV)/.builder-$(firstword $(shell sha256sum $(BUILDER_LOCK)))

# A bare venv (the interpreter's own pip; nothing downloaded).
$(PY_VENV):
	$(PYTHON) -m venv $(VENV)

# The lock (the stamp is named after its sha256), from pip's configured index -- or, offline
# with a bundle, from the bundle alone (a bundle without the builder's wheels is refused,
# exit 2, naming what is missing).
$(BUILDER_STAMP): | $(PY_VENV)
	$(PYTHON) -m builder.lockfile install --python $(PY_VENV) $(BUILDER_ENV_SOURCE)
	rm -f $(VENV)/.builder-* && touch $@

.PHONY: builder-env builder-lock
builder-env: $(BUILDER_STAMP)

# builder-lock: re-pin the builder's environment from pyproject.toml's `builder` extra (the one
# place its dependencies are declared) in a throwaway venv with the newest pip.
# Each pin gets the sha256 of its files (pip downloads them for the lock venv's Python), kept
# with the earlier ones of an unchanged pin: every install of the lock uses --require-hashes.
builder-lock:
	rm -rf build/lock-venv && $(PYTHON) -m venv build/lock-venv
	build/lock-venv/bin/python -m pip install --quiet --upgrade pip
	$(PYTHON) -m builder.lockfile requirements > build/lock-venv/requirements.in
	build/lock-venv/bin/python -m pip install --quiet -r build/lock-venv/requirements.in
	build/lock-venv/bin/python -m pip freeze --all | grep -v -e '^setuptools==' -e '^wheel==' \
		> build/lock-venv/frozen.txt
	$(PYTHON) -m builder.lockfile pin --frozen build/lock-venv/frozen.txt \
		--python build/lock-venv/bin/python > $(BUILDER_LOCK).new
	mv $(BUILDER_LOCK).new $(BUILDER_LOCK) && rm -rf build/lock-venv

# The development tools on top (a newer pip is part of the lock already).
$(VENV)/.devtools: | $(BUILDER_STAMP)
	$(PIP) install --quiet --upgrade "setuptools>=68" wheel ninja  # ninja: amp._C compiles its files in parallel
	touch $@

$(VENV)/.torch-$(TORCH): | $(VENV)/.devtools
	$(PIP) install "torch==$(TORCH)"
	rm -f $(VENV)/.torch-* && touch $@

# Dependencies and the project itself (editable, compiling amp._C against the
# venv's torch: hence --no-build-isolation); the builder's dependencies stay at the lock's pins.
# The pins go in without their hashes (`lockfile constraints`): a constraints file with hashes
# turns on pip's hash-checking mode, which refuses an editable install; the builder's own
# distributions were installed with --require-hashes by $(BUILDER_STAMP) already.
$(VENV)/.installed: pyproject.toml $(wildcard setup.py) $(KERNEL_SOURCES) $(VENV)/.torch-$(TORCH) \
		$(BUILDER_STAMP)
	$(PYTHON) -m builder.lockfile constraints > $(VENV)/builder-constraints.txt
	$(PIP) install --no-build-isolation -c $(VENV)/builder-constraints.txt -e ".[dev]"
	$(PY_VENV) setup.py --quiet apex_pth --site "$$($(PY_VENV) -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"
	touch $@

setup: $(VENV)/.installed

test: setup
	$(PY_VENV) -m pytest -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

# --- amp on an older torch line (docs/older-torch.md) ---------------------------
# `make test-torch TORCH=2.1.0 PYTHON=python3.8`: amp's own suites (COMPAT_SUITES) on a torch
# from pip, in a venv of its own (.venv-torch$(TORCH)) without the builder (tests/builder is not
# run: the builder runs on .venv's Python). The tests run in a copy of the working tree inside
# that venv (its src/), not in the checkout: an editable install compiles amp._C into the source
# folder (and removes the other binding's amp._C there), so the checkout's own, built by
# `make setup` for .venv's torch, stays as it is, and this lane may run while `make test` does.
# The copy is refreshed on every run; the venv (torch: gigabytes) and its stamps stay.
COMPAT_SUITES ?= tests/amp tests/optimizers tests/npu tests/kernels
COMPAT_VENV = .venv-torch$(TORCH)
COMPAT_PY = $(COMPAT_VENV)/bin/python
COMPAT_SRC = $(COMPAT_VENV)/src

# torch < 2.4's cpp_extension imports pkg_resources' vendored `packaging`, which setuptools 70
# removed: setuptools stays below 70 here (amp._C and the npu test device both build with it).
$(COMPAT_VENV)/.torch-$(TORCH):
	$(PYTHON) -m venv $(COMPAT_VENV)
	$(COMPAT_PY) -m pip install --quiet --upgrade "setuptools>=68,<70" wheel
	$(COMPAT_PY) -m pip install "torch==$(TORCH)"
	touch $@

.PHONY: test-torch compat-src
# The copy keeps its amp._C and build/ from the last run (with the sources' own times, so
# setuptools recompiles only when a kernel source changed); everything else is copied afresh.
compat-src: $(COMPAT_VENV)/.torch-$(TORCH)
	rm -rf $(COMPAT_VENV)/kept && mkdir -p $(COMPAT_VENV)/kept/amp
	if [ -d $(COMPAT_SRC) ]; then \
		mv $(COMPAT_SRC)/build $(COMPAT_VENV)/kept/ 2>/dev/null || true; \
		mv $(COMPAT_SRC)/amp/_C.*.so $(COMPAT_VENV)/kept/amp/ 2>/dev/null || true; fi
	rm -rf $(COMPAT_SRC) && mkdir -p $(COMPAT_SRC)
	git ls-files -z --cached --others --exclude-standard \
		| tar --null -T - --ignore-failed-read -cf - 2>/dev/null | tar -xf - -C $(COMPAT_SRC)
	cp -a $(COMPAT_VENV)/kept/. $(COMPAT_SRC)/ && rm -rf $(COMPAT_VENV)/kept
	cd $(COMPAT_SRC) && ../bin/python -m pip install --quiet --no-build-isolation -e ".[test]"
	cd $(COMPAT_SRC) && ../bin/python setup.py --quiet apex_pth \
		--site "$$(../bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"

test-torch: compat-src
	cd $(COMPAT_SRC) && ../bin/python -m pytest -n $(TEST_WORKERS) --dist loadgroup \
		$(COMPAT_SUITES) $(PYTEST_ARGS)

# promises: rewrite docs/promises.md from the tests' `promise` markers (a test checks it is current).
promises:
	python3 tests/promises_page.py --write

# lint: ruff over the tree, then mypy's type check of amp/ and builder/ (pyproject.toml's
# [tool.mypy]; docs/development.md).
lint: setup
	$(PY_VENV) -m ruff check .
	$(PY_VENV) -m ruff format --check .
	$(PY_VENV) -m mypy

# fuzz: the configuration parsers' fuzz targets (tests/builder/unit/test_fuzz_configs.py: the matrix
# file, the support table, pyproject.toml, the environment) for about FUZZ_MINUTES, in rounds of
# FUZZ_EXAMPLES examples per target, each round drawing new ones (the suite runs the same targets
# with a few examples, derandomized under CI). It stops at the first failure; the failing input
# is then in build/fuzz/: fix the parser, and keep the input in tests/builder/fuzz_corpus/ (its
# README.md says how).
FUZZ_MINUTES ?= 5
FUZZ_EXAMPLES ?= 300
FUZZ_TARGETS := fuzz_matrix or fuzz_support or fuzz_pyproject or fuzz_environment

fuzz: setup
	@end=$$(( $$(date +%s) + 60 * $(FUZZ_MINUTES) )); round=0; \
	while :; do \
		round=$$((round + 1)); rm -rf build/fuzz; \
		echo "fuzz: round $$round, $(FUZZ_EXAMPLES) examples per target"; \
		AMPFORGE_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) AMPFORGE_FUZZ_SAVE=build/fuzz HYPOTHESIS_PROFILE=dev \
			$(PY_VENV) -m pytest tests/builder/unit/test_fuzz_configs.py -p no:randomly -x -q \
			-k "$(FUZZ_TARGETS)" $(PYTEST_ARGS) || { echo "fuzz: the failing input is in" \
			"build/fuzz/; fix the parser, then keep it in tests/builder/fuzz_corpus/"; exit 1; }; \
		[ $$(date +%s) -lt $$end ] || break; \
	done; echo "fuzz: $$round round(s) in $(FUZZ_MINUTES) minute(s), no failure"

# docs: the documentation site (mkdocs.yml, docs/*.md); --strict fails on any warning, a broken
# link between pages or to a heading included. tests/test_docs.py runs the same build.
docs: setup
	$(PY_VENV) -m mkdocs build --strict --site-dir build/site

# bench: the optimizer-step benchmark (amp vs torch's best sequence and vs a limit probe with
# the step's own memory access pattern, the machine line first). BENCH_ARGS: more options,
# e.g. BENCH_ARGS="--json bench.json" for tracking, or "--sizes 1e6 5e7 --profile".
# The build benchmarks are slow (minutes) and have their own targets.
BENCH_ARGS ?=

bench: setup
	$(PY_VENV) benchmarks/optimizer_step.py $(BENCH_ARGS)

# bench-ascend: Apex for Ascend's combined tensors -- device operations per training step on
# the npu test device (counted at the dispatcher) and CPU step time, torch.optim vs amp's
# fused optimizers vs NpuFused + combine_grad, at 10/100/1000 parameters and at 50M.
# BENCH_ASCEND_ARGS: e.g. "--counts 10 100 --no-big" or "--explain" (the ops of each phase).
BENCH_ASCEND_ARGS ?=

bench-ascend: setup
	$(PY_VENV) benchmarks/bench_ascend.py $(BENCH_ASCEND_ARGS)

# demo: apex's quick-start model and an MLP trained in fp32 and under O1/O2 (bf16 on the CPU;
# fp16 and bf16 on CUDA/NPU): loss per step, weights, peak memory and step time per run, and a
# PNG of it all (default build/amp_demo.png). DEMO_ARGS: e.g. "--steps 50 --out FILE --device cuda".
DEMO_ARGS ?=

demo: setup
	$(PY_VENV) examples/amp_demo.py $(DEMO_ARGS)

# soak: N builds of one cell (the host backend, a one-file C extension), each ended by SIGINT,
# SIGTERM or SIGKILL at a random moment while `cache prune` runs beside them; after each,
# dist/ and the cache are checked and the next build must succeed (benchmarks/soak.py).
# SOAK_ARGS: e.g. "--max-minutes 30 --seed 7". tests/builder/e2e/test_soak.py is CI's short one.
N ?= 30
SOAK_ARGS ?=

soak: builder-env
	$(PY_VENV) benchmarks/soak.py --builds $(N) $(SOAK_ARGS)

bench-build: builder-env
	$(PY_VENV) benchmarks/build_cell.py $(BENCH_BUILD_ARGS)

bench-arm: builder-env
	$(PY_VENV) benchmarks/build_arm.py

# bench-matrix: every cell of benchmarks/matrix_cost.yaml built for the project as of git
# revision BEFORE and as it is now, by this builder, side by side: builds, cells verified with
# another cell's wheel, wheels, wall and step times. The default BEFORE is the last commit
# before the stable-ABI binding. BENCH_MATRIX_ARGS: e.g. "--ccache" or "--json FILE".
BEFORE ?= 85bfdd6
BENCH_MATRIX_ARGS ?=

bench-matrix: builder-env
	$(PY_VENV) benchmarks/matrix_cost.py --before $(BEFORE) $(BENCH_MATRIX_ARGS)

clean:
	rm -rf build *.egg-info amp/_C*.so .pytest_cache .hypothesis
	rm -f $(VENV)/.installed  # amp._C is gone: the next `make setup` must rebuild it

distclean: clean
	rm -rf $(VENV) dist

# --- builder: plan and render (builder/commands/) ------------------------------
# The front-door variables become flags (the command line, the top layer of the builder's
# precedence): ARCH -> --arch, PY -> --python, TORCH -> --torch, CUDA -> --cuda, JOBS -> --jobs, OFFLINE=1 ->
# --offline, BACKEND, BASE_IMAGE, BUNDLE, NETWORK, PULL likewise. The builder itself reads only
# namespaced variables (BUILDER_ARCH, ...), so a shell's own ARCH (conda-forge sets ARCH=64)
# never steers it unless given to make.
BUILDER := $(PY_VENV) -m builder
BUILDER_CONFIG_ARG := $(if $(CONFIG),--config $(CONFIG))
NETWORK ?=
PULL ?=
# Only a variable given on make's command line is passed (`origin`): make also imports the
# shell's environment as variables, and a shell's ARCH=64 must not become --arch 64.
_given = $(filter command line override,$(origin $(1)))
_flag = $(if $(and $(call _given,$(1)),$(strip $($(1)))),$(2) $($(1)))
SELECT_FLAGS = $(call _flag,ARCH,--arch) $(call _flag,PY,--python) $(call _flag,TORCH,--torch) \
	$(call _flag,CUDA,--cuda)
_OFFLINE = $(if $(call _given,OFFLINE),$(OFFLINE))
SETTING_FLAGS = $(call _flag,JOBS,--jobs) $(if $(_OFFLINE_ON),--offline) \
	$(if $(filter 0 no false off,$(_OFFLINE)),--no-offline) $(call _flag,BACKEND,--backend) \
	$(call _flag,BASE_IMAGE,--base-image) $(call _flag,NETWORK,--network) $(call _flag,PULL,--pull)
DOCKERFILES_OUT ?= build/dockerfiles
PLAN_FORMAT ?= table

.PHONY: plan dockerfiles

# Where `builder-env` installs the lock from: the bundle's builder wheels when building offline
# from a bundle (for `make fetch`, BUNDLE is the folder being filled, not a source), no index
# when offline without one (pip's find-links only), else pip's configured index.
_OFFLINE_ON = $(filter 1 yes true on,$(_OFFLINE))
BUILDER_ENV_SOURCE = $(if $(_OFFLINE_ON),$(if $(BUNDLE),--bundle $(BUNDLE),--offline))

plan: builder-env
	$(BUILDER) plan $(BUILDER_CONFIG_ARG) $(SELECT_FLAGS) $(SETTING_FLAGS) --format $(PLAN_FORMAT)

dockerfiles: builder-env
	$(BUILDER) render $(BUILDER_CONFIG_ARG) $(SELECT_FLAGS) --out $(DOCKERFILES_OUT)

# --- builder: wheels (builder/commands/build.py) --------------------------------
# `make wheel` builds ONE cell: the ARCH/PY/TORCH named, or by default this host's arch
# and the builder's Python (.venv's, 3.11) with the newest torch that has a wheel for it.
# `make matrix` builds every cell (narrowed by ARCH/PY/TORCH if given), --keep-going.
# BACKEND=auto|docker|host; BASE_IMAGE=REF|local (local: `make base-image`'s image);
# WHEELHOUSE=DIR: pip installs torch and its dependencies only from there.
# BUNDLE=DIR: an offline bundle from `make fetch` (verified, its base image loaded, its
# wheels the only source; implies OFFLINE=1). JOBS=n: compile jobs inside each cell;
# PARALLEL=n (make matrix): cells built at once (--parallel; docker backend).
BASE_IMAGE ?=
WHEELHOUSE ?=
BUNDLE ?=
OUT ?= dist
STRICT ?=
PARALLEL ?=
# PROJECT=PATH: another PEP 517 project with torch extensions (--project; default: this one).
PROJECT ?=
BUILD_FLAGS = $(BUILDER_CONFIG_ARG) $(SELECT_FLAGS) $(SETTING_FLAGS) \
	$(if $(WHEELHOUSE),--find-links $(WHEELHOUSE)) $(call _flag,PROJECT,--project) \
	$(if $(BUNDLE),--bundle $(BUNDLE)) --out $(OUT)

# `make fetch BUNDLE=DIR [ARCH= PY= TORCH= BASE_IMAGE=]` (on a connected machine): every
# wheel and base image the selected cells need, into DIR, for `make wheel OFFLINE=1 BUNDLE=DIR`
# on a machine without network. FETCH_ARGS: more options, e.g. --find-links DIR, --all.
FETCH_ARGS ?=

.PHONY: wheel matrix base-image fetch

wheel: builder-env
	$(BUILDER) build $(BUILD_FLAGS)

matrix: builder-env
	$(BUILDER) build --all --keep-going $(if $(STRICT),--strict) $(call _flag,PARALLEL,--parallel) \
		$(BUILD_FLAGS)

base-image: builder-env
	$(BUILDER) base-image $(call _flag,ARCH,--arch)

# Re-pin each base image to the digest its tag names now, rewriting the config in place
# (docs/base-images.md); CHECK=1 only compares (exit 1 when a pin would move).
CHECK ?=
.PHONY: update-images
update-images: builder-env
	$(BUILDER) update-images $(BUILDER_CONFIG_ARG) $(call _flag,ARCH,--arch) $(if $(CHECK),--check)

# The builder's caches ($AMPFORGE_CACHE, the engine's torch layers; docs/build-caches.md):
# `make cache` lists them, `make cache-prune` removes the superseded entries and those unused for
# OLDER_THAN (default 30d); DRY_RUN=1 only says what it would remove.
OLDER_THAN ?=
DRY_RUN ?=
.PHONY: cache cache-prune
cache: builder-env
	$(BUILDER) cache list

cache-prune: builder-env
	$(BUILDER) cache prune $(call _flag,OLDER_THAN,--older-than) $(if $(DRY_RUN),--dry-run)

fetch: builder-env
	$(if $(BUNDLE),,$(error make fetch needs BUNDLE=DIR, the folder to fill))
	$(BUILDER) fetch $(BUILDER_CONFIG_ARG) $(SELECT_FLAGS) $(call _flag,BASE_IMAGE,--base-image) \
		--bundle $(BUNDLE) $(FETCH_ARGS)

# --- builder: release (builder/commands/index.py, publish.py) -------------------
# `make index` checks OUT (default dist) against its manifest.json and writes a PEP 503
# index into INDEX_DIR; the last line printed is the URL for `pip install --index-url`.
# `make publish REPOSITORY_URL=URL` uploads OUT with twine; the password comes only from
# TWINE_PASSWORD (and the user from TWINE_USERNAME) in the environment. The URL reaches the
# builder through the environment, not the command line, so make never echoes it (it may
# carry user:password@); without REPOSITORY_URL, TWINE_REPOSITORY_URL or the config's
# publish.repository_url is used. SKIP_EXISTING=1 skips files the repository already has.
INDEX_DIR ?= build/index
REPOSITORY_URL ?=
SKIP_EXISTING ?=

.PHONY: index publish

index: builder-env
	$(BUILDER) index $(OUT) --out $(INDEX_DIR)

publish: builder-env
	@echo "$(BUILDER) publish $(OUT) $(BUILDER_CONFIG_ARG)$(if $(SKIP_EXISTING), --skip-existing)"
	@$(if $(REPOSITORY_URL),TWINE_REPOSITORY_URL="$$REPOSITORY_URL") $(BUILDER) publish \
		$(OUT) $(BUILDER_CONFIG_ARG) $(if $(SKIP_EXISTING),--skip-existing)
