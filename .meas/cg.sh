#!/bin/bash
# usage: cg.sh variant... ; prints per-step instructions for chain (n=2001 vs 1)
cd /work/wt/perf-luv
eval "$(luarocks --lua-version=5.4 --tree .tree path)"
CASE=${CASE:-idle_chain}
N=${N:-2000}
count() { valgrind --tool=callgrind --callgrind-out-file=/dev/null lua5.4 bench/cg_case.lua $CASE $1 $2 2>&1 | sed -n 's/.*Collected : \([0-9]*\).*/\1/p'; }
for v in "$@"; do
  a=$(count $v 1); b=$(count $v $((N+1)))
  echo "$v $(( (b-a)/N ))"
done
