--- Instructions per HTTP request (callgrind), on the benchmark request
-- shape (bench/http_server.lua coroutines <ctx> 0 <count>: a coroutine per
-- request, one `set`, a 0 ms timer, fs_open -> fs_read -> fs_close, one
-- `get`, the answer).  bench/http_client.lua sends an exact number of
-- requests over BENCH_HTTPI_CONNS (50) keep-alive connections; the server
-- stops after that many.  Each figure is
-- (count(N2) - count(N1)) / (N2 - N1), so start-up, connection set-up and
-- shutdown cancel, the median of BENCH_REPEAT measurements, each in fresh
-- processes.  User space only (callgrind): the kernel's TCP and epoll work,
-- which tracking does not change, is not in these counts.
-- Configurations: none (no library), asynclocal, counting (the AsyncLocal
-- and four hooks that count events), and pieces: a pure-Lua stand-in
-- without the library for what no implementation can avoid on this shape
-- (a new weak frame per `set`, kept for the request's life, with its GC,
-- and the two calls), so the distance to the real floor is printed.
local U = require("util")

local M = {}

local N1 = math.max(1, math.floor((tonumber(os.getenv("BENCH_HTTPI_N1")) or 1000) * U.SCALE))
local N2 = math.max(N1 + 1, math.floor((tonumber(os.getenv("BENCH_HTTPI_N2")) or 5000) * U.SCALE))
-- connections: how many requests are in flight changes what the collector
-- finds alive at each cycle
local CONNS = tonumber(os.getenv("BENCH_HTTPI_CONNS")) or 50
local JOBS = tonumber(os.getenv("BENCH_JOBS")) or 2
local REPEAT = math.max(1, tonumber(os.getenv("BENCH_REPEAT")) or 3)

--- The targets (instructions added per request).
M.TARGET_ALS = 6500 -- an AsyncLocal over no library
M.TARGET_HOOKS = 9000 -- four counting hooks over the AsyncLocal

local read_file = U.read_file

--- where the bench's own C helpers are built
M.BUILD = "build/bench"

--- build bench/<name>.c into M.BUILD; false without a compiler or headers
function M.build(name)
  return os.execute(("mkdir -p %s && gcc -std=c99 -O2 -shared -fPIC $(./.ci/lua-flags --cflags) bench/%s.c -o %s/%s.so 2>/dev/null")
    :format(M.BUILD, name, M.BUILD, name))
end

--- start one callgrind run of the server for `count` requests; returns a
-- job to finish with `finish`
local function start(ctx, count)
  local j = { ctx = ctx, count = count, out = os.tmpname() }
  local env = ctx == "passthrough" and ("LUA_CPATH='%s/?.so;'\"$LUA_CPATH\" "):format(M.BUILD) or ""
  os.execute(("%svalgrind --tool=callgrind --callgrind-out-file=/dev/null %s bench/http_server.lua coroutines %s 0 %d"
    .. " > %s 2>&1 &"):format(env, U.LUA, ctx, count, j.out))
  return j
end

--- wait for the server's port, send its requests, read its count
local function finish(j)
  local port
  for _ = 1, 1200 do
    port = read_file(j.out):match("PORT (%d+)")
    if port then break end
    os.execute("sleep 0.05")
  end
  local client = ""
  if port then
    local p = io.popen(("%s bench/http_client.lua %s %d %d 2>&1"):format(U.LUA, port, j.count, CONNS))
    client = p:read("a")
    p:close()
  end
  local s
  for _ = 1, 1200 do
    s = read_file(j.out)
    if s:match("Collected : %d+") then break end
    os.execute("sleep 0.05")
  end
  os.remove(j.out)
  local ins, served = tonumber(s:match("Collected : (%d+)")), tonumber(s:match("served=(%d+)"))
  local mism, events = tonumber(s:match("mismatches=(%d+)")), tonumber(s:match("events=(%d+)"))
  if not (port and ins and served == j.count and client:match("DONE " .. j.count)) then
    error(("server %s under callgrind failed:\n%s\n%s"):format(j.ctx, s, client), 0)
  end
  if mism ~= 0 then error(("server %s: %d responses with a wrong context"):format(j.ctx, mism), 0) end
  return ins, events
end

