--- The HTTP rows: the coroutine-per-request server (bench/http_server.lua:
-- one `set`, a 0 ms timer, fs_open -> fs_read -> fs_close, one `get`, the
-- answer) without the library, with an AsyncLocal, with the AsyncLocal and
-- four hooks that count events, and with four empty hooks; Node's twin
-- (bench/node_server.js: none, AsyncLocalStorage, the same with counting
-- hooks, empty hooks) in the same run.  All eight servers run at once,
-- pinned to CPU 0 (idle but one); wrk runs pinned to CPU 1, against each
-- server in turn, BENCH_HTTP_ROUNDS (11) rounds of BENCH_HTTP_SECONDS (1)
-- each after a 1 s warm-up, the order reversed every other round.  A ratio
-- and an added time per request are taken inside one round (paired); the
-- rows report the medians.  Every server checks each response's context
-- against its own request; a mismatch fails the row.  Each figure is also
-- taken from the server's CPU time per request (/proc/<pid>/stat), which
-- moves less when other work shares the machine.
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

-- clock ticks per second of /proc/<pid>/stat
local HZ = 100
do
  local p = io.popen("getconf CLK_TCK 2>/dev/null")
  HZ = tonumber(p:read("a")) or HZ
  p:close()
end

-- the servers: {name, language, context, the row it is paired in}
local LUA_CTX = { "none", "asynclocal", "counting", "hooks" }
local NODE_CTX = { "none", "als", "counting", "hooks" }
-- the rows: the tracked server over the untracked one, Lua and Node
local PAIRS = {
  { key = "als", lua = "lua asynclocal", node = "node als", what = "AsyncLocal" },
  { key = "counting", lua = "lua counting", node = "node counting", what = "AsyncLocal + 4 counting hooks" },
  { key = "hooks", lua = "lua hooks", node = "node hooks", what = "4 empty hooks" },
  { key = "passthrough", lua = "lua passthrough", what = "no library: the physical pieces under a bare interposer" },
}

