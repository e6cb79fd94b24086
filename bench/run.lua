--- make bench: every benchmark, each printing ratios against a baseline
-- measured in the same run.  BENCH_SCALE (default 1) scales the sizes,
-- BENCH_RUNS (default 5) the number of runs whose median is reported.
package.path = "bench/?.lua;examples/?.lua;" .. package.path
local only = arg[1]
local uv = require("luv") -- main thread, before anything else
local U = require("util")
print(("# async_hooks benchmarks (Lua %s, luv %s, median of %d runs, scale %g)"):format(
  _VERSION, uv.version_string(), U.RUNS, U.SCALE))
for _, name in ipairs { "micro", "instructions", "callbacks", "memory", "http" } do
  if not only or only == name then
    local ok, err = pcall(require, name)
    if not ok then print("!! " .. name .. ": " .. tostring(err)) end
  end
end
