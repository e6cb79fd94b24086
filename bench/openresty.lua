-- OpenResty benchmark: the request id carried by async_hooks vs passed by
-- hand, on a real nginx (lua-nginx-module, LuaJIT).  Run with Lua 5.4 from
-- the repository root (`make openresty-bench`):
--
--   lua5.4 bench/openresty.lua [rounds] [seconds] [callgrind requests] [callgrind repetitions] [configs]
--
-- (configs: a comma-separated subset of base,unused,lib for the callgrind
-- part, all three by default)
--
-- Handler (bench/openresty_app.lua): ngx.sleep(0), a timer hand-off, two log
-- lines reading the id.  Three configurations:
--   base    library not loaded, id by hand
--   unused  library installed (coroutine/thread/timer functions patched),
--           id by hand
--   lib     library installed, id in an AsyncLocal
-- Throughput: paired interleaved rounds (the order rotates each round), one
-- worker pinned to CPU 0 (taskset -c 0), wrk pinned to CPU 1 with one
-- connection; the ratio of each round to the base run of the same round,
-- median over rounds.  Then instructions per request with callgrind
-- (master_process off, daemon off): the difference of two runs of N and
-- 5N requests, divided by 4N, so that start-up cancels.
package.path = "./spec/?.lua;" .. package.path
local N = require("support.nginx")
local uv = require("luv")

-- ahead of other work on a shared machine when we may (root); plain otherwise
local NICE = io.popen("id -u"):read("l") == "0" and "nice -n -15" or ""
local ROUNDS = tonumber(arg[1]) or 5
local SECS = tonumber(arg[2]) or 3
local CG_N = tonumber(arg[3]) or 200
local CG_REPS = tonumber(arg[4]) or 3 -- JIT trace formation varies from run to run
local CG_ONLY = arg[5] and {} or nil
if arg[5] then for c in arg[5]:gmatch("[^,]+") do CG_ONLY[c] = true end end

local SERVER = [[
    location /hand { content_by_lua_block { require("openresty_app").hand() } }
    location /lib { content_by_lua_block { require("openresty_app").lib() } }
    location /floor_ctx { content_by_lua_block { require("openresty_app").floor_ctx() } }
    location /floor_ctx_tab { content_by_lua_block { require("openresty_app").floor_ctx_tab() } }
]]
local function http(install)
  return ([[
  init_by_lua_block { %s }
]]):format(install and 'require("async_hooks").install()' or "")
end

local CONFIGS = {
  { name = "base", install = false, path = "/hand" },
  { name = "unused", install = true, path = "/hand" },
  { name = "lib", install = true, path = "/lib" },
  -- floors, callgrind only and only when asked for (configs argument)
  { name = "floor_ctx", install = true, path = "/floor_ctx", extra = true },
  { name = "floor_ctx_tab", install = true, path = "/floor_ctx_tab", extra = true },
}

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