function M.run()
  if not have("wrk") then error("wrk is not installed (apt-get install wrk)", 0) end
  local pinned = have("taskset")
  local spin = pinned and "taskset -c 0 " or ""
  local cpin = pinned and "taskset -c 1 " or ""
  local configs = {}
  for _, ctx in ipairs(LUA_CTX) do
    configs[#configs + 1] = { name = "lua " .. ctx, ctx = ctx,
      cmd = ("%s bench/http_server.lua coroutines %s %d"):format(U.LUA, ctx, TIMER_MS) }
  end
  local hi = require("http_instr")
  if hi.build("passthrough") then -- the floor of any interposer (no target)
    configs[#configs + 1] = { name = "lua passthrough", ctx = "passthrough",
      cmd = ("env LUA_CPATH=\"%s/?.so;$LUA_CPATH\" %s bench/http_server.lua coroutines passthrough %d")
        :format(hi.BUILD, U.LUA, TIMER_MS) }
  end
  local node = have("node")
  if node then
    for _, ctx in ipairs(NODE_CTX) do
      configs[#configs + 1] = { name = "node " .. ctx, ctx = ctx,
        cmd = ("node bench/node_server.js %s %d"):format(ctx, TIMER_MS) }
    end
  end
  local by = {}
  for _, c in ipairs(configs) do by[c.name] = c; c.ratios, c.cpu, c.us, c.cpu_us = {}, {}, {}, {} end
  U.header(("HTTP: coroutine per request (set, 0 ms timer, fs open/read/close, get), wrk -t1 -c%d,"
    .. " %d rounds of %d s, %s"):format(CONNS, ROUNDS, SECONDS,
      pinned and "servers on CPU 0, wrk on CPU 1" or "NOT pinned (no taskset)"))
  local ok, err = pcall(function()
    for _, c in ipairs(configs) do start(c, spin) end
    for _, c in ipairs(configs) do load(c, 1, cpin) end -- warm-up (Node's JIT, the library's tables)
    local head = { "round" }
    for _, c in ipairs(configs) do head[#head + 1] = c.name end
    for _, p in ipairs(PAIRS) do
      if by[p.lua] then head[#head + 1] = p.lua .. "/none" end
      if node and p.node then head[#head + 1] = p.node .. "/none" end
    end
    print("| " .. table.concat(head, " | ") .. " |")
    print("|" .. ("---|"):rep(#head))
    for r = 1, ROUNDS do
      local rps, cpu = {}, {}
      for i = 1, #configs do
        local c = configs[r % 2 == 1 and i or #configs + 1 - i]
        rps[c.name], cpu[c.name] = load(c, SECONDS, cpin)
      end
      local function pair(a, b)
        local x = rps[b] > 0 and rps[a] / rps[b] or 0
        table.insert(by[a].ratios, x)
        if rps[a] > 0 and rps[b] > 0 then table.insert(by[a].us, 1e6 / rps[a] - 1e6 / rps[b]) end
        -- the same from the server's CPU time per request: less sensitive
        -- to what else runs on the machine (ticks per 1000 requests)
        local y = cpu[a] and cpu[b] and cpu[a] > 0 and cpu[b] / cpu[a]
        if y then
          table.insert(by[a].cpu, y)
          table.insert(by[a].cpu_us, (cpu[a] - cpu[b]) * 1000 / HZ)
        end
        return ("%.3f%s"):format(x, y and (" (cpu %.3f)"):format(y) or "")
      end
      local cells = { tostring(r) }
      for _, c in ipairs(configs) do cells[#cells + 1] = ("%.0f"):format(rps[c.name]) end
      for _, p in ipairs(PAIRS) do
        if by[p.lua] then cells[#cells + 1] = pair(p.lua, "lua none") end
        if node and p.node then cells[#cells + 1] = pair(p.node, "node none") end
      end
      print("| " .. table.concat(cells, " | ") .. " |")
    end
  end)
  for _, c in ipairs(configs) do stop(c) end
  if not ok then error(err, 0) end
  for _, c in ipairs(configs) do
    if c.errors then print(("  (%s: wrk reported %s)"):format(c.name, c.errors)) end
    if c.mismatches ~= 0 then
      print(("  (%s: %s responses with a wrong context)"):format(c.name,
        c.mismatches < 0 and "no statistics, unknown" or tostring(c.mismatches)))
    end
    if c.ctx == "counting" and not (c.stats or ""):match("events=[1-9]") then
      print(("  (%s: its hooks counted no event)"):format(c.name))
      c.mismatches = c.mismatches ~= 0 and c.mismatches or -1
    end
  end
  local function med(name, field)
    local c = by[name]
    return c and #c[field] > 0 and median(c[field]) or nil
  end
  -- the figures of one server: ratio, CPU ratio, added µs, added CPU µs
  local function fig(name)
    return { r = med(name, "ratios"), c = med(name, "cpu"), us = med(name, "us"), cus = med(name, "cpu_us") }
  end
  local function cell(f)
    if not f.r then return "not measured" end
    return ("%.3fx%s, %+.2f µs%s"):format(f.r, f.c and (" (cpu %.3fx)"):format(f.c) or "", f.us or 0,
      f.cus and (" (cpu %+.2f µs)"):format(f.cus) or "")
  end
  print("  medians of the paired figures (tracked / none; added time per request over none):")
  local figs = {}
  for _, p in ipairs(PAIRS) do
    figs[p.key] = { lua = fig(p.lua), node = node and p.node and fig(p.node) or {} }
    if p.node then
      print(("  - %s: Lua %s; Node %s"):format(p.what, cell(figs[p.key].lua), cell(figs[p.key].node)))
    else
      print(("  - %s: Lua %s"):format(p.what, cell(figs[p.key].lua)))
    end
  end
  -- how precise the paired ratios are: their geometric mean and its
  -- standard error over the rounds
  do
    local notes = {}
    for _, p in ipairs(PAIRS) do
      for _, name in ipairs { p.lua, p.node } do
        local g, se = geo_se(by[name] and by[name].ratios or {})
        if g then notes[#notes + 1] = ("%s %.3f +- %.1f %%"):format(name, g, se * 100) end
      end
    end
    if #notes > 0 then
      print("  geometric means of the paired ratios +- their standard error: " .. table.concat(notes, ", "))
    end
  end
  local clean = function(name) return by[name].mismatches == 0 end
  -- a bound counts as met when the throughput figure meets it and so does
  -- the CPU-time figure (where /proc gave one): on a shared machine the
  -- throughput alone can pass by luck
  local function at_least(f, bound, cbound)
    return f.r >= bound and (not (f.c and cbound) or f.c >= cbound)
  end
  local function us_below(f, n)
    if not n.us then return true end
    return f.us <= n.us and (not (f.cus and n.cus) or f.cus <= n.cus)
  end
  local a, ca, h = figs.als, figs.counting, figs.hooks
  local als_half1 = at_least(a.lua, 0.95, 0.95)
  local als_half2 = not node or at_least(a.lua, a.node.r, a.node.c)
  local als_half3 = us_below(a.lua, a.node)
  local function word(x) return x and "met" or "missed" end
  return {
    { path = "HTTP, coroutine per request (set, 0 ms timer, fs open/read/close, get), AsyncLocal vs no tracking",
      value = ("%s; Node ALS %s"):format(cell(a.lua), cell(a.node)),
      target = (">= 0.95x (%s), >= Node's ratio (%s), added µs <= Node's (%s)"):format(word(als_half1),
        word(als_half2), word(als_half3)),
      ok = als_half1 and als_half2 and als_half3 and clean("lua asynclocal") },
    { path = "same, AsyncLocal + 4 counting hooks vs no tracking",
      value = ("%s; Node ALS + counting hooks %s"):format(cell(ca.lua), cell(ca.node)),
      target = "added µs <= Node's", ok = us_below(ca.lua, ca.node) and clean("lua counting") },
    { path = "same, 4 empty hooks vs no tracking",
      value = ("%s; Node hooks %s"):format(cell(h.lua), cell(h.node)),
      target = ">= 0.88x", ok = at_least(h.lua, 0.88, 0.88) and clean("lua hooks") },
  }
end

return M
