--- The HTTP rows: the coroutine-per-request server (a 0 ms timer, a file
-- read, the answer; bench/http_server.lua) without tracking, with an
-- AsyncLocal set per request, and with four empty hooks; Node's twin
-- (bench/node_server.js: none, AsyncLocalStorage, empty hooks) in the same
-- run, and the AsyncLocal row's measured floor (bench/floor.c in place of
-- the library: http_server.lua's "floor").  All seven servers run at once,
-- pinned to CPU 0 (idle but one); wrk runs pinned to CPU 1, against each
-- server in turn, BENCH_HTTP_ROUNDS (11) rounds of BENCH_HTTP_SECONDS (1)
-- each after a 1 s warm-up, the order reversed every other round.  A ratio is taken inside one round (paired);
-- the rows report the median of the paired ratios.  Every server checks each
-- response's context against its own request; a mismatch fails the row.
-- Each paired ratio is also printed from the server's CPU time per request
-- (/proc/<pid>/stat), which moves less when other work shares the machine.
local U = require("util")

local M = {}

local SECONDS = tonumber(os.getenv("BENCH_HTTP_SECONDS")) or 1
local ROUNDS = tonumber(os.getenv("BENCH_HTTP_ROUNDS")) or 11
local CONNS = tonumber(os.getenv("BENCH_HTTP_CONNS")) or 50
local TIMER_MS = 0

local function have(cmd) return os.execute("command -v " .. cmd .. " >/dev/null 2>&1") end

local read_file = U.read_file

local function start(c, pin)
  c.out = os.tmpname()
  os.execute(("%s%s > %s 2>&1 & echo $! > %s.pid"):format(pin, c.cmd, c.out, c.out))
  for _ = 1, 200 do
    c.port = read_file(c.out):match("PORT (%d+)")
    if c.port then break end
    os.execute("sleep 0.05")
  end
  c.pid = read_file(c.out .. ".pid"):match("%d+")
  if not c.port then
    if c.pid then os.execute("kill " .. c.pid .. " 2>/dev/null") end
    error(("%s did not start:\n%s"):format(c.cmd, read_file(c.out)), 0)
  end
end

--- stop a server (by the pid we started it with) and read its statistics
local function stop(c)
  if not c.pid then return end
  os.execute("kill " .. c.pid .. " 2>/dev/null")
  local stats
  for _ = 1, 100 do
    stats = read_file(c.out):match("STATS ([^\n]+)")
    if stats then break end
    os.execute("sleep 0.05")
  end
  c.pid = nil
  c.mismatches = stats and tonumber(stats:match("mismatches=(%d+)")) or -1
  c.served = stats and tonumber(stats:match("served=(%d+)")) or 0
  c.stats = stats
  os.remove(c.out)
  os.remove(c.out .. ".pid")
end

