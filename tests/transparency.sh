#!/usr/bin/env bash
# Transparency: the official Lua 5.4.4 test files and luv 1.44.2's own suite,
# unchanged, from ../shared/external, with the library installed.
#
#   tests/transparency.sh [name ...]    (`make transparency`)
#
# name: a Lua test file without ".lua" (gc, coroutine, ...) or "luv"; all of
# them by default.  LUA_PATH/LUA_CPATH must find the library (the make
# target sets them from ./.tree).  Each name runs first under plain lua5.4
# (the baseline: a file that fails there is left out, with a message), then
# in each mode, the mode's prelude given as -e options before the script
# name (lua.c runs them in order, then the script, with the same `arg`):
#
#   installed         require("async_hooks").install()
#   value             installed + an AsyncLocal set at top level
#   hooks             installed + init/before/after/destroy enabled, empty
#   resource          installed + a four-parameter init, before/after that
#                     call executionAsyncResource(), a destroy
#   hooks/inc         hooks under the incremental collector
#   resource/inc      resource under the incremental collector
#
# (lua5.4 runs generational; the preludes are tests/transparency/*.lua.)  A
# run passes when it does what the baseline did: exit status 0, the same
# last line on stdout ("OK" for most Lua files, "# All tests passed" for
# luv), the same stderr (without tracegc's progress dots, one per GC cycle,
# whose count follows the allocation; luv: addresses masked), and for luv
# the same "ok N name" lines.  One line per (name, mode); a failure shows
# the command and the tails of its output.  Last line:
#   transparency: N ok, N failed, N skipped
# one per (name, mode), baselines not counted; exit status 1 when any
# failed, 0 (with a message) when ../shared/external is absent.
#
# Environment: AH_EXTERNAL (default ../shared/external from the project
# root), AH_TRANSPARENCY_MODES (a space-separated subset of the modes),
# AH_TRANSPARENCY_JOBS (parallel runs, default: the number of cores; the
# output does not depend on it), AH_TRANSPARENCY_TIMEOUT (seconds per run,
# default 120), LUA (default lua5.4).
#
# The Lua files run in their own folder (they only read there; verybig
# writes to os.tmpname()).  luv's suite writes files into its working
# directory and binds fixed UDP ports, so each luv run gets a fresh copy of
# the folder in a temporary directory, and luv runs never overlap (one job
# runs them in turn, under a lock that other copies of this script on the
# machine share).
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
ext=${AH_EXTERNAL:-$root/../shared/external}
LUA=${LUA:-lua5.4}
tmo=${AH_TRANSPARENCY_TIMEOUT:-120}

lua_files="api bitwise bwcoercion calls closure code constructs coroutine"
lua_files="$lua_files cstack db errors events gc gengc goto literals locals"
lua_files="$lua_files math nextvar pm sort strings tpack tracegc utf8 vararg verybig"
all_modes="installed value hooks resource hooks/inc resource/inc"
modes=${AH_TRANSPARENCY_MODES:-$all_modes}

# the prelude of a mode, as lua5.4 options, in the array `args`
set_args() {
  case $1 in
    plain) args=() ;;
    installed) args=(-e 'require"transparency.installed"') ;;
    value) args=(-e 'require"transparency.value"') ;;
    hooks) args=(-e 'require"transparency.hooks"') ;;
    resource) args=(-e 'require"transparency.resource"') ;;
    hooks/inc) args=(-e 'collectgarbage"incremental"' -e 'require"transparency.hooks"') ;;
    resource/inc) args=(-e 'collectgarbage"incremental"' -e 'require"transparency.resource"') ;;
    *) echo "transparency: unknown mode '$1' (modes: $all_modes)" >&2; exit 2 ;;
  esac
}

# the files of one run: $work/<name>.<mode>.{out,err,rc}
key() { echo "$work/$1.${2//\//-}"; }

# one Lua file in one mode
run_lua() {
  local k
  k=$(key "$1" "$2")
  set_args "$2"
  (cd "$ext/lua-5.4.4-tests" &&
     timeout --foreground -k 10 "$tmo" "$LUA" "${args[@]}" "$1.lua" >"$k.out" 2>"$k.err")
  echo $? >"$k.rc"
}

# luv's suite in every mode, one after the other, each in a fresh copy
run_luv() {
  local m k
  d=""
  trap 'rm -rf "$d"' EXIT
  trap 'exit 143' TERM INT
  exec 9>"${TMPDIR:-/tmp}/async-hooks-transparency-luv.lock"
  flock 9
  for m in plain $modes; do
    k=$(key luv "$m")
    set_args "$m"
    d=$(mktemp -d)
    cp -R "$ext/luv-1.44.2/." "$d/" && chmod -R u+w "$d"
    (cd "$d" && timeout --foreground -k 10 "$tmo" "$LUA" "${args[@]}" tests/run.lua >"$k.out" 2>"$k.err")
    echo $? >"$k.rc.tmp"
    rm -rf "$d"
    mv "$k.rc.tmp" "$k.rc"
  done
  exec 9>&-
}

if [ "${1:-}" = --one ]; then # internal: one job of the queue
  work=$2
  if [ "$3" = luv ]; then run_luv; else run_lua "$3" "$4"; fi
  exit 0
fi

for m in $modes; do set_args "$m"; done # reject an unknown mode early

names=${*:-$lua_files luv}
missing=""
[ -d "$ext/lua-5.4.4-tests" ] || missing="$missing $ext/lua-5.4.4-tests"
[ -d "$ext/luv-1.44.2" ] || missing="$missing $ext/luv-1.44.2"
if [ ! -d "$ext" ]; then
  echo "transparency: skipped: $ext is absent (the third-party suites are not part of the repository)"
  echo "transparency: 0 ok, 0 failed, 0 skipped"
  exit 0
