# The two entry points of the README. Both create/reuse .venv/ first.
.PHONY: setup demo test check

setup:
	@bash scripts/setup.sh

# the embedded judge audited (and refused), the length judge audited, OAIF trained with it, a report
demo: setup
	@bash scripts/demo.sh

# every tier: the unit tier and the end-to-end tier (tests marked slow); what CI runs
test: setup
	.venv/bin/python -m pytest -q -m "slow or not slow" --durations=40

# the unit tier alone (pyproject's default -m "not slow"): in-process, a few minutes
check: setup
	.venv/bin/python -m pytest -q
