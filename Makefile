# Everything the project needs is installed from here, with pinned versions.
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup demo test test-fast lint bench sim soak fuzz layers
setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[dev]'
	command -v kcat >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq kcat >/dev/null; }
	touch $@

demo: setup
	$(BIN)/tierlog demo

test: setup
	$(BIN)/ruff check .
	$(BIN)/pytest

# Every test that starts no broker, Spark session or simulation and is not marked slow (pyproject.toml's
# markers): a few minutes on two cores, for the edit-test loop. CI runs `make test`.
test-fast: setup
	$(BIN)/ruff check .
	$(BIN)/pytest -m "not cluster and not spark and not sim and not slow"

lint: setup
	$(BIN)/ruff check .

bench: setup
	$(BIN)/python bench/throughput.py
	$(BIN)/python bench/replication.py
	$(BIN)/python bench/tiered.py
	$(BIN)/python bench/tls.py
	$(BIN)/python bench/fetch_sessions.py
	$(BIN)/python bench/many_partitions.py
	$(BIN)/python bench/spark.py

# CI runs seeds 1..300 with 40 s schedules (tests/sim); this explores further: 1000 seeds at 40 s, then 600 longer
# schedules (60 s, where seed 70147 found a consumer following a deposed leader) from another range.
sim: setup
	$(BIN)/tierlog sim --runs 1000 --jobs 2
	$(BIN)/tierlog sim --runs 600 --first-seed 70001 --seconds 60 --jobs 2
	$(BIN)/tierlog sim --transactions --runs 300 --first-seed 22376 --seconds 60 --jobs 2

soak: setup
	$(BIN)/python bench/jepsen.py

fuzz: setup
	TIERLOG_FUZZ_EXAMPLES=2000 $(BIN)/pytest tests/protocol/test_live_broker_fuzz.py

# docs/layers.svg, the picture of docs/architecture.md#layers, drawn from the imports (pydeps, Graphviz's dot).
layers: setup
	command -v dot >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq graphviz >/dev/null; }
	$(BIN)/pydeps tierlog --only tierlog --max-module-depth 2 --cluster --rankdir BT --noshow -T svg -o docs/layers.svg