fi
ext=$(cd "$ext" && pwd)
for n in $names; do
  case " $lua_files luv " in
    *" $n "*) ;;
    *) echo "transparency: unknown name '$n' (names: the Lua test files listed in $0, luv)" >&2; exit 2 ;;
  esac
done

export LUA_PATH="${LUA_PATH:-;;};$here/?.lua"
if ! "$LUA" -e 'require"async_hooks"' 2>/dev/null; then
  echo "transparency: $LUA cannot load async_hooks (run it through \`make transparency\`)" >&2
  exit 2
fi

work=$(mktemp -d)
queue() {
  local n m
  case " $names " in *" luv "*) [ -d "$ext/luv-1.44.2" ] && echo luv ;; esac
  for n in $names; do
    [ "$n" = luv ] && continue
    [ -d "$ext/lua-5.4.4-tests" ] || continue
    for m in plain $modes; do echo "$n $m"; done
  done
}
queue >"$work/queue"
jobs=${AH_TRANSPARENCY_JOBS:-$(nproc 2>/dev/null || echo 1)}
set -m # the workers in a process group of their own, stopped on exit
xargs -a "$work/queue" -P "$jobs" -L 1 "$0" --one "$work" &
xpid=$!
set +m
running=1
stop() { [ "$running" = 0 ] || kill -- -"$xpid" 2>/dev/null; running=0; rm -rf "$work"; }
trap 'stop; exit 130' INT TERM
trap stop EXIT

# wait for the run's rc file (the workers write it last)
wait_for() {
  while [ ! -e "$1.rc" ]; do
    if ! kill -0 "$xpid" 2>/dev/null && [ ! -e "$1.rc" ]; then
      echo "transparency: a worker stopped without a result for $1" >&2
      exit 2
    fi
    sleep 0.1
  done
}

lastline() { grep -a -v '^[[:space:]]*$' "$1" | tail -n 1; }
errtext() { tr -d '.' <"$1" | sed -E 's/0x[0-9a-f]+/0x?/g'; }
taplines() { grep -a -E '^(not )?ok [0-9]+' "$1"; }

# why run k differs from the baseline b ("" when it does not)
differs() { # name k b
  local rc
  rc=$(cat "$2.rc")
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then echo "timed out after ${tmo}s"; return; fi
  [ "$rc" = 0 ] || { echo "exit status $rc"; return; }
  [ "$(lastline "$2.out")" = "$(lastline "$3.out")" ] ||
    { echo "last line of stdout is '$(lastline "$2.out")', not '$(lastline "$3.out")'"; return; }
  [ "$(errtext "$2.err")" = "$(errtext "$3.err")" ] || { echo "stderr differs from plain lua5.4's"; return; }
  if [ "$1" = luv ]; then
    [ "$(taplines "$2.out")" = "$(taplines "$3.out")" ] ||
      { echo "test results differ: $(diff <(taplines "$3.out") <(taplines "$2.out") | grep -a '^>' | head -n 3 | tr '\n' ' ')"; return; }
  fi
}

command_of() { # name mode
  local a s=""
  set_args "$2"
  for a in "${args[@]}"; do
    case $a in -e) s="$s -e" ;; *) s="$s '$a'" ;; esac
  done
  if [ "$1" = luv ]; then
    echo "(cd <a copy of $ext/luv-1.44.2> && $LUA$s tests/run.lua)"
  else
    echo "(cd $ext/lua-5.4.4-tests && $LUA$s $1.lua)"
  fi
}

# a file's first 5 and last 15 lines, indented
excerpt() {
  local n
  n=$(wc -l <"$1")
  if [ "$n" -le 22 ]; then sed 's/^/    | /' "$1"
  else
    head -n 5 "$1" | sed 's/^/    | /'
    echo "    | ... ($((n - 20)) lines)"
    tail -n 15 "$1" | sed 's/^/    | /'
  fi
}

tails() { # k
  echo "    stdout:"; excerpt "$1.out"
  echo "    stderr:"; excerpt "$1.err"
}

ok=0 failed=0 skipped=0 nmodes=$(echo "$modes" | wc -w)
[ -z "$missing" ] || echo "transparency: skipped (absent):$missing"
echo "transparency: $LUA, modes: $modes (preludes: $here/transparency/)"
for n in $names; do
  if [ "$n" = luv ]; then [ -d "$ext/luv-1.44.2" ] || continue
  else [ -d "$ext/lua-5.4.4-tests" ] || continue; fi
  label=$n; [ "$n" = luv ] && label="luv tests/run.lua" || label="$n.lua"
  b=$(key "$n" plain)
  wait_for "$b"
  brc=$(cat "$b.rc")
  if [ "$brc" != 0 ] || { [ "$n" = luv ] && [ "$(lastline "$b.out")" != "# All tests passed" ]; }; then
    echo "skip  $label: fails with plain $LUA on this machine (exit status $brc), left out"
    tails "$b"
    skipped=$((skipped + nmodes))
    for m in $modes; do wait_for "$(key "$n" "$m")"; done
    continue
  fi
  for m in $modes; do
    k=$(key "$n" "$m")
    wait_for "$k"
    why=$(differs "$n" "$k" "$b")
    if [ -z "$why" ]; then
      printf 'ok    %-18s %s\n' "$label" "$m"
      ok=$((ok + 1))
    else
      printf 'FAIL  %-18s %s: %s\n' "$label" "$m" "$why"
      echo "    $(command_of "$n" "$m")"
      tails "$k"
      failed=$((failed + 1))
    fi
  done
done
wait "$xpid"
running=0
echo "transparency: $ok ok, $failed failed, $skipped skipped"
[ "$failed" = 0 ]
