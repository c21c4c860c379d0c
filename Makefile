# Set-up is part of every target: scripts/bootstrap.sh creates .venv and installs vlmspec (CPU torch if none).
PY := .venv/bin/python

.PHONY: setup demo test test-torchvision lint overhead

setup:
	@bash scripts/bootstrap.sh

demo: setup
	.venv/bin/vlmspec demo

# Two workers, one test file each at a time (module fixtures stay in one process), one torch thread each.
test: setup
	$(PY) -m pytest -n 2 --dist loadfile

# The suite where transformers' real video processors run: torch from the package index (its CPU-capable CUDA build,
# not a local +cpu wheel, which torchvision's wheels do not load beside) with torchvision, in .venv-torchvision.
# pip's own config and find-links are bypassed so the index's build is taken; PIP_CERT, if set, is passed on.
TV_VENV := .venv-torchvision
TV_PIP = env -u PIP_FIND_LINKS $(TV_VENV)/bin/python -m pip --isolated install --quiet $(if $(PIP_CERT),--cert $(PIP_CERT))

test-torchvision:
	@test -x $(TV_VENV)/bin/python || python3 -m venv $(TV_VENV)
	@test -f $(TV_VENV)/.vlmspec-installed -a $(TV_VENV)/.vlmspec-installed -nt pyproject.toml || \
		{ $(TV_PIP) torch==2.13.0 torchvision==0.28.0 && $(TV_PIP) -e ".[dev]" && touch $(TV_VENV)/.vlmspec-installed; }
	$(TV_VENV)/bin/python -m pytest -n 2 --dist loadfile

lint: setup
	.venv/bin/ruff check vlmspec tests scripts
	.venv/bin/ruff format --check vlmspec tests scripts

overhead: setup
	$(PY) scripts/overhead.py
