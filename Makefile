# Short commands.  Everything installs through the rockspec, the way users do.
LUA      ?= lua5.4
LUAROCKS ?= luarocks --lua-version=5.4
BUSTED   ?= $(LUA) /usr/bin/busted
ROCKSPEC := rockspec/async-hooks-scm-1.rockspec
# the release: `make dist` builds its rock
RELEASE  := 0.1.0-1
DIST_ROCKSPEC := rockspec/async-hooks-$(RELEASE).rockspec
TREE     ?= $(CURDIR)/.tree
ASANTREE ?= $(CURDIR)/.tree-asan
DISTDIR  ?= $(CURDIR)/dist
DISTTREE ?= $(CURDIR)/.tree-dist
# Debian's ldoc and luacheck run on Lua 5.1: a Lua 5.4 tree's paths break them
NOLUAENV := env -u LUA_PATH -u LUA_CPATH -u LUA_PATH_5_4 -u LUA_CPATH_5_4
PATHS     = eval "$$($(LUAROCKS) --tree $(1) path)"
# The project's own builds treat warnings as errors (-Wpedantic -Werror, see
# CMakeLists.txt); a user's `luarocks make` does not.
STRICT   := AH_STRICT=1
# Lua 5.4 headers and library for the fault-injection harness
LUA_CFLAGS = $(shell ./.ci/lua-flags --cflags)
LUA_LIBS   = $(shell ./.ci/lua-flags --libs)
SAN_FLAGS := -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
ASAN_RT  := $(shell gcc -print-file-name=libasan.so) $(shell gcc -print-file-name=libubsan.so)
ASAN_ENV := LD_PRELOAD="$(ASAN_RT)" ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 \
            LSAN_OPTIONS=suppressions=$(CURDIR)/.ci/lsan.supp:print_suppressions=0 \
            UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

.PHONY: all build test test-purelua purelua-helper rock-purelua valgrind-purelua asan asanbuild gcstress valgrind soak faults demo bench bench-instr clean deps docs lint callgraph

all: build

deps:
	@./.ci/deps

# The rock is reinstalled into $(TREE) only when what it is built from
# changed (the folders too: a file added or removed); `make clean` (as CI
# does first) builds from scratch.
BUILT   := $(TREE)/.async-hooks-built
SOURCES := $(shell find src lua) CMakeLists.txt $(ROCKSPEC)

build: $(BUILT)

$(BUILT): $(SOURCES) | deps
	rm -rf build.luarocks
	$(STRICT) $(LUAROCKS) --tree $(TREE) make --deps-mode=none $(ROCKSPEC) >/dev/null
	touch $@

test: build
	$(call PATHS,$(TREE)) && $(BUSTED) $(BUSTED_ARGS)

# without the specs tagged #slow (soak: wrk; fault injection: gcc)
.PHONY: test-fast
test-fast: build
	$(call PATHS,$(TREE)) && $(BUSTED) --run=fast $(BUSTED_ARGS)

# The portable specs (spec/25-*, spec/26-*, the differential test) under
# every other runtime the library supports, each with the pure-Lua backend
# (lua/ as it is: nothing to build) and Debian's luv and busted for it.  An
# interpreter that is absent, or lacks luv or busted, is skipped, with the
# reason.
PURELUA_LUAS ?= luajit lua5.1 lua5.2 lua5.3
PURELUA_ENV  := env -u LUA_CPATH -u LUA_PATH_5_2 -u LUA_CPATH_5_2 -u LUA_PATH_5_3 -u LUA_CPATH_5_3 \
                LUA_PATH="$(CURDIR)/lua/?.lua;$(CURDIR)/lua/?/init.lua;;"