--- instructions per request of each configuration (the median of REPEAT)
-- and the counting hooks' events per request
function M.measure(ctxs)
  local jobs = {}
  for rep = 1, REPEAT do
    for _, ctx in ipairs(ctxs) do
      jobs[#jobs + 1] = { ctx = ctx, count = N1, rep = rep }
      jobs[#jobs + 1] = { ctx = ctx, count = N2, rep = rep }
    end
  end
  local counts = {}
  U.in_batches(jobs, JOBS, function(spec) return start(spec.ctx, spec.count) end, function(spec, j)
    local ins, events = finish(j)
    local c = counts[spec.ctx] or {}
    counts[spec.ctx] = c
    c[spec.rep] = c[spec.rep] or {}
    c[spec.rep][spec.count] = { ins = ins, events = events }
  end)
  local per = {}
  for ctx, c in pairs(counts) do
    local each = {}
    for rep = 1, REPEAT do each[rep] = (c[rep][N2].ins - c[rep][N1].ins) / (N2 - N1) end
    table.sort(each)
    per[ctx] = { ins = each[(REPEAT + 1) // 2], lo = each[1], hi = each[REPEAT],
      events = (c[1][N2].events - c[1][N1].events) / (N2 - N1) }
  end
  return per
end

--- Instructions per hook event at the least (bench/hookcall.c, no library):
-- one call from C into a Lua function that counts, protected ("each") and
-- bare; nil when the helper cannot be built (no compiler or headers)
function M.hook_call_floor()
  local dir = M.BUILD
  if not M.build("hookcall") then return nil end
  local function count(mode, n)
    local p = io.popen(("LUA_CPATH='%s/?.so' valgrind --tool=callgrind --callgrind-out-file=/dev/null %s bench/hookcall.lua %s %d 2>&1")
      :format(dir, U.LUA, mode, n))
    local out = p:read("a")
    p:close()
    return assert(tonumber(out:match("Collected : (%d+)")), out)
  end
  local per = {}
  for _, mode in ipairs { "each", "bare" } do per[mode] = (count(mode, 11000) - count(mode, 1000)) / 10000 end
  return per
end

local function k(x) return ("%.1fk"):format(x / 1000) end
local function plus(x) return (x >= 0 and "+" or "") .. k(x) end

function M.run()
  U.header(("instructions per HTTP request (callgrind; (count(%d) - count(%d)) / %d requests, %d connections,"
    .. " median of %d)"):format(N2, N1, N2 - N1, CONNS, REPEAT))
  local pt_built = M.build("passthrough")
  local per = M.measure { "none", "asynclocal", "counting", "pieces", pt_built and "passthrough" or nil }
  local none, als, cnt, pcs, pt = per.none, per.asynclocal, per.counting, per.pieces, per.passthrough
  print("| per request | instructions | added | range of the measurements | target |")
  print("|---|---|---|---|---|")
  local function line(name, p, base, target)
    print(("| %s | %s | %s | %s–%s | %s |"):format(name, k(p.ins), base and plus(p.ins - base.ins) or "-",
      k(p.lo), k(p.hi), target or "-"))
  end
  line("no library", none)
  line("an AsyncLocal (over no library)", als, none, ("<= +%s"):format(k(M.TARGET_ALS)))
  line(("the AsyncLocal + four counting hooks (over the AsyncLocal; %.1f events per request)"):format(cnt.events),
    cnt, als, ("<= +%s"):format(k(M.TARGET_HOOKS)))
  line("the physical pieces: a new weak frame per `set` and two calls, in pure Lua (over no library)", pcs, none)
  if pt then
    line("the same pieces under a bare interposer of luv and coroutines (bench/passthrough.c, over no library)", pt, none)
  end
  local added, floor = als.ins - none.ins, pcs.ins - none.ins
  print(("  the AsyncLocal's distance to the physical pieces: %s per request (%.2fx of them)")
    :format(plus(added - floor), added / floor))
  if pt then
    print(("  interposing alone (a closure per registration, a C call around each callback, coroutine.create/wrap"
      .. " through C; no context library): %s; the AsyncLocal's distance to pieces + interposing: %s per request")
      :format(plus(pt.ins - pcs.ins), plus(als.ins - pt.ins)))
  else
    print("  (the bare interposer: not measured, bench/passthrough.c could not be built)")
  end
  local hc = M.hook_call_floor()
  if hc then
    local hooks = cnt.ins - als.ins
    print(("  the hooks' events at the least: %.1f events x %.0f (one protected call from C into a counting"
      .. " function each, no library) = %s; unprotected, x %.0f = %s; the hooks row is %.2fx of the first")
      :format(cnt.events, hc.each, plus(cnt.events * hc.each), hc.bare, plus(cnt.events * hc.bare),
        hooks / (cnt.events * hc.each)))
  else
    print("  (the hooks' events at the least: not measured, bench/hookcall.c could not be built)")
  end
  return {
    { path = "HTTP request (set, timer, fs open/read/close, get), an AsyncLocal: instructions added per request over no library",
      value = plus(added), target = "<= +" .. k(M.TARGET_ALS), ok = added <= M.TARGET_ALS },
    { path = "same, four counting hooks: added over the AsyncLocal",
      value = plus(cnt.ins - als.ins), target = "<= +" .. k(M.TARGET_HOOKS), ok = cnt.ins - als.ins <= M.TARGET_HOOKS },
  }
end

return M
