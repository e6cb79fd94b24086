#!/bin/sh
# The call graph between the C files of the core has no cycle.
#
#   tests/callgraph.sh [srcdir]     (default: src; `make callgraph`)
#
# Compiles each srcdir/*.c to an object, reads with nm which ah_* symbols it
# defines and which it uses from elsewhere, and draws an edge file -> file
# for every call (a use of a function; a shared data symbol, such as a
# registry key's address, is not a call).  Prints the graph (file -> files it calls) and the files
# in dependency order (bottom first); fails, naming the files of a loop,
# when the graph has a cycle.  Also fails when an object defines a global
# symbol other than ah_* and luaopen_* (everything else is static), or
# uses an ah_* symbol that no file defines.
# Calls through a function pointer (st->lazy_resource) are not edges: that
# is how slots.c reaches luv.c without depending on it.
set -eu
src=${1:-src}
CC=${CC:-cc}
here=$(cd "$(dirname "$0")/.." && pwd)
LUA_CFLAGS=${LUA_CFLAGS:-$("$here/.ci/lua-flags" --cflags)}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM

for c in "$src"/*.c; do
  f=$(basename "$c")
  # shellcheck disable=SC2086 # CC and LUA_CFLAGS are word lists
  $CC -std=c99 -O0 -c $LUA_CFLAGS -I"$src" "$c" -o "$tmp/$f.o"
  # "<file> D <sym>": a function defined; DATA: data defined; U: used
  nm "$tmp/$f.o" | awk -v f="$f" '
    $1 == "U" { print f, "U", $2; next }
    NF == 3 && $2 == "T" { print f, "D", $3; next }
    NF == 3 && $2 ~ /^[A-Z]$/ { print f, "DATA", $3 }' >> "$tmp/syms"
done

status=0
bad=$(awk '($2 == "D" || $2 == "DATA") && $3 !~ /^(ah_|luaopen_)/ { print $1 ": " $3 }' "$tmp/syms")
if [ -n "$bad" ]; then
  echo "callgraph: global symbols that should be static:"; echo "$bad"; status=1
fi

# edges "caller callee", one per pair: uses of functions (defined in text,
# nm's T); a shared data symbol (a registry key's address) is no call
awk '
  $2 == "D" { def[$3] = $1; next }
  $2 == "DATA" { def[$3] = $1; data[$3] = 1; next }
  $2 == "U" && $3 ~ /^ah_/ { use[NR] = $1 " " $3 }
  END {
    for (i in use) {
      split(use[i], p, " ")
      if (!(p[2] in def)) { print "UNDEF " p[1] " " p[2]; continue }
      if (def[p[2]] != p[1] && !(p[2] in data)) print p[1], def[p[2]]
    }
  }' "$tmp/syms" | sort -u > "$tmp/edges"
if grep -q '^UNDEF' "$tmp/edges"; then
  echo "callgraph: ah_* symbols no file defines:"
  grep '^UNDEF' "$tmp/edges" | cut -d' ' -f2-; status=1
  grep -v '^UNDEF' "$tmp/edges" > "$tmp/e2" || true; mv "$tmp/e2" "$tmp/edges"
fi

echo "call graph (file -> files it calls):"
for c in "$src"/*.c; do
  f=$(basename "$c")
  echo "  $f -> $(awk -v f="$f" '$1 == f { printf "%s%s", s, $2; s = " " }' "$tmp/edges")"
done

# nodes without edges still belong in the order: "f f" pairs are nodes
{ cat "$tmp/edges"; for c in "$src"/*.c; do f=$(basename "$c"); echo "$f $f"; done; } > "$tmp/tsort"
if order=$(tsort "$tmp/tsort" 2>"$tmp/loop"); then
  echo "order, bottom first: $(echo "$order" | tac | tr '\n' ' ')"
else
  echo "callgraph: the call graph between files has a cycle:"
  sed 's|^.*tsort: ||; s|^.*loop:$|  loop:|; s|^[^ ]|    &|' "$tmp/loop"
  status=1
fi
[ "$status" = 0 ] && echo "callgraph: no cycle"
exit $status