# The backend's optional C helper (src/purelua/cbpcall.c, async_hooks.luvcb)
# for each Lua ABI (LuaJIT uses 5.1's), against Debian's headers
# (liblua5.X-dev), checked against luv's own header where lua-luv-dev is
# installed.  Each runtime finds its build with PURELUA_CPATH.
PURELUA_ABIS   := 5.1 5.2 5.3
PURELUA_CFLAGS := -std=c99 -O2 -fPIC -Wall -Wextra -Wpedantic -Werror
PURELUA_HELPER  = build/purelua/$(1)/async_hooks/luvcb.so
PURELUA_CPATH   = LUA_CPATH="$(CURDIR)/build/purelua/$$($$l -e 'io.write((_VERSION:gsub("Lua ", "")))')/?.so;;"
.PHONY: purelua-helper
purelua-helper: $(foreach v,$(PURELUA_ABIS),$(call PURELUA_HELPER,$(v)))

# (an ABI without headers is skipped with the reason: its runtimes run
# without the helper)
build/purelua/%/async_hooks/luvcb.so: src/purelua/cbpcall.c
	@if [ ! -f /usr/include/lua$*/lua.h ]; then \
	  echo "purelua-helper: $* skipped: no /usr/include/lua$*/lua.h (Debian: liblua$*-dev)"; exit 0; fi; \
	mkdir -p $(dir $@); \
	cmd="gcc $(PURELUA_CFLAGS) $$([ -f /usr/include/lua$*/luv/luv.h ] && echo -DLUVCB_CHECK_LUV_H) \
	  -I/usr/include/lua$* -shared $< -o $@"; \
	echo $$cmd; $$cmd

