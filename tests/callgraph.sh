#!/bin/sh
# The call graph between the C files of the core has no cycle, and the
# #include lines draw the same graph.
#
#   tests/callgraph.sh [srcdir]     (default: src; `make callgraph`)
#
# Compiles each srcdir/*.c and srcdir/*/*.c to an object, reads with nm
# which ah_* symbols it defines and which it uses from elsewhere, and draws
# an edge file -> file for every call (a use of a function; a shared data
# symbol, such as a registry key's address, is not a call).  Prints the
# graph (file -> files it calls) and the files in dependency order (bottom
# first); fails, naming the files of a loop, when the graph has a cycle.
# Also fails when an object defines a global symbol other than ah_* and
# luaopen_* (everything else is static), or uses an ah_* symbol that no
# file defines.
# Calls through a function pointer (st->lazy_resource) are not edges: that
# is how anchors.c reaches luv/ without depending on it.
#
# The include graph: a file's `#include "x.h"` is an edge to x.c (the unit
# x.h belongs to), else, for a header in a folder, to the folder, else to
# x.h itself.  Fails
# when the include graph and the call graph together have a cycle (a
# header that includes one above it), or when a file calls a unit whose
# header it does not include (directly or through the headers it
# includes).
set -eu
src=${1:-src}
CC=${CC:-cc}
here=$(cd "$(dirname "$0")/.." && pwd)
LUA_CFLAGS=${LUA_CFLAGS:-$("$here/.ci/lua-flags" --cflags)}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM

# the C files, relative to src
files=$(cd "$src" && ls -- *.c */*.c 2>/dev/null | sort)
for f in $files; do
  o=$(echo "$f" | tr / _)
  # shellcheck disable=SC2086 # CC and LUA_CFLAGS are word lists
  $CC -std=c99 -O0 -c $LUA_CFLAGS -I"$src" "$src/$f" -o "$tmp/$o.o"
  # "<file> D <sym>": a function defined; DATA: data defined; U: used
  nm "$tmp/$o.o" | awk -v f="$f" '
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
for f in $files; do
  echo "  $f -> $(awk -v f="$f" '$1 == f { printf "%s%s", s, $2; s = " " }' "$tmp/edges")"
done

# nodes without edges still belong in the order: "f f" pairs are nodes
{ cat "$tmp/edges"; for f in $files; do echo "$f $f"; done; } > "$tmp/tsort"
if order=$(tsort "$tmp/tsort" 2>"$tmp/loop"); then
  echo "order, bottom first: $(echo "$order" | tac | tr '\n' ' ')"
else
  echo "callgraph: the call graph between files has a cycle:"
  sed 's|^.*tsort: ||; s|^.*loop:$|  loop:|; s|^[^ ]|    &|' "$tmp/loop"
  status=1
fi
# the include graph: "file unit" per #include "..." of every .c and .h
# (paths relative to src, resolved from the including file's folder)
(cd "$src" && ls -- *.c *.h */*.c */*.h 2>/dev/null) | while read -r f; do
  d=$(dirname "$f")
  sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$src/$f" |
  while read -r h; do
    p=$h
    [ "$d" != . ] && p="$d/$h"
    # normalise "luv/../x.h" to "x.h"
    p=$(echo "$p" | sed -e ':a' -e 's|[^/]*/\.\./||' -e 'ta')
    echo "$f $p"
  done
done > "$tmp/incs"
# a header belongs to its .c when there is one, else a header in a folder
# to the whole folder ("luv/": its files share a private header)
unit() {
  case $1 in
    *.h) if [ -f "$src/${1%.h}.c" ]; then echo "${1%.h}.c"; return; fi
         case $1 in */*) echo "${1%/*}/"; return ;; esac ;;
  esac
  echo "$1"
}
while read -r a b; do
  ua=$(unit "$a"); ub=$(unit "$b")
  [ "$ua" != "$ub" ] && echo "$ua $ub"
done < "$tmp/incs" | sort -u > "$tmp/iedges"
{ cat "$tmp/edges" "$tmp/iedges"; for f in $files; do echo "$f $f"; done; } > "$tmp/tsort2"
if ! tsort "$tmp/tsort2" > /dev/null 2>"$tmp/loop2"; then
  echo "callgraph: the include graph runs back up (a cycle with the calls):"
  sed 's|^.*tsort: ||; s|^.*loop:$|  loop:|; s|^[^ ]|    &|' "$tmp/loop2"
  status=1
fi
# every call is to a unit whose header the caller includes (transitively)
missing=$(awk '
  FILENAME == ARGV[1] { inc[$1] = inc[$1] " " $2; next }
  { call[$1 " " $2] = 1 }
  END {
    for (c in call) {
      split(c, p, " ")
      # the units reachable from p[1] through includes
      split("", seen); n = 0; q[++n] = p[1]; seen[p[1]] = 1
      for (i = 1; i <= n; i++) {
        m = split(inc[q[i]], nx, " ")
        for (j = 1; j <= m; j++) if (!(nx[j] in seen)) { seen[nx[j]] = 1; q[++n] = nx[j] }
      }
      dir = p[2]; sub(/[^\/]*$/, "", dir) # the headers of a folder serve its files
      if (!(p[2] in seen) && !(dir != "" && dir in seen)) print "  " p[1] " calls " p[2] " without including its header"
    }
  }' "$tmp/iedges" "$tmp/edges")
if [ -n "$missing" ]; then
  echo "callgraph: calls not drawn by the includes:"; echo "$missing"; status=1
fi
[ "$status" = 0 ] && echo "callgraph: no cycle"
exit $status
