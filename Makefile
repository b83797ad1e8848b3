# Two commands do all set-up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# make test's pytest processes (pytest-xdist; a test file stays in one). Much of the
# suite's time is spent waiting on the processes it starts (heartbeats, brokers, peer
# services), so two of them overlap well on two cores: 16 min became 7 here. Tests marked
# `alone` (a broker restart) run afterwards by themselves.
TEST_WORKERS ?= 2
# `make run` installs what Berth needs to run; `make test` adds the development tools,
# the OpenStack clients the tests drive, and the PostgreSQL driver.
RUN_STAMP := $(VENV)/.installed-run
STAMP := $(VENV)/.installed-dev
# The real Keystone the authentication tests run as a peer process (never imported).
KEYSTONE_VENV := .venv-keystone
KEYSTONE_STAMP := $(KEYSTONE_VENV)/.installed
# The real Placement 16 the parity tests compare with, likewise.
PLACEMENT_VENV := .venv-placement
PLACEMENT_STAMP := $(PLACEMENT_VENV)/.installed
PEERS = $(KEYSTONE_STAMP) $(PLACEMENT_STAMP) $(NOVA_STAMP)

.PHONY: run test lint typecheck unit bench install keystone-env placement-env placement-gabbi nova-env nova-options browser clean

$(RUN_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e .
	touch $(RUN_STAMP)

$(STAMP): $(RUN_STAMP)
	$(BIN)/python -m pip install -q -e '.[dev,postgresql]'
	touch $(STAMP)

install: $(STAMP)

# A peer's environment: $(1) the directory, $(2) its requirements file.
define peer_env
	$(PYTHON) -m venv $(1)
	$(1)/bin/python -m pip install -q --upgrade pip
	$(1)/bin/python -m pip install -q -r $(2)
	touch $(1)/.installed
endef

$(KEYSTONE_STAMP): tests/peers/keystone-requirements.txt
	$(call peer_env,$(KEYSTONE_VENV),$<)

keystone-env: $(KEYSTONE_STAMP)

$(PLACEMENT_STAMP): tests/peers/placement-requirements.txt
	$(call peer_env,$(PLACEMENT_VENV),$<)

placement-env: $(PLACEMENT_STAMP)

# Placement 16's own gabbi suite against `berth placement serve` (and, with
# GABBI_TARGET=--placement, against the real Placement as the control). Berth runs on
# SQLite; GABBI_DB="--postgresql postgresql://postgres@127.0.0.1:5432/test" puts each
# target on a fresh PostgreSQL database.
GABBI_TARGET ?= --berth $(BIN)/berth
GABBI_DB ?=
placement-gabbi: $(STAMP) $(PLACEMENT_STAMP)
	$(PLACEMENT_VENV)/bin/python tests/peers/gabbi_run.py $(GABBI_TARGET) $(GABBI_DB) --failures gabbi-failures.json 2>/dev/null

# Nova 34 in an environment of its own (Berth never imports Nova): the anchor of the
# core bench (bench/nova_anchor.py) and the source of the option names below.
NOVA_RELEASE ?= 34.*
NOVA_VENV := .venv-nova
NOVA_STAMP := $(NOVA_VENV)/.installed
$(NOVA_STAMP):
	$(PYTHON) -m venv $(NOVA_VENV)
	$(NOVA_VENV)/bin/python -m pip install -q --upgrade pip
	$(NOVA_VENV)/bin/python -m pip install -q 'nova==$(NOVA_RELEASE)' 'PyMySQL>=1.1,<2' 'waitress>=3,<4'
	touch $(NOVA_STAMP)

nova-env: $(NOVA_STAMP)

# Regenerate the table of Nova's option names `berth config check` reads, from Nova's
# own option definitions.
nova-options: $(NOVA_STAMP)
	$(NOVA_VENV)/bin/python scripts/nova-option-names.py > src/berth/nova_options.json

# The main job: schedule a request against the example cloud (offline) and print an
# explained decision; then run the whole system on the embedded SQLite default and boot
# instances against it.
run: $(RUN_STAMP)
	$(BIN)/berth schedule examples/cloud.yaml --config-file examples/nova.conf --flavor m1.large --image ubuntu --num 3 --seed 7 --explain
	$(BIN)/berth schedule examples/cloud.yaml --config-file examples/nova.conf --migrate 0b8f9c3e-0000-4000-8000-000000000001 --seed 7
	@echo "== offline, an AZ-constrained and a trait-constrained request (berth serve answers them below)"
	$(BIN)/berth schedule examples/cloud.yaml --config-file examples/nova.conf --flavor avx512.large --az az1 --num 2 --seed 7
	$(BIN)/berth schedule examples/cloud.yaml --config-file examples/nova.conf --flavor m1.large --az az3 --num 2 --seed 7
	BIN=$(BIN) ./scripts/demo-serve.sh

lint: $(STAMP)
	$(BIN)/ruff check src tests bench

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP) $(PEERS) browser
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile -m "not alone"
	$(BIN)/pytest -m alone

# The web view's browser test drives Debian's Chromium (Playwright's own browser download
# does not work here); when it cannot be installed the test skips and says why.
browser:
	@command -v chromium >/dev/null 2>&1 || (apt-get install -y -q chromium >/dev/null 2>&1 \
	  || (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1)) \
	  || echo "chromium could not be installed: the browser test of the web view will skip"

test: $(STAMP) $(PEERS) browser
	$(BIN)/ruff check src tests bench
	$(BIN)/mypy
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile -m "not alone"
	$(BIN)/pytest -m alone

bench: $(STAMP) $(NOVA_STAMP)
	$(BIN)/python bench/core.py --nova $(NOVA_VENV)/bin/python

clean:
	rm -rf $(VENV) $(KEYSTONE_VENV) $(PLACEMENT_VENV) $(NOVA_VENV) build dist src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
