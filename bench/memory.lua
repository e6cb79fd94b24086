--- Benchmark 7: memory.  RSS stays flat over 1e6 coroutine "requests" with
-- an AsyncLocal set; bytes retained per suspended coroutine and per pending
-- luv callback, against raw Lua/luv.
local U = require("util")
local uv = require("luv")
local ah = require("async_hooks")
local raw_create, raw_resume, yield = coroutine.create, coroutine.resume, coroutine.yield
local lib = ah.coroutine
local N = math.floor(1e6 * U.SCALE)

U.header(("7. memory: %d requests through coroutines with an AsyncLocal set"):format(N))
local v = ah.AsyncLocal.new()
local function requests(n)
  for i = 1, n do
    local c = lib.create(function(id)
      v:set({ id = id })
      yield()
      return v:get().id
    end)
    lib.resume(c, i)
    local _, id = lib.resume(c)
    assert(id == i)
  end
end
requests(N // 10)
collectgarbage("collect")
local warm = U.rss_kb()
local t = os.clock()
requests(N)
local dt = os.clock() - t
collectgarbage("collect")
local final = U.rss_kb()
print(("  RSS after warm-up %d KiB, after %d more requests %d KiB (%+d KiB, %.1f%%); %.0f ns/request"):format(
  warm, N, final, final - warm, (final - warm) / warm * 100, dt / N * 1e9))

local function bytes_per_once(make, n)
  collectgarbage("collect")
  collectgarbage("collect")
  local before = collectgarbage("count")
  local keep = make(n)
  collectgarbage("collect")
  collectgarbage("collect")
  local after = collectgarbage("count")
  assert(keep)
  return (after - before) * 1024 / n
end
-- the smallest of three measurements: tables that grew in an earlier
-- measurement (weak slot tables, luv's registry) would otherwise count
local function bytes_per(make, n)
  local best = math.huge
  for _ = 1, 3 do best = math.min(best, bytes_per_once(make, n)) end
  return best
end

local M = math.floor(1e5 * U.SCALE)
local function suspended(create, resume)
  return function(n)
    local keep = {}
    for i = 1, n do
      local c = create(function() yield() end)
      resume(c)
      keep[i] = c
    end
    return keep
  end
end
U.header(("7. memory: bytes retained per suspended coroutine (%d kept)"):format(M))
local raw = bytes_per(suspended(raw_create, raw_resume), M)
local inst = bytes_per(suspended(lib.create, lib.resume), M)
local val = v:run({}, function() return bytes_per(suspended(lib.create, lib.resume), M) end)
print(("  raw coroutine %.0f B; library %.0f B (%+.0f); library, AsyncLocal set %.0f B (%+.0f)"):format(
  raw, inst, inst - raw, val, val - raw))

local K = math.floor(2e4 * U.SCALE)
local function pending(n)
  local ts = {}
  for i = 1, n do
    local tm = uv.new_timer()
    tm:start(60000, 0, function() end)
    ts[i] = tm
  end
  return ts
end
local function stop_all(ts) for _, tm in ipairs(ts) do tm:close() end uv.run("nowait") end
local function pending_measured(n)
  local best = math.huge
  for _ = 1, 3 do
    local ts
    best = math.min(best, bytes_per_once(function(k) ts = pending(k); return ts end, n))
    stop_all(ts)
  end
  return best
end
U.header(("7. memory: bytes retained per pending luv callback (%d timers)"):format(K))
ah.uninstall()
local rawb = pending_measured(K)
ah.install()
local untracked = pending_measured(K)
local tracked = v:run({}, function() return pending_measured(K) end)
print(("  raw luv %.0f B; installed, untracked %.0f B (%+.0f); tracked (AsyncLocal set) %.0f B (%+.0f)"):format(
  rawb, untracked, untracked - rawb, tracked, tracked - rawb))
