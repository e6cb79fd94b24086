--- Wall-clock benchmarks of coroutine switch, coroutine lifecycle and
-- context values, each against raw Lua and against a pure-Lua
-- implementation (bench/purelua.lua).
local U = require("util")
local raw = { create = coroutine.create, resume = coroutine.resume, yield = coroutine.yield,
  wrap = coroutine.wrap }
local ah = require("async_hooks")
local P = require("purelua")
local lib = ah.coroutine

local N = math.floor(1e6 * U.SCALE)
local results = {}

local function switch(co_lib)
  return function(n)
    local c = co_lib.create(function() local y = co_lib.yield; while true do y() end end)
    local resume = co_lib.resume
    for _ = 1, n do resume(c) end
  end
end

U.header("1. coroutine switch: resume/yield round trip (ratio to raw coroutine.resume)")
local v = ah.AsyncLocal.new()
local pv = P.new()
local hook = ah.createHook { init = function() end, before = function() end,
  after = function() end, destroy = function() end }
local m = U.compare({
  { "raw", switch(raw) },
  { "installed, no hooks", switch(lib) },
  { "installed, AsyncLocal set", function(n) v:run(1, switch(lib), n) end },
  { "installed, 4 empty hooks", function(n) hook:enable(); switch(lib)(n); hook:disable() end },
  { "pure-Lua implementation, value set", function(n) pv:run(1, switch(P), n) end },
}, N)
U.line("raw coroutine.resume", m.raw, N)
results.switch = U.line("installed, no hooks", m["installed, no hooks"], N, m.raw, 1.10)
results.switch_value = U.line("installed, AsyncLocal set", m["installed, AsyncLocal set"], N, m.raw, 1.10)
U.line("installed, 4 empty hooks", m["installed, 4 empty hooks"], N, m.raw)
U.line("pure-Lua implementation, value set", m["pure-Lua implementation, value set"], N, m.raw)
print(("  library vs pure-Lua (value set): x%.3f"):format(
  m["installed, AsyncLocal set"] / m["pure-Lua implementation, value set"]))
local roundtrip = m["installed, AsyncLocal set"] / N

U.header("2. coroutine lifecycle: create + run to completion (ratio to raw)")
local N2 = N // 4
local function life(co_lib)
  return function(n)
    local create, resume = co_lib.create, co_lib.resume
    local f = function(x) return x end
    for i = 1, n do resume(create(f), i) end
  end
end
m = U.compare({
  { "raw", life(raw) },
  { "installed", life(lib) },
  { "installed, AsyncLocal set", function(n) v:run(1, life(lib), n) end },
  { "pure-Lua", function(n) pv:run(1, life(P), n) end },
}, N2)
U.line("raw create + resume", m.raw, N2)
results.lifecycle = U.line("installed", m.installed, N2, m.raw, 1.5)
U.line("installed, AsyncLocal set", m["installed, AsyncLocal set"], N2, m.raw, 1.5)
U.line("pure-Lua implementation", m["pure-Lua"], N2, m.raw)

U.header("3. context values: get() and run() with 1, 10, 100 locals in the frame")
local t = { x = 1 }
local up = { x = 1 }
local function closure() return up.x end
local refs = U.compare({
  { "table index", function(n) local tt = t; for _ = 1, n do local _ = tt.x end end },
  { "closure", function(n) local f = closure; for _ = 1, n do f() end end },
  { "bare C call", function(n) local f, a = rawequal, t; for _ = 1, n do f(a, a) end end },
}, N)
U.line("plain table index t.x", refs["table index"], N)
U.line("Lua closure returning an upvalue's field", refs.closure, N, refs["table index"])
U.line("bare C function call (rawequal)", refs["bare C call"], N, refs["table index"])
results.get = {}
for _, width in ipairs { 1, 10, 100 } do
  local locals, plocals = {}, {}
  for i = 1, width do locals[i] = ah.AsyncLocal.new(); plocals[i] = P.new() end
  local target, ptarget = locals[width], plocals[width]
  local function nest(i, fn, n)
    if i > width then return fn(n) end
    return locals[i]:run(i, nest, i + 1, fn, n)
  end
  local function pnest(i, fn, n)
    if i > width then return fn(n) end
    return plocals[i]:run(i, pnest, i + 1, fn, n)
  end
  local f = function() end
  m = U.compare({
    { "get", function(n) nest(1, function(k) local g = target; for _ = 1, k do g:get() end end, n) end },
    { "pure get", function(n) pnest(1, function(k) local g = ptarget; for _ = 1, k do g:get() end end, n) end },
    { "run", function(n) nest(1, function(k) local g = target; for i = 1, k do g:run(i, f) end end, n // 10) end },
    { "pure run", function(n)
      pnest(1, function(k) local g = ptarget; for i = 1, k do g:run(i, f) end end, n // 10)
    end },
    { "call", function(n) for i = 1, n // 10 do f(i) end end },
  }, N)
  print(("  -- %d local%s in the frame"):format(width, width == 1 and "" or "s"))
  results.get[width] = U.line("AsyncLocal:get()", m.get, N, refs["table index"], 3)
  U.line("pure-Lua get()", m["pure get"], N, refs["table index"])
  U.line("AsyncLocal:run(v, fn)", m.run, N // 10, m.call)
  U.line("pure-Lua run(v, fn)", m["pure run"], N // 10, m.call)
  local rg = (m.run / (N // 10) + m.get / N)
  print(("  run + get = %.1f ns vs one resume/yield round trip %.1f ns: %s"):format(
    rg * 1e9, roundtrip * 1e9, rg < roundtrip and "under (target met)" or "over (target MISSED)"))
  print(("  library vs pure-Lua: get x%.3f, run x%.3f"):format(m.get / m["pure get"], m.run / m["pure run"]))
end

return results
