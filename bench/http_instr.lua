--- User-space instructions per HTTP request (callgrind), the same server
-- as the HTTP rows (bench/http_server.lua coroutines <ctx> 0): each
-- configuration is served twice under callgrind, for BENCH_HTTPI_SHORT (1)
-- and BENCH_HTTPI_LONG (4) seconds of wrk with BENCH_HTTPI_CONNS (50, as
-- in the HTTP rows) connections; the figure is the difference of
-- the two counts divided by the difference of the requests served (the
-- server counts them), so start-up, connection set-up and shutdown cancel.
-- Kernel time (TCP, epoll), which tracking does not change, is not in these
-- counts, so the ratios are lower than the throughput ratios.  No target:
-- a steady figure to iterate on while wall-clock is noisy.
-- BENCH_HTTPI_SERVERS="none,asynclocal" measures only those servers.
local U = require("util")

local M = {}

local SHORT = tonumber(os.getenv("BENCH_HTTPI_SHORT")) or 1
local LONG = tonumber(os.getenv("BENCH_HTTPI_LONG")) or 4
-- connections: how many requests are in flight changes what the collector
-- finds alive at each cycle (the library's deferred anchors)
local CONNS = tonumber(os.getenv("BENCH_HTTPI_CONNS")) or 50
local SERVERS = os.getenv("BENCH_HTTPI_SERVERS")

local read_file = U.read_file

--- one callgrind run: instructions and requests served
local function run(ctx, seconds)
  local out = os.tmpname()
  os.execute(("valgrind --tool=callgrind --callgrind-out-file=/dev/null %s bench/http_server.lua coroutines %s 0"
    .. " > %s 2>&1 & echo $! > %s.pid"):format(U.LUA, ctx, out, out))
  local port
  for _ = 1, 600 do
    port = read_file(out):match("PORT (%d+)")
    if port then break end
    os.execute("sleep 0.05")
  end
  local pid = read_file(out .. ".pid"):match("%d+")
  if port then
    local w = io.popen(("wrk -t1 -c%d --timeout 10s -d%ds http://127.0.0.1:%s/ 2>&1"):format(CONNS, seconds, port))
    w:read("a")
    w:close()
  end
  if pid then os.execute("kill " .. pid .. " 2>/dev/null") end
  local s
  for _ = 1, 600 do
    s = read_file(out)
    if s:match("Collected : %d+") then break end
    os.execute("sleep 0.05")
  end
  os.remove(out)
  os.remove(out .. ".pid")
  local ins, served = tonumber(s:match("Collected : (%d+)")), tonumber(s:match("served=(%d+)"))
  local mism = tonumber(s:match("mismatches=(%d+)"))
  if not (port and ins and served) then error(("server %s under callgrind failed:\n%s"):format(ctx, s), 0) end
  if mism ~= 0 then error(("server %s: %d responses with a wrong context"):format(ctx, mism), 0) end
  return ins, served
end

function M.run()
  if not os.execute("command -v wrk >/dev/null 2>&1") then error("wrk is not installed", 0) end
  U.header(("HTTP user-space instructions per request (callgrind; %d s - %d s of wrk -c%d; no target)")
    :format(LONG, SHORT, CONNS))
  print("| server | instructions per request | ratio to none | requests (short / long) |")
  print("|---|---|---|---|")
  local base
  -- "floor": the AsyncLocal row's measured floor (bench/floor.c)
  local floor = U.build_floor()
  local servers = { "none", "asynclocal", "hooks", floor and "floor" or nil, floor and "floor_light" or nil }
  if SERVERS then
    servers = {}
    for name in SERVERS:gmatch("[^,%s]+") do servers[#servers + 1] = name end
  end
  for _, ctx in ipairs(servers) do
    local i1, n1 = run(ctx, SHORT)
    local i2, n2 = run(ctx, LONG)
    local per = (i2 - i1) / (n2 - n1)
    base = base or per
    print(("| coroutine per request, %s | %.0f | %.3fx | %d / %d |"):format(ctx, per, per / base, n1, n2))
  end
  return {}
end

return M
