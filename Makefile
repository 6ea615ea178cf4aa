# Two commands do everything on a fresh machine with Python 3.11 and pip:
#   make demo   set up .venv, then run the main job (prints a table, writes artifacts/)
#   make test   set up .venv, build the walkthrough's reading copy (every chapter run once, under
#               the ci profile), run unit, notebook, browser and multi-process tests, then every
#               notebook under nbmake
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PIP    := $(BIN)/python -m pip install --quiet --disable-pip-version-check
export OMP_NUM_THREADS ?= $(shell nproc 2>/dev/null || echo 2)

.PHONY: venv demo test test-kernels clean

venv: $(STAMP)

# Re-runs only when a requirements file or pyproject.toml changes (idempotent).
$(STAMP): requirements.txt requirements-nodeps.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) torch==2.13.0
	$(PIP) -r requirements.txt
	$(PIP) --no-deps -r requirements-nodeps.txt
	$(PIP) --no-deps --no-build-isolation -e .
	touch $(STAMP)

demo: venv
	$(BIN)/gemref waterfall --preset small --ranks 2 --out artifacts/waterfall

# First the reading copy: every chapter executed once under the ci profile (chapter 10 measures
# the ladder, so the chapters run one at a time), failing on a chapter that raises; a chapter
# over its CPU budget is reported, never failed (a time on a shared machine is a measurement).
# The tests then read its executed chapters and open it in Chromium (GEMREF_BOOK) instead of
# running the notebooks again. Last, the notebooks as a reader runs them: `pytest --nbmake` on
# their committed defaults (the ci profile's values).
# Two pytest workers with one thread each: more threads than cores makes OpenMP threads wait
# on descheduled peers, which slows the many-op CPU kernels several times over. No test judges
# a measured time, so nothing needs the machine to itself.
BOOK := artifacts/book/ci
test: venv
	OMP_NUM_THREADS=1 $(BIN)/gemref notebooks build --profile ci --out $(BOOK)
	OMP_NUM_THREADS=1 GEMREF_BOOK=$(BOOK) $(BIN)/python -m pytest -n 2 tests
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -n 2 --nbmake notebooks

# Every kernel property at >= 1000 drawn cases (hypothesis profile `thorough`), the Triton
# kernels too (under TRITON_INTERPRET=1 on a CPU: slow, tens of minutes).
test-kernels: venv
	HYPOTHESIS_PROFILE=thorough OMP_NUM_THREADS=1 $(BIN)/python -m pytest -n 2 tests/test_attention_kernels.py \
		tests/test_attention_cpu_fused.py tests/test_attention_plan.py tests/test_attention_triton.py \
		tests/test_attention_triton_schedule.py

clean:
	rm -rf artifacts .pytest_cache
