# Two commands for a newcomer: `make run` and `make test`.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test install bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)

# torch first and pinned: a looser requirement would pull a multi-GB CUDA build.
# Where the package index serves only the CUDA wheel (PyPI on Linux), name a CPU one:
#   make test TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH_INDEX ?=

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install --disable-pip-version-check -q torch==2.13.0 $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(BIN)/pip install --disable-pip-version-check -q -e '.[test,plots]'
	touch $(STAMP)

install: $(STAMP)

# Compiled once here: where PYTHONDONTWRITEBYTECODE is set (as on CI machines) every
# process would compile swarm's sources again, ~0.3 s of CPU each, and the tests start
# hundreds of processes. compileall rewrites only what changed; Python still checks each
# .pyc against its source, so an edit is never run stale.
PYC := $(BIN)/python -m compileall -q swarm

run: $(STAMP)
	@$(PYC)
	$(BIN)/swarm run

# Three workers, each taking whole files (a file's tests run in order, as alone). Many
# tests wait on real processes, sockets and timeouts, so on two workers this 2-core
# machine idled part of a run: 2,095 tests took 10.7 min on two workers, 10.1 on three
# (the machine 88% busy), 8.9 on four, as loaded as it was at each. Much of the CPU is
# real runs' peer processes; since `swarm run` forks them from one process that imported
# torch (swarm/experiment/forkserver.py), 2,099 tests took 8.2 min on three (8.9 the same
# hour before it). Three leave a timing test more slack than four.
# `.venv/bin/python -m pytest` runs them one by one.
test: $(STAMP)
	@$(PYC)
	$(BIN)/python -m pytest -q -n 3 --dist loadfile

bench: $(STAMP)
	$(BIN)/pip install --disable-pip-version-check -q -e '.[bench]'
	for s in scripts/bench_*.py; do echo "== $$s"; $(BIN)/python $$s || exit 1; done

clean:
	rm -rf $(VENV) runs build *.egg-info