# Each runtime with the helper (ASYNC_HOOKS_LUVCB=1: it must load, so that
# a helper that is built but does not load fails the run; without it where
# it is not built), then those of PURELUA_NOHELPER without it (=0: the
# pure-Lua path alone).
PURELUA_NOHELPER ?= luajit lua5.1
.PHONY: test-purelua
test-purelua: purelua-helper
	@status=0; for run in $(foreach l,$(PURELUA_LUAS),$(l):1) $(foreach l,$(PURELUA_NOHELPER),$(l):0); do \
	  l=$${run%:*}; helper=$${run#*:}; \
	  if ! command -v $$l >/dev/null 2>&1; then echo "test-purelua: $$l skipped: not installed"; continue; fi; \
	  if ! $(PURELUA_ENV) $$l -e 'require("luv")' >/dev/null 2>&1; then \
	    echo "test-purelua: $$l skipped: no luv for it (Debian: lua-luv)"; continue; fi; \
	  if ! $(PURELUA_ENV) $$l -e 'require("busted.runner")' >/dev/null 2>&1; then \
	    echo "test-purelua: $$l skipped: no busted for it (Debian: lua-busted)"; continue; fi; \
	  if [ $$helper = 1 ] && [ ! -f build/purelua/$$($$l -e 'io.write((_VERSION:gsub("Lua ", "")))')/async_hooks/luvcb.so ]; then \
	    echo "test-purelua: $$l: the C helper is not built (see purelua-helper): without it"; helper=0; fi; \
	  if [ $$helper = 1 ]; then echo "== $$l, with the C helper"; else echo "== $$l, pure Lua"; fi; \
	  $(PURELUA_ENV) $(PURELUA_CPATH) ASYNC_HOOKS_LUVCB=$$helper \
	    $$l /usr/bin/busted --lua=$$l --run=purelua $(BUSTED_ARGS) || status=1; \
	done; exit $$status

# The rock of those runtimes (rockspec/async-hooks-purelua-scm-1.rockspec)
# installed by LuaRocks for each Lua ABI into an empty tree, then loaded by
# each runtime of that ABI from the tree alone: the helper loads, and a
# luv timer carries a value.
PURELUA_ROCKSPEC := rockspec/async-hooks-purelua-scm-1.rockspec
.PHONY: rock-purelua
rock-purelua:
	@status=0; for run in luajit:5.1 lua5.1:5.1 lua5.2:5.2 lua5.3:5.3; do \
	  l=$${run%:*}; v=$${run#*:}; tree=$(CURDIR)/build/rock-purelua/$$v; \
	  if ! command -v $$l >/dev/null 2>&1; then echo "rock-purelua: $$l skipped: not installed"; continue; fi; \
	  if [ ! -f /usr/include/lua$$v/lua.h ]; then \
	    echo "rock-purelua: $$l skipped: no /usr/include/lua$$v/lua.h (Debian: liblua$$v-dev)"; continue; fi; \
	  rm -rf $$tree; \
	  luarocks --lua-version=$$v --tree $$tree make --deps-mode=none $(PURELUA_ROCKSPEC) >/dev/null 2>&1 \
	    || { echo "rock-purelua: luarocks failed for $$v"; status=1; continue; }; \
	  env -u LUA_PATH_5_2 -u LUA_CPATH_5_2 -u LUA_PATH_5_3 -u LUA_CPATH_5_3 \
	    LUA_PATH="$$tree/share/lua/$$v/?.lua;$$tree/share/lua/$$v/?/init.lua;/usr/share/lua/$$v/?.lua" \
	    LUA_CPATH="$$tree/lib/lua/$$v/?.so;/usr/lib/x86_64-linux-gnu/lua/$$v/?.so" ASYNC_HOOKS_LUVCB=1 \
	    $$l spec/support/rock_check.lua $$l \
	    || status=1; \
	done; exit $$status

# The wall-clock rows of docs/performance.md#other-lua-versions: each
# interpreter of PURELUA_LUAS (the pure-Lua backend), then Lua 5.4 (the C
# core); BENCH_ARGS: the number of rounds
.PHONY: bench-purelua bench-purelua-instr
bench-purelua: build purelua-helper
	@for l in $(PURELUA_LUAS); do \
	  if ! command -v $$l >/dev/null 2>&1; then echo "bench-purelua: $$l skipped: not installed"; continue; fi; \
	  $(PURELUA_ENV) $(PURELUA_CPATH) $$l bench/runtimes.lua $(BENCH_ARGS); \
	done
	$(call PATHS,$(TREE)) && $(LUA) bench/runtimes.lua $(BENCH_ARGS)

# The operation rows of `make bench-instr` (callgrind) with their cases run
# by each interpreter of PURELUA_LUAS (bench/cg_case.lua, the pure-Lua
# backend) next to the C core's, LuaJIT's against 2x the C core's ratios
# (also a part of `make bench`; with the C helper where it is built,
# ASYNC_HOOKS_LUVCB=0 on the command line: without)
bench-purelua-instr: build purelua-helper
	$(call PATHS,$(TREE)) && BENCH_PURELUA="$(PURELUA_LUAS)" $(LUA) bench/run.lua purelua

asanbuild: deps
	rm -rf build.luarocks
	$(STRICT) $(LUAROCKS) --tree $(ASANTREE) make --deps-mode=none $(ROCKSPEC) \
	  CFLAGS="$(SAN_FLAGS) -fPIC" LIBFLAG="-shared $(SAN_FLAGS)" >/dev/null

asan: asanbuild
	$(call PATHS,$(ASANTREE)) && $(ASAN_ENV) AH_ASAN=1 AH_SAN_FLAGS="$(SAN_FLAGS)" $(BUSTED) $(BUSTED_ARGS)

# the suite again with the collector running at every moment
gcstress: build
	$(call PATHS,$(TREE)) && AH_DIFF_PROGRAMS=300 AH_GC_STRESS=step $(BUSTED) --helper=spec/support/gcstress.lua $(BUSTED_ARGS)
	$(call PATHS,$(TREE)) && AH_DIFF_PROGRAMS=300 AH_GC_STRESS=gen $(BUSTED) --helper=spec/support/gcstress.lua $(BUSTED_ARGS)

# the suite under valgrind (memcheck), for what ASan cannot see
valgrind: build
	$(call PATHS,$(TREE)) && AH_DIFF_PROGRAMS=150 AH_VALGRIND=1 valgrind -q --error-exitcode=99 \
	  --suppressions=$(CURDIR)/.ci/valgrind.supp --leak-check=no $(BUSTED) --ignore-lua $(BUSTED_ARGS)

# The C helper of the pure-Lua backend under valgrind memcheck (children
# too: the traceback specs run their programs in fresh interpreters), on
# Lua 5.3 and 5.1 (LuaJIT's ABI); no suppressions
.PHONY: valgrind-purelua
valgrind-purelua: purelua-helper
	@status=0; for l in lua5.3 lua5.1; do \
	  if ! command -v $$l >/dev/null 2>&1; then echo "valgrind-purelua: $$l skipped: not installed"; continue; fi; \
	  echo "== $$l"; \
	  $(PURELUA_ENV) $(PURELUA_CPATH) ASYNC_HOOKS_LUVCB=1 valgrind -q --trace-children=yes --error-exitcode=99 \
	    --leak-check=no $$l /usr/bin/busted --lua=$$l $(BUSTED_ARGS) \
	    spec/28-portable_tracebacks_spec.lua spec/26-portable_luv_spec.lua || status=1; \
	done; exit $$status

# the soak alone, long: AH_SOAK_SECONDS=60 (about 1e6 requests here)
soak: build
	$(call PATHS,$(TREE)) && AH_SOAK_SECONDS=$${AH_SOAK_SECONDS:-60} $(BUSTED) spec/10-soak_spec.lua

# fault injection: every allocation of the workload fails, in turn (and
# every one after it, or, AH_FAULTS_ONCE=1, it alone; see tests/failalloc.c)
# (ASan + UBSan build of the module and of the harness)
faults: asanbuild
	gcc -std=c99 -Wall -Wextra -O1 -g $(SAN_FLAGS) $(LUA_CFLAGS) tests/failalloc.c -o build.luarocks/failalloc $(LUA_LIBS) -lm
	$(call PATHS,$(ASANTREE)) && AH_FAULTS_LUV=0 ASAN_OPTIONS=detect_leaks=1 \
	  ./build.luarocks/failalloc tests/faults.lua $${AH_FAULTS:-3000}
	$(call PATHS,$(ASANTREE)) && AH_FAULTS_LUV=1 ASAN_OPTIONS=detect_leaks=0 \
	  ./build.luarocks/failalloc tests/faults.lua $${AH_FAULTS:-3000}
	$(call PATHS,$(ASANTREE)) && AH_FAULTS_LUV=1 AH_FAULTS_SEEING=1 ASAN_OPTIONS=detect_leaks=0 \
	  ./build.luarocks/failalloc tests/faults.lua $${AH_FAULTS:-3000}
	$(call PATHS,$(ASANTREE)) && AH_FAULTS_LUV=0 ASAN_OPTIONS=detect_leaks=1 \
	  ./build.luarocks/failalloc tests/faults_hooks.lua $${AH_FAULTS:-3000}
	$(call PATHS,$(ASANTREE)) && AH_FAULTS_LUV=0 AH_FAULTS_ONCE=1 ASAN_OPTIONS=detect_leaks=1 \
	  ./build.luarocks/failalloc tests/faults_hooks.lua $${AH_FAULTS:-3000}

demo: build
	$(call PATHS,$(TREE)) && $(LUA) examples/demo.lua

# the benchmark table (instructions, memory, HTTP), each row with its target
bench: build purelua-helper
	$(call PATHS,$(TREE)) && $(LUA) bench/run.lua $(BENCH_ARGS)

# HTML reference (LDoc, Debian's lua-ldoc) in build/docs/index.html.  LDoc
# does not understand the LuaLS annotation lines (---@...): it reads a copy
# without them, and copies of the Markdown topics whose links point at the
# HTML pages (tests/doclinks.lua prep).  Markdown is rendered by
# lua-discount; any LDoc warning fails the target, and so does a local link
# of the pages to no file or no anchor (tests/doclinks.lua check).
docs: DOCS_VERSION = $(firstword $(subst -, ,$(RELEASE)))
docs:
	@EXTRA_PKGS="lua-ldoc lua-discount" ./.ci/deps
	rm -rf build/docs build/docs-src
	mkdir -p build/docs-src/async_hooks
	sed -e '/^[[:space:]]*---@/d' lua/async_hooks/api.lua > build/docs-src/async_hooks/api.lua
	$(LUA) tests/doclinks.lua prep config.ld $(DIST_ROCKSPEC)
	$(NOLUAENV) ldoc -c config.ld --project "async_hooks $(DOCS_VERSION)" --title "async_hooks $(DOCS_VERSION) reference" . > build/docs.log 2>&1 || { cat build/docs.log; exit 1; }
	@if grep -v '^reading configuration\|^output written' build/docs.log | grep -q .; then \
	  cat build/docs.log; echo "make docs: LDoc warned (above)"; exit 1; fi
	$(LUA) tests/doclinks.lua check build/docs/*.html build/docs/*/*.html
	@echo "build/docs/index.html"

# the official Lua 5.4.4 test files and luv's own suite, unchanged, from
# ../shared/external, with the library installed: six modes (installed, a
# value set, hooks enabled, ...; tests/transparency.sh); skipped when the
# folder is absent.  TRANSPARENCY_ARGS: names (gc coroutine luv ...)
.PHONY: transparency
transparency: build
	$(call PATHS,$(TREE)) && LUA=$(LUA) ./tests/transparency.sh $(TRANSPARENCY_ARGS)

# the call graph between the C files (src/ and src/luv/) has no cycle, and
# the #include lines draw the same graph (nm over each object; prints the
# graph; also run by spec/14-callgraph_spec.lua)
callgraph:
	./tests/callgraph.sh src

# luacheck (Debian's lua-check) with .luacheckrc
lint:
	@EXTRA_PKGS="lua-check" ./.ci/deps
	$(NOLUAENV) luacheck lua spec bench examples

# the instruction rows only (callgrind, under two minutes): the operations
# and the instructions per HTTP request
bench-instr: build
	$(call PATHS,$(TREE)) && BENCH_INFO=$${BENCH_INFO:-0} $(LUA) bench/run.lua instr httpinstr

clean:
	rm -rf build build.luarocks $(TREE) $(ASANTREE) $(DISTDIR)

# the release's binary rock in dist/ that installs offline:
#   luarocks --lua-version=5.4 install --deps-mode=none dist/async-hooks-0.1.0-1.*.rock
# (built into a fresh tree, then packed from it: LuaRocks 3.8's
# `make --pack-binary-rock` gives CMake the default tree's paths)
.PHONY: dist
dist: deps
	rm -rf build.luarocks $(DISTTREE) $(DISTDIR)
	mkdir -p $(DISTDIR)
	$(STRICT) $(LUAROCKS) --tree $(DISTTREE) make --deps-mode=none $(DIST_ROCKSPEC) >/dev/null
	cd $(DISTDIR) && $(LUAROCKS) --tree $(DISTTREE) pack async-hooks $(RELEASE)
	rm -rf $(DISTTREE)

# OpenResty: the specs against a real nginx + lua-nginx-module started from a
# temporary prefix on loopback (spec/20-openresty_spec.lua, tag #openresty),
# and the OpenResty benchmark (BENCH_ARGS: rounds seconds callgrind-requests)
OPENRESTY_PKGS := nginx-light libnginx-mod-http-lua lua-resty-core luajit2 wrk valgrind
.PHONY: openresty openresty-deps openresty-bench otel-bench
openresty-deps:
	@EXTRA_PKGS="$(OPENRESTY_PKGS)" ./.ci/deps

openresty: openresty-deps build
	$(call PATHS,$(TREE)) && $(BUSTED) --run=openresty $(BUSTED_ARGS)

openresty-bench: openresty-deps build
	$(call PATHS,$(TREE)) && $(LUA) bench/openresty.lua $(BENCH_ARGS)

# the cost of async_hooks.otel per request, with opentelemetry-lua from
# ../shared/external (or AH_OTEL_LUA); BENCH_ARGS: rounds seconds
# callgrind-requests callgrind-repetitions
otel-bench: openresty-deps build
	$(call PATHS,$(TREE)) && $(LUA) bench/otel.lua $(BENCH_ARGS)