--- CPU time (user + system, all threads, in clock ticks) of a process
local function cpu_ticks(pid)
  local s = read_file("/proc/" .. pid .. "/stat"):match("%) (.*)")
  if not s then return nil end
  local f = {}
  for x in s:gmatch("%S+") do f[#f + 1] = x end
  return tonumber(f[12]) + tonumber(f[13]) -- fields 14 and 15 of the whole line
end

--- one wrk run; returns requests/s and the server's CPU ticks per 1000
-- requests (nil when /proc is not readable)
local function load(c, seconds, pin)
  local t0 = cpu_ticks(c.pid)
  local w = io.popen(("%swrk -t1 -c%d -d%ds http://127.0.0.1:%s/ 2>&1"):format(pin, CONNS, seconds, c.port))
  local out = w:read("a")
  w:close()
  local t1 = cpu_ticks(c.pid)
  if out:match("Non%-2xx") or out:match("Socket errors") then
    c.errors = out:match("Socket errors:[^\n]*") or "non-2xx responses"
  end
  local reqs = tonumber(out:match("(%d+) requests in")) or 0
  local cpu = t0 and t1 and reqs > 0 and (t1 - t0) / reqs * 1000 or nil
  return tonumber(out:match("Requests/sec:%s*([%d%.]+)")) or 0, cpu
end

--- mean of the logs of paired ratios, as a ratio, and its standard error
-- (as a fraction): how far the rounds agree, for the notes under the table
local function geo_se(t)
  local n, sum, sq = #t, 0, 0
  if n < 2 then return nil end
  for _, x in ipairs(t) do sum = sum + math.log(x) end
  local m = sum / n
  for _, x in ipairs(t) do sq = sq + (math.log(x) - m) ^ 2 end
  return math.exp(m), math.sqrt(sq / (n - 1) / n)
end

local function median(t)
  local s = {}
  for i, x in ipairs(t) do s[i] = x end
  table.sort(s)
  if #s == 0 then return 0 end
  if #s % 2 == 1 then return s[(#s + 1) // 2] end
  return (s[#s // 2] + s[#s // 2 + 1]) / 2
end

function M.run()
  if not have("wrk") then error("wrk is not installed (apt-get install wrk)", 0) end
  local pinned = have("taskset")
  local spin = pinned and "taskset -c 0 " or ""
  local cpin = pinned and "taskset -c 1 " or ""
  local configs = {}
  -- "floor": the AsyncLocal row's measured floor (bench/floor.c in place
  -- of the library), built once here before the servers start
  local floor = U.build_floor()
  for _, ctx in ipairs { "none", "asynclocal", "hooks", floor and "floor" or nil } do
    configs[#configs + 1] = { name = "lua " .. ctx, lang = "lua", ctx = ctx,
      cmd = ("%s bench/http_server.lua coroutines %s %d"):format(U.LUA, ctx, TIMER_MS) }
  end
  local node = have("node")
  if node then
    for _, ctx in ipairs { "none", "als", "hooks" } do
      configs[#configs + 1] = { name = "node " .. ctx, lang = "node", ctx = ctx,
        cmd = ("node bench/node_server.js %s %d"):format(ctx, TIMER_MS) }
    end
  end
  local by, rounds = {}, {}
  for _, c in ipairs(configs) do by[c.name] = c end
  U.header(("HTTP: coroutine per request (0 ms timer + fs read), wrk -t1 -c%d, %d rounds of %d s, %s")
    :format(CONNS, ROUNDS, SECONDS, pinned and "servers on CPU 0, wrk on CPU 1" or "NOT pinned (no taskset)"))
  local ok, err = pcall(function()
    for _, c in ipairs(configs) do start(c, spin) end
    for _, c in ipairs(configs) do load(c, 1, cpin) end -- warm-up (Node's JIT, the library's tables)
    local head = { "round" }
    for _, c in ipairs(configs) do head[#head + 1] = c.name end
    print("| " .. table.concat(head, " | ") .. " | lua asynclocal/none | lua hooks/none |"
      .. (floor and " lua floor/none |" or "") .. (node and " node als/none | node hooks/none |" or ""))
    print("|" .. ("---|"):rep(#head + (node and 4 or 2) + (floor and 1 or 0)))
    for r = 1, ROUNDS do
      local rps, cpu = {}, {}
      rounds[r] = rps
      for i = 1, #configs do
        local c = configs[r % 2 == 1 and i or #configs + 1 - i]
        rps[c.name], cpu[c.name] = load(c, SECONDS, cpin)
      end
      local function pair(a, b)
        local x = rps[b] > 0 and rps[a] / rps[b] or 0
        by[a].ratios = by[a].ratios or {}
        table.insert(by[a].ratios, x)
        -- the same ratio from the server's CPU time per request: less
        -- sensitive to what else runs on the machine
        by[a].cpu = by[a].cpu or {}
        local y = cpu[a] and cpu[b] and cpu[a] > 0 and cpu[b] / cpu[a]
        if y then table.insert(by[a].cpu, y) end
        return ("%.3f%s"):format(x, y and (" (cpu %.3f)"):format(y) or "")
      end
      local cells = { tostring(r) }
      for _, c in ipairs(configs) do cells[#cells + 1] = ("%.0f"):format(rps[c.name]) end
      cells[#cells + 1] = pair("lua asynclocal", "lua none")
      cells[#cells + 1] = pair("lua hooks", "lua none")
      if floor then cells[#cells + 1] = pair("lua floor", "lua none") end
      if node then
        cells[#cells + 1] = pair("node als", "node none")
        cells[#cells + 1] = pair("node hooks", "node none")
      end
      print("| " .. table.concat(cells, " | ") .. " |")
    end
  end)
  for _, c in ipairs(configs) do stop(c) end
  if not ok then error(err, 0) end
  for _, c in ipairs(configs) do
    if c.errors then print(("  (%s: wrk reported %s)"):format(c.name, c.errors)) end
    if c.ctx == "floor" and not ((c.stats or ""):match("floor_tracked=[1-9]") and
        (c.stats or ""):match("floor_direct=[1-9]") and (c.stats or ""):match("floor_slow=0")) then
      print("  (lua floor: it tracked no registration, or did not run them itself: not a floor)")
      c.mismatches = c.mismatches ~= 0 and c.mismatches or -1
    end
    if c.mismatches ~= 0 then
      print(("  (%s: %s responses with a wrong context)"):format(c.name,
        c.mismatches < 0 and "no statistics, unknown" or tostring(c.mismatches)))
    end
  end
  local als, hooks = median(by["lua asynclocal"].ratios), median(by["lua hooks"].ratios)
  local nals = node and median(by["node als"].ratios)
  local nhooks = node and median(by["node hooks"].ratios)
  print(("  medians of the paired ratios: Lua AsyncLocal %.3f, Lua 4 empty hooks %.3f%s"):format(als, hooks,
    node and (", Node AsyncLocalStorage %.3f, Node empty hooks %.3f"):format(nals, nhooks) or " (node not installed)"))
  local function cpu_median(name) return by[name] and #(by[name].cpu or {}) > 0 and median(by[name].cpu) end
  if cpu_median("lua asynclocal") then
    print(("  the same from server CPU time per request (none / x): Lua AsyncLocal %.3f, Lua 4 empty hooks %.3f%s")
      :format(cpu_median("lua asynclocal"), cpu_median("lua hooks"), node and cpu_median("node als")
        and (", Node AsyncLocalStorage %.3f, Node empty hooks %.3f"):format(cpu_median("node als"),
          cpu_median("node hooks")) or ""))
  end
  -- how precise the paired ratios are: their geometric mean and its
  -- standard error over the rounds, and the library against its floor
  -- paired in the same rounds (what the floor rule compares)
  do
    local function spread(a, b)
      local t = {}
      for _, rps in ipairs(rounds) do
        if (rps[a] or 0) > 0 and (rps[b] or 0) > 0 then t[#t + 1] = rps[a] / rps[b] end
      end
      local g, se = geo_se(t)
      return g and ("%s / %s %.3f +- %.1f %%"):format(a, b, g, se * 100)
    end
    local notes = {}
    for _, p in ipairs { { "lua asynclocal", "lua none" }, { "lua floor", "lua none" },
                         { "lua asynclocal", "lua floor" }, { "lua hooks", "lua none" } } do
      notes[#notes + 1] = by[p[1]] and by[p[2]] and spread(p[1], p[2]) or nil
    end
    if #notes > 0 then
      print("  geometric means of the paired ratios +- their standard error: " .. table.concat(notes, ", "))
    end
  end
  local clean = function(c) return c.mismatches == 0 end
  -- a target counts as met when the throughput ratio meets it and so does
  -- the CPU-time ratio (where /proc gave one): on a shared machine the
  -- throughput alone can pass by luck
  local function meets(name, x, bound)
    local c = cpu_median(name)
    return x >= bound and (not c or c >= bound)
  end
  local function beats_node()
    if not node then return true end
    local c, nc = cpu_median("lua asynclocal"), cpu_median("node als")
    return als >= nals and (not (c and nc) or c >= nc)
  end
  local function cell(name, x)
    local c = cpu_median(name)
    return ("%.3fx%s"):format(x, c and (" (cpu %.3fx)"):format(c) or "")
  end
  -- the floor rule (as bench/instructions.lua applies it), for
  -- each half of the target on its own: a half the floor meets (by
  -- throughput and by CPU time), the row must meet too; a half the floor
  -- misses, the row may miss within 5 % of the floor (by both)
  local fl = floor and clean(by["lua floor"]) and median(by["lua floor"].ratios)
  local fc = fl and cpu_median("lua floor")
  local ac = cpu_median("lua asynclocal")
  local near_floor = fl and als >= fl / 1.05 and (not (ac and fc) or ac >= fc / 1.05)
  local function half(met, floor_meets)
    if met then return true, "met" end
    if not fl then return false, "missed" end
    if floor_meets then return false, "missed (the floor meets it)" end
    return near_floor, near_floor and "ok by the floor rule" or "missed (> 5 % below the floor)"
  end
  local als_ok
  local als_note = ""
  do
    local ok1, why1 = half(meets("lua asynclocal", als, 0.95), fl and meets("lua floor", fl, 0.95))
    local ok2, why2 = true, "met"
    if node then
      local nc = cpu_median("node als")
      local floor_beats = fl and fl >= nals and (not (fc and nc) or fc >= nc)
      ok2, why2 = half(beats_node(), floor_beats)
    end
    als_ok = ok1 and ok2
    if fl then
      print(("  the floor (bench/floor.c): %.3f%s"):format(fl, fc and (" (cpu %.3f)"):format(fc) or ""))
      als_note = ("; floor %s; >= 0.95x: %s; >= Node: %s"):format(cell("lua floor", fl), why1, why2)
    elseif floor then
      print("  (the floor server failed its checks: no floor)")
    end
  end
  return {
    { path = "HTTP, coroutine per request (fs read + 0 ms timer), AsyncLocal set per request vs no tracking",
      value = ("%s; Node ALS %s%s"):format(cell("lua asynclocal", als),
        node and cell("node als", nals) or "not measured", als_note),
      target = ">= 0.95x and >= Node's ALS ratio",
      ok = als_ok and clean(by["lua asynclocal"]) },
    { path = "same, 4 empty hooks vs no tracking",
      value = ("%s; Node hooks %s"):format(cell("lua hooks", hooks),
        node and cell("node hooks", nhooks) or "not measured"),
      target = ">= 0.88x", ok = meets("lua hooks", hooks, 0.88) and clean(by["lua hooks"]) },
  }
end

return M
