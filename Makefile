# Short commands.  Everything installs through the rockspec, the way users do.
LUA      ?= lua5.4
LUAROCKS ?= luarocks --lua-version=5.4
BUSTED   ?= $(LUA) /usr/bin/busted
ROCKSPEC := rockspec/async-hooks-scm-1.rockspec
TREE     ?= $(CURDIR)/.tree
ASANTREE ?= $(CURDIR)/.tree-asan
PATHS     = eval "$$($(LUAROCKS) --tree $(1) path)"
SAN_FLAGS := -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
ASAN_RT  := $(shell gcc -print-file-name=libasan.so) $(shell gcc -print-file-name=libubsan.so)
# malloc_fill_byte=0: Lua leaves the main thread's LUA_EXTRASPACE as
# allocated; ASan's garbage there would look like a host's data and send
# the module to its fallback lookup (tested on its own in spec/11)
ASAN_ENV := LD_PRELOAD="$(ASAN_RT)" ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:malloc_fill_byte=0 \
            LSAN_OPTIONS=suppressions=$(CURDIR)/.ci/lsan.supp:print_suppressions=0 \
            UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

.PHONY: all build test asan asanbuild gcstress valgrind soak faults demo bench clean deps

all: build

deps:
	@./.ci/deps

build: deps
	rm -rf build.luarocks
	$(LUAROCKS) --tree $(TREE) make --deps-mode=none $(ROCKSPEC) >/dev/null

test: build
	$(call PATHS,$(TREE)) && $(BUSTED) $(BUSTED_ARGS)

asanbuild: deps
	rm -rf build.luarocks
	$(LUAROCKS) --tree $(ASANTREE) make --deps-mode=none $(ROCKSPEC) \
	  CFLAGS="$(SAN_FLAGS) -fPIC" LIBFLAG="-shared $(SAN_FLAGS)" >/dev/null

asan: asanbuild
	$(call PATHS,$(ASANTREE)) && $(ASAN_ENV) AH_ASAN=1 $(BUSTED) $(BUSTED_ARGS)

# the suite again with the collector running at every moment
gcstress: build
	$(call PATHS,$(TREE)) && AH_DIFF_PROGRAMS=300 AH_GC_STRESS=step $(BUSTED) --helper=spec/support/gcstress.lua $(BUSTED_ARGS)
	$(call PATHS,$(TREE)) && AH_DIFF_PROGRAMS=300 AH_GC_STRESS=gen $(BUSTED) --helper=spec/support/gcstress.lua $(BUSTED_ARGS)

# the suite under valgrind (memcheck), for what ASan cannot see
valgrind: build
	$(call PATHS,$(TREE)) && AH_DIFF_PROGRAMS=150 AH_VALGRIND=1 valgrind -q --error-exitcode=99 \
	  --suppressions=$(CURDIR)/.ci/valgrind.supp --leak-check=no $(BUSTED) --ignore-lua $(BUSTED_ARGS)

# the soak alone, long: AH_SOAK_SECONDS=60 (about 1e6 requests here)
soak: build
	$(call PATHS,$(TREE)) && AH_SOAK_SECONDS=$${AH_SOAK_SECONDS:-60} $(BUSTED) spec/10-soak_spec.lua

# fault injection: every allocation of the workload fails once, in turn
# (ASan + UBSan build of the module and of the harness)
faults: asanbuild
	gcc -std=c99 -Wall -Wextra -O1 -g $(SAN_FLAGS) -I/usr/include/lua5.4 tests/failalloc.c -o build.luarocks/failalloc -llua5.4 -lm
	$(call PATHS,$(ASANTREE)) && AH_FAULTS_LUV=0 ASAN_OPTIONS=detect_leaks=1 \
	  ./build.luarocks/failalloc tests/faults.lua $${AH_FAULTS:-3000}
	$(call PATHS,$(ASANTREE)) && AH_FAULTS_LUV=1 ASAN_OPTIONS=detect_leaks=0 \
	  ./build.luarocks/failalloc tests/faults.lua $${AH_FAULTS:-3000}

demo: build
	$(call PATHS,$(TREE)) && $(LUA) examples/demo.lua

bench: build
	$(call PATHS,$(TREE)) && $(LUA) bench/run.lua $(BENCH_ARGS)

clean:
	rm -rf build build.luarocks $(TREE) $(ASANTREE)
