# The two entry points of the README. Both create/reuse .venv/ first.
.PHONY: setup demo test check

setup:
	@bash scripts/setup.sh

# the embedded judge audited (and refused), the length judge audited, OAIF trained with it, a report
demo: setup
	@bash scripts/demo.sh

# every tier: the unit tier and the end-to-end tier (tests marked slow); what CI runs. Two pytest
# workers (POFE_TEST_WORKERS): most end-to-end tests run tiny models or `pofe` subprocesses on one
# thread, so one process left the second core idle; --dist loadfile keeps a file's tests (and its
# module fixtures) in one worker; --no-loadscope-reorder hands files out in collection order, where
# tests marked long come first (tests/conftest.py).
test: setup
	.venv/bin/python -m pytest -q -m "slow or not slow" -n $${POFE_TEST_WORKERS:-2} --dist loadfile --no-loadscope-reorder --durations=40

# the unit tier alone (pyproject's default -m "not slow"): in-process, a few minutes
check: setup
	.venv/bin/python -m pytest -q
