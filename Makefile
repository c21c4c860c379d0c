# Set-up is part of every target: scripts/bootstrap.sh creates .venv and installs vlmspec (CPU torch if none).
PY := .venv/bin/python

.PHONY: setup demo test lint overhead

setup:
	@bash scripts/bootstrap.sh

demo: setup
	.venv/bin/vlmspec demo

test: setup
	$(PY) -m pytest

lint: setup
	.venv/bin/ruff check vlmspec tests scripts
	.venv/bin/ruff format --check vlmspec tests scripts

overhead: setup
	$(PY) scripts/overhead.py
