-- The cost of async_hooks.otel per request, on a real nginx with
-- opentelemetry-lua (its lib/: AH_OTEL_LUA, else
-- ../shared/external/opentelemetry-lua/lib).  Run with Lua 5.4 from the
-- repository root (`make otel-bench`):
--
--   lua5.4 bench/otel.lua [rounds] [seconds] [callgrind requests] [callgrind repetitions]
--
-- Handler (bench/otel_app.lua): APISIX's pattern, a request span attached
-- in rewrite, a child attached and detached in content, the request span
-- finished and detached in log; a batch span processor with an exporter
-- that drops the spans.  Path /c also starts a child span in a light
-- thread, a timer and a coroutine.  Both configurations call install():
--   ngxctx   opentelemetry-lua's default storage (ngx.ctx)
--   alocal   the same, and an AsyncLocal set in rewrite, read in each child
--   adapter  async_hooks.otel.storage() and isolate(processor)
-- Wall clock: interleaved rounds (the order alternates), one worker pinned
-- to CPU 0, wrk pinned to CPU 1 with one connection; per round the
-- difference of the mean time per request (1/req/s), median over rounds.
-- Instructions: callgrind, the difference of runs of N and 5N requests
-- divided by 4N (start-up cancels), median of the repetitions.
package.path = "./spec/?.lua;" .. package.path
local N = require("support.nginx")
local uv = require("luv")

local OTEL = os.getenv("AH_OTEL_LUA") or (N.ROOT .. "/../shared/external/opentelemetry-lua/lib")
if not io.open(OTEL .. "/opentelemetry/context.lua") then
  print("opentelemetry-lua's lib/ not found at " .. OTEL .. " (set AH_OTEL_LUA): skipped")
  return
end
local ROUNDS = tonumber(arg[1]) or 7
local SECS = tonumber(arg[2]) or 3
local CG_N = tonumber(arg[3]) or 200
local CG_REPS = tonumber(arg[4]) or 3

local SERVER = [[
    location /t {
      rewrite_by_lua_block { require("otel_app").rewrite() }
      content_by_lua_block { require("otel_app").content() }
      log_by_lua_block { require("otel_app").log() }
    }
    location /c {
      rewrite_by_lua_block { require("otel_app").rewrite() }
      content_by_lua_block { require("otel_app").children() }
      log_by_lua_block { require("otel_app").log() }
    }
]]
local PATHS = { "/t", "/c" }
local function conf(adapter, extra)
  local o = {
    http = ([[
  init_by_lua_block {
    require("async_hooks").install()
    require("otel_app").init(%s)
  }]]):format(type(adapter) == "string" and ("%q"):format(adapter) or tostring(adapter)),
    server = SERVER,
    lua_path = N.ROOT .. "/bench/?.lua;" .. OTEL .. "/?.lua;" .. OTEL .. "/?/init.lua",
  }
  for k, v in pairs(extra or {}) do o[k] = v end
  return o
end
local CONFIGS = { { name = "ngxctx", adapter = false }, { name = "alocal", adapter = "alocal" },
  { name = "adapter", adapter = true } }

local function median(t)
  local s = {}
  for i, v in ipairs(t) do s[i] = v end
  table.sort(s)
  local n = #s
  if n % 2 == 1 then return s[(n + 1) // 2] end
  return (s[n // 2] + s[n // 2 + 1]) / 2
end

local function sh_read(cmd)
  local p = io.popen(cmd)
  local s = p:read("a")
  p:close()
  return s
end

local function wrk(srv, path, secs)
  local out = sh_read(("taskset -c 1 wrk -t1 -c1 -d%ds %s 2>&1"):format(secs, srv:url(path)))
  local rps = tonumber(out:match("Requests/sec:%s*([%d%.]+)"))
  if not rps then error("wrk failed: " .. out) end
  return rps
end

local function wallclock()
  local srv = {}
  local ok, err = pcall(function()
    for _, c in ipairs(CONFIGS) do srv[c.name] = N.start(conf(c.adapter, { prefix_cmd = "taskset -c 0" })) end
    for _, path in ipairs(PATHS) do
      for _, c in ipairs(CONFIGS) do wrk(srv[c.name], path, 1) end -- warm up
      local diffs, us = { alocal = {}, adapter = {} }, { ngxctx = {}, alocal = {}, adapter = {} }
      for r = 1, ROUNDS do
        local got = {}
        for k = 0, #CONFIGS - 1 do
          local c = CONFIGS[(r + k - 1) % #CONFIGS + 1]
          got[c.name] = 1e6 / wrk(srv[c.name], path, SECS)
          us[c.name][r] = got[c.name]
        end
        diffs.alocal[r], diffs.adapter[r] = got.alocal - got.ngxctx, got.adapter - got.ngxctx
        print(("%s round %d: us/request ngxctx %.2f alocal %.2f (%+.2f) adapter %.2f (%+.2f)"):format(path, r,
          got.ngxctx, got.alocal, diffs.alocal[r], got.adapter, diffs.adapter[r]))
      end
      print(("%s median us/request: ngxctx %.2f alocal %.2f adapter %.2f; median paired difference alocal %+.2f"
        .. " adapter %+.2f us"):format(path, median(us.ngxctx), median(us.alocal), median(us.adapter),
        median(diffs.alocal), median(diffs.adapter)))
    end
  end)
  for _, s in pairs(srv) do s:stop() end
  if not ok then error(err, 0) end
end

local function callgrind_ir(c, path, n)
  local out = os.tmpname()
  local srv = N.start(conf(c.adapter, { foreground = true, start_timeout = 120,
    prefix_cmd = ("valgrind --tool=callgrind --smc-check=all-non-file --callgrind-out-file=%s"):format(out) }))
  local ok, err = pcall(function()
    for _ = 1, n do assert(srv:get(path, 30) == 200, "request failed under callgrind") end
  end)
  uv.sleep(200)
  srv:stop()
  if not ok then error(err, 0) end
  local f = assert(io.open(out))
  local s = f:read("a")
  f:close()
  os.remove(out)
  return tonumber(s:match("\nsummary:%s*(%d+)") or s:match("\ntotals:%s*(%d+)"))
end

local function instructions()
  if not sh_read("command -v valgrind"):match("valgrind") then
    print("callgrind: valgrind not installed, skipped")
    return
  end
  for _, path in ipairs(PATHS) do
    local per = {}
    for _, c in ipairs(CONFIGS) do
      local runs = {}
      for i = 1, CG_REPS do
        local a = callgrind_ir(c, path, CG_N)
        local b = callgrind_ir(c, path, 5 * CG_N)
        runs[i] = (b - a) / (4 * CG_N)
      end
      per[c.name] = median(runs)
      local each = {}
      for i, v in ipairs(runs) do each[i] = ("%.0f"):format(v) end
      print(("callgrind %s %-7s %8.0f instructions/request (median of %s)"):format(path, c.name, per[c.name],
        table.concat(each, ", ")))
    end
    print(("callgrind %s: alocal %+.0f, adapter %+.0f instructions/request over ngxctx (adapter %.3fx)"):format(
      path, per.alocal - per.ngxctx, per.adapter - per.ngxctx, per.adapter / per.ngxctx))
  end
end

if ROUNDS > 0 then wallclock() end
if CG_N > 0 then instructions() end
