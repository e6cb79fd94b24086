--- One memory measurement for bench/memory.lua, in a fresh process:
--   lua5.4 bench/mem_case.lua <case> <generational|incremental> <variant> <n> [memcount.so]
-- case: churn, suspended, pending, or one of the abandoning programs
-- abandon, generator, idle.  variant: "raw" (library loaded, not
-- installed: raw coroutines and luv), "installed" (nothing set), "value"
-- (an AsyncLocal set), "init4" (installed, a value set, a Node-style
-- 4-parameter init and a destroy hook) or "before_after" (installed, a
-- value set, before/after hooks that ask for the resource).  memcount.so
-- (bench/memcount.c, built by bench/memory.lua) measures everything malloc
-- holds (Lua heap, luv, the library's C arrays); without it only the Lua
-- heap is measured.  Prints one line "RESULT key=value ...".
local what, mode, variant, n, so = arg[1], arg[2], arg[3], tonumber(arg[4]), arg[5]
assert(mode == "generational" or mode == "incremental", "mode: generational or incremental")
collectgarbage(mode)
package.path = "bench/?.lua;examples/?.lua;" .. package.path
local uv = require("luv")
local ah = require("async_hooks")
local U = require("util")
local yield = coroutine.yield
local co = { create = coroutine.create, resume = coroutine.resume }
if variant ~= "raw" then
  ah.install()
  co = ah.coroutine
end
local v = ah.AsyncLocal.new()
if variant == "init4" or variant == "before_after" then
  local seen = 0
  if variant == "init4" then
    ah.createHook {
      init = function(_, _, _, resource) if resource then seen = seen + 1 end end,
      destroy = function() seen = seen - 1 end,
    }:enable()
  else
    ah.createHook {
      before = function() if ah.executionAsyncResource() then seen = seen + 1 end end,
      after = function() if ah.executionAsyncResource() then seen = seen + 1 end end,
    }:enable()
  end
  v:set({ request = 1 })
end
local function with_value(f, ...)
  if variant == "value" then return v:run({ outer = true }, f, ...) end
  return f(...)
end
local function full_gc()
  collectgarbage("collect")
  collectgarbage("collect")
end
local malloc_live = so and assert(package.loadlib(so, "luaopen_memcount"))()
local function heap_bytes() return malloc_live and malloc_live() or collectgarbage("count") * 1024 end

local cases = {}

--- n "requests": a coroutine per request that keeps a per-request value,
-- yields once and finishes; the Lua heap sampled every 64 requests.
function cases.churn()
  local create, resume = co.create, co.resume
  local body
  if variant == "raw" then
    body = function(id)
      local ctx = { id = id }
      yield()
      return ctx.id
    end
  else
    body = function(id)
      v:set({ id = id })
      yield()
      return v:get().id
    end
  end
  local peak = 0
  local function requests(k)
    for i = 1, k do
      local c = create(body)
      resume(c, i)
      local ok, id = resume(c)
      if not (ok and id == i) then error("request " .. i .. " lost its value: " .. tostring(id)) end
      if i & 63 == 0 then
        local kb = collectgarbage("count")
        if kb > peak then peak = kb end
      end
    end
  end
  requests(n // 10) -- warm-up: the library's tables reach their size
  full_gc()
  local start, rss0, m0 = collectgarbage("count"), U.rss_kb(), heap_bytes()
  peak = start
  local t = os.clock()
  requests(n)
  local dt = os.clock() - t
  full_gc()
  return ("start=%.1f peak=%.1f end=%.1f rss_start=%d rss_end=%d ns=%.0f malloc_start=%.0f malloc_end=%.0f"):format(
    start, peak, collectgarbage("count"), rss0, U.rss_kb(), dt / n * 1e9, m0 / 1024, heap_bytes() / 1024)
end

--- bytes kept per object while `keep` holds n of them, three times: the
-- first measurement also pays for the library's (and `keep`'s) tables
-- growing to n entries; the smallest is the steady state, once they have
-- grown.  "lua" counts the Lua heap; "bytes"/"first" count what malloc
-- holds when memcount is there (else the Lua heap again).
local function bytes_per(make, release)
  local best, first, lua = math.huge, nil, math.huge
  for _ = 1, 3 do
    full_gc()
    local before, lbefore = heap_bytes(), collectgarbage("count")
    local keep = make(n)
    full_gc()
    local b = (heap_bytes() - before) / n
    first = first or b
    best = math.min(best, b)
    lua = math.min(lua, (collectgarbage("count") - lbefore) * 1024 / n)
    if release then release(keep) end
    keep = nil -- luacheck: ignore
  end
  return ("bytes=%.2f first=%.2f lua=%.2f counted=%d"):format(best, first, lua, malloc_live and 1 or 0)
end

--- a suspended coroutine (created, resumed once, waiting in a yield)
function cases.suspended()
  local create, resume = co.create, co.resume
  return bytes_per(function(k)
    local keep = {}
    for i = 1, k do
      local c = create(function() yield() end)
      resume(c)
      keep[i] = c
    end
    return keep
  end)
end

--- a pending luv callback (a timer that would fire in a minute)
function cases.pending()
  return bytes_per(function(k)
    local ts = {}
    for i = 1, k do
      local tm = uv.new_timer()
      tm:start(60000, 0, function() end)
      ts[i] = tm
    end
    return ts
  end, function(ts)
    for _, tm in ipairs(ts) do tm:close() end
    uv.run("nowait")
  end)
end

--- the programs that drop suspended coroutines (the live heap must stay
-- what plain Lua's is): the peak Lua heap, sampled every 1000 steps, and
-- the heap after a full collection, in KiB
local function abandoning(step)
  full_gc()
  local start, peak = collectgarbage("count"), 0
  for i = 1, n do
    step()
    if i % 1000 == 0 then
      local kb = collectgarbage("count")
      if kb > peak then peak = kb end
    end
  end
  full_gc()
  return ("start=%.1f peak=%.1f end=%.1f"):format(start, peak, collectgarbage("count"))
end

--- coroutines resumed once and dropped while suspended
function cases.abandon()
  local create, resume = coroutine.create, coroutine.resume
  return abandoning(function()
    local c = create(function() yield() end)
    resume(c)
  end)
end

--- the generator idiom left early: for v in coroutine.wrap(gen) ... break
function cases.generator()
  local wrap = coroutine.wrap
  local function gen() for k = 1, 100 do yield(k) end end
  return abandoning(function()
    for x in wrap(gen) do if x == 50 then break end end
  end)
end

--- a coroutine dropped while suspended in each luv idle callback
function cases.idle()
  local create, resume = coroutine.create, coroutine.resume
  local idle, left = uv.new_idle(), n
  full_gc()
  local start, peak = collectgarbage("count"), 0
  idle:start(function()
    local c = create(function() yield() end)
    resume(c)
    left = left - 1
    if left % 1000 == 0 then
      local kb = collectgarbage("count")
      if kb > peak then peak = kb end
    end
    if left == 0 then idle:stop(); idle:close() end
  end)
  uv.run()
  full_gc()
  return ("start=%.1f peak=%.1f end=%.1f"):format(start, peak, collectgarbage("count"))
end

local f = assert(cases[what], "unknown case " .. tostring(what))
io.stdout:write("RESULT ", with_value(f), "\n")
