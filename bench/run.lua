--- make bench: the table of rows, each with its target and ok/missed.
--   lua5.4 bench/run.lua                 instructions, memory, HTTP rows, httpinstr
--   lua5.4 bench/run.lua instr httpinstr make bench-instr: the instruction rows
--   lua5.4 bench/run.lua memory          memory rows only
--   lua5.4 bench/run.lua http            HTTP rows only
--   lua5.4 bench/run.lua httpinstr       instructions per HTTP request (fixed-count
--                                        client; AsyncLocal, counting hooks, and the
--                                        physical pieces)
--   lua5.4 bench/run.lua purelua         the operation rows on LuaJIT and Lua 5.1-5.3
--                                        (the pure-Lua backend; BENCH_PURELUA: which)
--   lua5.4 bench/run.lua micro      also: the older wall-clock benchmarks
--                                   (micro, callbacks) by name
-- Knobs: BENCH_SCALE (sizes), BENCH_JOBS (parallel callgrind runs),
-- BENCH_HTTP_ROUNDS / BENCH_HTTP_SECONDS, BENCH_INFO=0 (skip rows without a
-- target).
package.path = "bench/?.lua;examples/?.lua;" .. package.path
local uv = require("luv") -- main thread, before anything else
local U = require("util")

local parts = {}
for i = 1, #arg do parts[arg[i]] = true end
if next(parts) == nil then
  parts = { instr = true, memory = true, http = true, httpinstr = true, purelua = true }
end
local info = os.getenv("BENCH_INFO") ~= "0"

print(("# async_hooks benchmarks (%s, luv %s, scale %g, %s UTC)"):format(
  _VERSION, uv.version_string(), U.SCALE, os.date("!%Y-%m-%d %H:%M")))
local rows, failed = {}, {}
local function part(name, f)
  if not parts[name] then return end
  local t = os.time()
  local ok, res = pcall(f)
  if ok then
    for _, r in ipairs(res) do rows[#rows + 1] = r end
  else
    failed[#failed + 1] = name
    print(("!! %s: %s"):format(name, tostring(res)))
  end
  print(("(%s: %d s)"):format(name, os.time() - t))
end
part("instr", function() return require("instructions").run(info) end)
part("memory", function() return require("memory").run() end)
part("http", function() return require("http").run() end)
part("httpinstr", function() return require("http_instr").run() end)
part("purelua", function() return require("instructions").purelua() end)
for _, legacy in ipairs { "micro", "callbacks" } do
  part(legacy, function() require(legacy); return {} end)
end

U.header("every row with its target")
print("| path | measured | target | result |")
print("|---|---|---|---|")
local missed = 0
for _, r in ipairs(rows) do
  if not r.ok then missed = missed + 1 end
  print(("| %s | %s | %s | %s |"):format(r.path, r.value, r.target, r.result or (r.ok and "ok" or "missed")))
end
print(("\n%d rows: %d ok, %d missed%s"):format(#rows, #rows - missed, missed,
  #failed > 0 and (", failed to run: " .. table.concat(failed, ", ")) or ""))
if #failed > 0 then os.exit(1) end