-- CPU time (user + system, clock ticks) of the server's worker process
local function worker_ticks(srv)
  if not srv.worker then
    srv.worker = tonumber(sh_read("pgrep -P " .. srv.pid):match("%d+"))
  end
  local f = io.open("/proc/" .. srv.worker .. "/stat")
  local st = f:read("a")
  f:close()
  local fields = {}
  for x in st:match("%) (.*)"):gmatch("%S+") do fields[#fields + 1] = x end
  return tonumber(fields[12]) + tonumber(fields[13]) -- utime, stime
end

local TICK = tonumber(sh_read("getconf CLK_TCK")) or 100

-- requests/s, and worker CPU microseconds per request
local function wrk(srv, path, secs)
  local t0 = worker_ticks(srv)
  local out = sh_read(("%s taskset -c 1 wrk -t1 -c1 -d%ds %s 2>&1"):format(NICE, secs, srv:url(path)))
  local t1 = worker_ticks(srv)
  local rps = tonumber(out:match("Requests/sec:%s*([%d%.]+)"))
  local n = tonumber(out:match("(%d+) requests in"))
  if not rps or not n then error("wrk failed: " .. out) end
  return rps, (t1 - t0) / TICK * 1e6 / n
end

local function throughput()
  local servers = {}
  local ok, err = pcall(function()
    for _, c in ipairs(CONFIGS) do
      if c.extra then break end
      if c.install then
        servers[c.name] = servers.unused or servers.lib
      end
      servers[c.name] = servers[c.name] or N.start {
        http = http(c.install), server = SERVER, lua_path = N.ROOT .. "/bench/?.lua", prefix_cmd = NICE .. " taskset -c 0",
      }
    end
    -- warm up (JIT, caches)
    for i = 1, 3 do local c = CONFIGS[i]; wrk(servers[c.name], c.path, 1) end
    local ratios = { unused = {}, lib = {} }
    local cratios = { unused = {}, lib = {} }
    local rps = { base = {}, unused = {}, lib = {} }
    for r = 1, ROUNDS do
      local got, cpu = {}, {}
      for k = 0, 2 do
        local c = CONFIGS[(r + k - 1) % 3 + 1]
        got[c.name], cpu[c.name] = wrk(servers[c.name], c.path, SECS)
        rps[c.name][r] = got[c.name]
      end
      for _, k in ipairs { "unused", "lib" } do
        ratios[k][r] = got[k] / got.base
        cratios[k][r] = cpu.base / cpu[k]
      end
      io.write(("round %d: req/s base %.0f unused %.0f (%.3fx) lib %.0f (%.3fx)"
        .. " | worker CPU us/req base %.1f unused %.1f (%.3fx) lib %.1f (%.3fx)\n"):format(
        r, got.base, got.unused, ratios.unused[r], got.lib, ratios.lib[r],
        cpu.base, cpu.unused, cratios.unused[r], cpu.lib, cratios.lib[r]))
      io.flush()
    end
    print(("median req/s: base %.0f  unused %.0f  lib %.0f"):format(median(rps.base), median(rps.unused), median(rps.lib)))
    print(("paired throughput ratio (median of %d rounds of %ds): installed-but-unused %.3fx   library %.3fx"):format(
      ROUNDS, SECS, median(ratios.unused), median(ratios.lib)))
    print(("paired worker-CPU-per-request ratio (base/config, median): installed-but-unused %.3fx   library %.3fx"):format(
      median(cratios.unused), median(cratios.lib)))
  end)
  local stopped = {}
  for _, s in pairs(servers) do
    if not stopped[s] then stopped[s] = true; s:stop() end
  end
  if not ok then error(err, 0) end
end

-- instructions of a foreground nginx under callgrind serving n requests
local function callgrind_ir(c, n)
  local out = os.tmpname()
  local srv = N.start {
    http = http(c.install), server = SERVER, lua_path = N.ROOT .. "/bench/?.lua", foreground = true, start_timeout = 120,
    prefix_cmd = ("valgrind --tool=callgrind --smc-check=all-non-file --callgrind-out-file=%s"):format(out),
  }
  local ok, err = pcall(function()
    for _ = 1, n do
      local st = srv:get(c.path, 30)
      assert(st == 200, "request failed under callgrind")
    end
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
  local per = {}
  for _, c in ipairs(CONFIGS) do
    if (CG_ONLY and not CG_ONLY[c.name]) or (c.extra and not CG_ONLY) then goto next end
    local runs = {}
    for i = 1, CG_REPS do
      local a = callgrind_ir(c, CG_N)
      local b = callgrind_ir(c, 5 * CG_N)
      runs[i] = (b - a) / (4 * CG_N)
    end
    per[c.name] = median(runs)
    local each = {}
    for i, v in ipairs(runs) do each[i] = ("%.0f"):format(v) end
    print(("callgrind %-6s %8.0f instructions/request (median of %s)"):format(c.name, per[c.name], table.concat(each, ", ")))
    ::next::
  end
  if not (per.base and per.unused and per.lib) then return end
  print(("callgrind: unused %+.0f (%.3fx), lib %+.0f (%.3fx) instructions/request vs base"):format(
    per.unused - per.base, per.base / per.unused, per.lib - per.base, per.base / per.lib))
end

if ROUNDS > 0 then throughput() end
if CG_N > 0 then instructions() end
