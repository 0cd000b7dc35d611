# Two commands for a newcomer: `make run` and `make test`.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test install bench clean clean-runs

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

# Four workers, each taking whole files (a file's tests run in order, as alone). Many
# tests wait on real processes, sockets and timeouts (a link's redial after the OS's SYN
# retries, a peer's join deadline), so fewer workers leave this 2-core machine idle: 2,724
# tests took 7.7 min on three workers (the tests' processes used 675 s of CPU, the machine
# 73% busy) and 6.5 min on four, the same hour. Much of the CPU is real runs' peer
# processes (`swarm run` forks them from one process that imported torch,
# swarm/experiment/forkserver.py) and the ~200 coordinators the tests start.
# `.venv/bin/python -m pytest` runs them one by one.
test: $(STAMP)
	@$(PYC)
	$(BIN)/python -m pytest -q -n 4 --dist loadfile

bench: $(STAMP)
	$(BIN)/pip install --disable-pip-version-check -q -e '.[bench]'
	for s in scripts/bench_*.py; do echo "== $$s"; $(BIN)/python $$s || exit 1; done

# runs/ is not build output: it holds every run's checkpoints, best.pt and metrics.
clean:
	rm -rf $(VENV) build *.egg-info

clean-runs:
	rm -rf runs
