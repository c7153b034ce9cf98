# The two entry points of the README. Both create/reuse .venv/ first.
.PHONY: setup demo test

setup:
	@bash scripts/setup.sh

demo: setup
	.venv/bin/pofe online --config examples/online-default.yaml

test: setup
	.venv/bin/python -m pytest -q
