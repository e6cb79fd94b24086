--- Instruction counts per operation (valgrind --tool=callgrind): exact and
-- repeatable, unlike wall-clock on a shared 2-core VM.  Each figure is
-- (instructions at n + 1 - instructions at 1) / n, so start-up cancels out.
local U = require("util")
if not os.execute("command -v valgrind >/dev/null 2>&1") then
  print("\n## instruction counts: skipped (valgrind is not installed)")
  return
end
local function count(case, variant, n)
  local p = io.popen(("valgrind --tool=callgrind --callgrind-out-file=/dev/null lua5.4 bench/cg_case.lua %s %s %d 2>&1")
    :format(case, variant, n))
  local out = p:read("a")
  p:close()
  return tonumber(out:match("Collected : (%d+)")) or 0
end
local function per_op(case, variant, n)
  return (count(case, variant, n + 1) - count(case, variant, 1)) / n
end
U.header("instruction counts per operation (callgrind; ratio to the raw baseline)")
local rows = {
  { "switch", 50000, "resume/yield round trip", { "raw", "installed", "value", "hooks" } },
  { "lifecycle", 20000, "create + run to completion", { "raw", "installed", "value" } },
  { "get", 50000, "get() vs a table index", { "raw", "installed" } },
  { "run", 20000, "run(v, fn) vs fn()", { "raw", "installed" } },
  { "chain", 20000, "luv callback chain step", { "raw", "installed", "value", "hooks" } },
}
for _, row in ipairs(rows) do
  local base
  for _, variant in ipairs(row[4]) do
    local ins = per_op(row[1], variant, math.floor(row[2] * U.SCALE))
    base = base or ins
    print(("  %-28s %-10s %8.0f instr/op   x%.3f"):format(row[3], variant, ins, ins / base))
  end
end
