--- Wall-clock cost of the library against the raw runtime, on whatever
-- interpreter runs this file: LuaJIT and Lua 5.1 to 5.3 (the pure-Lua
-- backend) or Lua 5.4 (the C core), for the same cases.  callgrind cannot
-- follow LuaJIT's machine code, so the figures are medians of interleaved
-- rounds: each round runs every case once raw (the library uninstalled)
-- and once with it (installed, a value set), and the ratio is the median
-- of the rounds' paired ratios.
--   luajit bench/runtimes.lua [rounds]        (lua/ on package.path)
-- Prints one line per case: ns per operation raw and with the library,
-- and the ratio.
local here = (arg and arg[0] or ""):match("^(.*)runtimes%.lua$") or "bench/"
package.path = here .. "?.lua;" .. package.path
local median = require("stats").median
local uv = require("luv")
local ah = require("async_hooks")
local hrtime = uv.hrtime

local ROUNDS = tonumber(arg and arg[1]) or 15
local v = ah.AsyncLocal.new()

-- each case: n operations, run(n) returns nothing; `lib` true: installed
-- with a value set
local CASES = {}

-- a 0 ms timer that re-arms itself n times (one registration per step)
CASES[#CASES + 1] = { name = "luv 0 ms timer chain", n = 20000, run = function(n)
  local t = uv.new_timer()
  local left = n
  local function step()
    left = left - 1
    if left > 0 then t:start(0, 0, step) else t:close() end
  end
  t:start(0, 0, step)
  uv.run()
end }

-- v:get() against a Lua method that returns a field (two of each, taken
-- in turn, so that the compiler cannot hoist the call out of the loop)
local function getx(self) return self.x end
local objs = { { x = 1, m = getx }, { x = 2, m = getx } }
local vs = { v, ah.AsyncLocal.new() }
CASES[#CASES + 1] = { name = "get (raw: obj:m() returning a field)", n = 5000000, run = function(n, lib)
  local s = 0
  if lib then
    for i = 1, n do if vs[i % 2 + 1]:get() then s = s + 1 end end
  else
    for i = 1, n do if objs[i % 2 + 1]:m() then s = s + 1 end end
  end
  return s
end }

local function empty() end
CASES[#CASES + 1] = { name = "create + run to completion", n = 200000, run = function(n)
  local create, resume = coroutine.create, coroutine.resume
  for _ = 1, n do resume(create(empty)) end
end }

CASES[#CASES + 1] = { name = "resume/yield round trip", n = 500000, run = function(n)
  local yield = coroutine.yield
  local co = coroutine.create(function() while true do yield() end end)
  local resume = coroutine.resume
  for _ = 1, n do resume(co) end
end }

local function timed(case, lib)
  if lib then
    ah.install()
    v:set("request")
  else
    ah.uninstall()
    v:set(nil)
  end
  collectgarbage("collect")
  local t0 = hrtime()
  case.run(case.n, lib)
  local dt = hrtime() - t0
  ah.uninstall()
  v:set(nil)
  return dt / case.n
end

-- PUC Lua runs about ten times slower than LuaJIT: fewer operations per
-- round there
if not rawget(_G, "jit") then
  for _, c in ipairs(CASES) do c.n = math.floor(c.n / 10) end
end

local raw, lib, ratio = {}, {}, {}
for i = 1, #CASES do raw[i], lib[i], ratio[i] = {}, {}, {} end
-- a warm-up round (LuaJIT's traces, luv's loop), not counted
for i = 1, #CASES do timed(CASES[i], false); timed(CASES[i], true) end
for r = 1, ROUNDS do
  for i = 1, #CASES do
    local a, b
    if r % 2 == 0 then a = timed(CASES[i], false); b = timed(CASES[i], true)
    else b = timed(CASES[i], true); a = timed(CASES[i], false) end
    raw[i][r], lib[i][r], ratio[i][r] = a, b, b / a
  end
end

local runtime = rawget(_G, "jit") and rawget(_G, "jit").version or _VERSION
print(("%s, backend %s, luv %s, %d rounds (medians)"):format(runtime, ah.backend, uv.version_string(), ROUNDS))
for i = 1, #CASES do
  print(("  %-40s raw %8.1f ns  library %8.1f ns  %.3fx"):format(CASES[i].name,
    median(raw[i]), median(lib[i]), median(ratio[i])))
end
