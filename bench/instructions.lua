--- Instruction counts per operation (valgrind --tool=callgrind): exact and
-- repeatable, unlike wall-clock on a shared machine.  Each figure is
-- (instructions at n + 1 - instructions at 1) / n, so start-up cancels out,
-- the median of BENCH_REPEAT such measurements.  Every case runs in its own
-- process (bench/cg_case.lua); BENCH_JOBS (2) processes run at once
-- (callgrind counts do not depend on the load).
local U = require("util")

local M = {}

local JOBS = tonumber(os.getenv("BENCH_JOBS")) or 2
-- BENCH_REPEAT (3): every figure is the median of this many measurements,
-- each in fresh processes (Lua seeds its string hashes per process, which
-- moves single figures a little)
local REPEAT = math.max(1, tonumber(os.getenv("BENCH_REPEAT")) or 3)
-- BENCH_ONLY: a Lua pattern; only rows whose case name matches it
local ONLY = os.getenv("BENCH_ONLY")

--- The rows with their targets: {label, case, variant, baseline case,
-- baseline variant, target}.
M.ROWS = {
  { "luv 0 ms timer chain, value set (every registration tracked) vs raw luv",
    "timer_chain", "value", "timer_chain", "raw", 1.50 },
  { "same chain, installed but nothing set (untracked)", "timer_chain", "installed", "timer_chain", "raw", 1.10 },
  { "same chain, 4 empty hooks enabled", "timer_chain", "hooks", "timer_chain", "raw", 3.50 },
  { "resume/yield round trip, value set vs raw", "switch", "value", "switch", "raw", 1.03 },
  { "create + run to completion vs raw", "lifecycle", "installed", "lifecycle", "raw", 1.25 },
  { "create + run to completion, value set vs raw", "lifecycle", "value", "lifecycle", "raw", 1.40 },
  { "`v:get()` vs a Lua method call returning a field (`obj:m()`, class method)",
    "get", "installed", "method", "installed", 1.15 },
}

--- Further rows without a target, printed for the record.
M.INFO = {
  { "0 ms chain with a new timer per step (a request's sleep(0)), nothing set",
    "timer_new", "installed", "timer_new", "raw" },
  { "0 ms chain with a new timer per step, value set", "timer_new", "value", "timer_new", "raw" },
  { "the timer chain, 4 hooks whose init takes its 4th parameter (the resource: made for it)",
    "timer_chain", "hooks_res", "timer_chain", "raw" },
  { "luv idle chain (re-registered each step), nothing set", "idle_chain", "installed", "idle_chain", "raw" },
  { "luv idle chain, value set", "idle_chain", "value", "idle_chain", "raw" },
  { "luv idle chain, 4 empty hooks", "idle_chain", "hooks", "idle_chain", "raw" },
  { "resume/yield, installed, nothing set", "switch", "installed", "switch", "raw" },
  { "resume/yield, 4 empty hooks", "switch", "hooks", "switch", "raw" },
  { "create + run to completion, 4 empty hooks", "lifecycle", "hooks", "lifecycle", "raw" },
  { "create + run to completion, value set, incremental GC", "lifecycle@inc", "value", "lifecycle@inc", "raw" },
  { "0 ms timer chain, value set, incremental GC", "timer_chain@inc", "value", "timer_chain@inc", "raw" },
  { "one `v:set(i)` in a fresh coroutine, run to completion, vs the coroutine alone",
    "set_fresh", "installed", "lifecycle", "installed" },
  { "`v:set(i)` + `v:get()` in a fresh coroutine, run to completion, vs the coroutine alone",
    "set_get", "installed", "lifecycle", "installed" },
  { "`v:get()` vs `obj:m()` with `m` an own field of `obj`", "get", "installed", "method_own", "installed" },
  { "`v:get()` vs `obj:m()` with `m` a bare C function (rawlen): the floor of a C `get`",
    "get", "installed", "cfloor", "installed" },
  { "`v:run(i, f)` vs `f(i)`", "run", "installed", "call", "installed" },
  { "the HTTP request path without its socket (coroutine, sleep(0), fs read), nothing set",
    "request", "installed", "request", "raw" },
  { "the same, an AsyncLocal set per request (the HTTP AsyncLocal row's work)",
    "request", "value", "request", "raw" },
  { "the HTTP request path without its socket, 4 empty hooks", "request", "hooks", "request", "raw" },
  { "the same, 4 hooks whose init takes its 4th parameter (the resource)", "request", "hooks_res", "request", "raw" },
  -- hook events (diff: the result column shows what the events add per
  -- operation)
  { "one before+after pair, 4 counting hooks (resume/yield vs installed)",
    "switch", "count", "switch", "installed", diff = true },
  { "a destroy with a counting destroy hook (create + run to completion vs installed)",
    "lifecycle", "count_destroy", "lifecycle", "installed", diff = true },
  { "create + run to completion, 4 counting hooks (init, before, after, destroy) vs installed",
    "lifecycle", "count", "lifecycle", "installed", diff = true },
  { "the HTTP request path without its socket, 4 counting hooks and an AsyncLocal vs the AsyncLocal alone",
    "request", "count_value", "request", "value", diff = true },
  { "its parts, value set vs nothing set: the coroutine and set() alone",
    "request_coro", "value", "request_coro", "installed" },
  { "... + sleep(0) on a new timer", "request_sleep", "value", "request_sleep", "installed" },
  { "... + a file read instead", "request_read", "value", "request_read", "installed" },
}

--- Operations per measured run of each case (times BENCH_SCALE).
local SIZE = { timer_chain = 10000, timer_new = 5000, idle_chain = 5000, switch = 50000, lifecycle = 10000,
  set_fresh = 10000, set_get = 10000,
  get = 100000, method = 100000, method_own = 100000, cfloor = 100000, run = 20000, call = 100000,
  request = 2000, request_coro = 2000, request_sleep = 2000, request_read = 2000 }

local function key(case, variant) return case .. "/" .. variant end

-- lua: the interpreter that runs the cases (default U.LUA); env: a
-- prefix of the command (environment settings)
local function command(case, variant, n, lua, env)
  return ("%svalgrind --tool=callgrind --callgrind-out-file=/dev/null %s bench/cg_case.lua %s %s %d 2>&1")
    :format(env or "", lua or U.LUA, case, variant, n)
end

--- Run the listed {case, variant} pairs (two sizes each, REPEAT times),
-- JOBS at a time; returns instructions per operation keyed by
-- "case/variant" (the median of the REPEAT measurements).
local function measure(pairs_, lua, env)
  local jobs = {}
  for rep = 1, REPEAT do
    for _, p in ipairs(pairs_) do
      local n = math.max(1, math.floor(SIZE[p[1]:gsub("@inc$", "")] * U.SCALE))
      jobs[#jobs + 1] = { p = p, n = n, size = n + 1, rep = rep }
      jobs[#jobs + 1] = { p = p, n = n, size = 1, rep = rep }
    end
  end
  local counts = {}
  U.in_batches(jobs, JOBS, function(j) return io.popen(command(j.p[1], j.p[2], j.size, lua, env)) end, function(j, h)
    local out = h:read("a")
    h:close()
    local c = tonumber(out:match("Collected : (%d+)"))
    local detail = out:match("CASE%-OK ([^\n]*)")
    if not (c and detail) then
      error(("case %s %s %d failed:\n%s"):format(j.p[1], j.p[2], j.size, out), 0)
    end
    local k = key(j.p[1], j.p[2])
    counts[k] = counts[k] or { n = j.n, detail = detail, many = {}, one = {} }
    counts[k][j.size == 1 and "one" or "many"][j.rep] = c
  end)
  local per = {}
  for k, c in pairs(counts) do
    local each = {}
    for rep = 1, REPEAT do each[rep] = (c.many[rep] - c.one[rep]) / c.n end
    table.sort(each)
    per[k] = { ins = each[(REPEAT + 1) // 2], detail = c.detail }
  end
  return per
end

--- Measure every row; returns the table rows for bench/run.lua and prints
-- the raw counts.
-- @tparam boolean info also measure the rows without a target
function M.run(info)
  local want, seen = {}, {}
  local lists = info and { M.ROWS, M.INFO } or { M.ROWS }
  local function wanted(row) return not ONLY or row[2]:match(ONLY) end
  for _, list in ipairs(lists) do
    for _, row in ipairs(list) do
      local ps = wanted(row) and { { row[2], row[3] }, { row[4], row[5] } } or {}
      for _, p in ipairs(ps) do
        if not seen[key(p[1], p[2])] then
          seen[key(p[1], p[2])] = true
          want[#want + 1] = p
        end
      end
    end
  end
  local per = measure(want)
  U.header("instructions per operation (callgrind, (count(n+1) - count(1)) / n)")
  print("| path | library | baseline | ratio | target | result |")
  print("|---|---|---|---|---|---|")
  local out = {}
  for _, list in ipairs(lists) do
    for _, row in ipairs(list) do
      local a, b = per[key(row[2], row[3])], per[key(row[4], row[5])]
      if wanted(row) then
        local ratio = a.ins / b.ins
        local target = row[6] and ("<= %.2fx"):format(row[6])
        local ok = row[6] and ratio <= row[6]
        local result = row[6] and (ok and "ok" or "missed") or nil
        if row.diff then result = ("+%.0f per operation"):format(a.ins - b.ins) end
        print(("| %s | %.0f | %.0f | %.3fx | %s | %s |"):format(row[1], a.ins, b.ins, ratio,
          target or "-", result or "-"))
        if row[6] then
          out[#out + 1] = { path = row[1], value = ("%.3fx"):format(ratio), target = target, ok = ok }
        end
      end
    end
  end
  return out
end

--- The other runtimes: the rows of M.ROWS with their cases run by each
-- interpreter of BENCH_PURELUA (default "luajit lua5.1 lua5.2 lua5.3"),
-- with the pure-Lua backend (lua/ as it is), against the raw runtime,
-- next to the C core's ratios measured here too.  LuaJIT's target is 2x
-- the C core's ratio; PUC Lua's figures are stated without one.  An
-- interpreter without luv is skipped, with the reason.
function M.purelua()
  local luas = os.getenv("BENCH_PURELUA") or "luajit lua5.1 lua5.2 lua5.3"
  local env = ("env -u LUA_CPATH -u LUA_PATH_5_2 -u LUA_CPATH_5_2 -u LUA_PATH_5_3 -u LUA_CPATH_5_3"
    .. " LUA_PATH='%s/lua/?.lua;%s/lua/?/init.lua;;' "):format(os.getenv("PWD"), os.getenv("PWD"))
  local want = {}
  for _, row in ipairs(M.ROWS) do
    want[#want + 1] = { row[2], row[3] }
    want[#want + 1] = { row[4], row[5] }
  end
  local core = measure(want)
  local cols, per = {}, {}
  for l in luas:gmatch("%S+") do
    local ok = os.execute(("%s%s -e 'require(\"luv\")' >/dev/null 2>&1"):format(env, l))
    if ok == true or ok == 0 then
      cols[#cols + 1] = l
      -- the C helper of `make purelua-helper` for this runtime's ABI, where
      -- built (ASYNC_HOOKS_LUVCB=0 in the environment: without it)
      local p = io.popen(l .. [[ -e 'io.write((_VERSION:gsub("Lua ", "")))']])
      local abi = p:read("*a")
      p:close()
      local lenv = ("%sLUA_CPATH='%s/build/purelua/%s/?.so;;' "):format(env, os.getenv("PWD"), abi)
      local h = os.execute(("%s%s -e 'assert(require(\"async_hooks.backend.luv_lua\").luvcb)' >/dev/null 2>&1")
        :format(lenv, l))
      print(("  (%s: %s)"):format(l, (h == true or h == 0) and "with the C helper" or "pure Lua, no C helper"))
      per[l] = measure(want, l, lenv)
    else
      print(("  (%s skipped: not installed, or no luv for it)"):format(l))
    end
  end
  U.header("instructions per operation on the other runtimes (the pure-Lua backend vs the raw runtime;"
    .. " callgrind, (count(n+1) - count(1)) / n)")
  local head = { "path" }
  for _, l in ipairs(cols) do head[#head + 1] = l end
  head[#head + 1] = "C core (5.4)"
  head[#head + 1] = "LuaJIT target"
  print("| " .. table.concat(head, " | ") .. " |")
  print("|" .. ("---|"):rep(#head))
  local out = {}
  for _, row in ipairs(M.ROWS) do
    local function ratio(p) return p[key(row[2], row[3])].ins / p[key(row[4], row[5])].ins end
    local c = ratio(core)
    local cells = { row[1] }
    for _, l in ipairs(cols) do
      local p = per[l]
      cells[#cells + 1] = ("%.2fx (%.0f vs %.0f)"):format(ratio(p), p[key(row[2], row[3])].ins,
        p[key(row[4], row[5])].ins)
    end
    cells[#cells + 1] = ("%.2fx"):format(c)
    cells[#cells + 1] = ("<= %.2fx"):format(2 * c)
    print("| " .. table.concat(cells, " | ") .. " |")
    if per.luajit then
      local r = ratio(per.luajit)
      out[#out + 1] = { path = "LuaJIT, pure-Lua backend: " .. row[1], value = ("%.3fx"):format(r),
        target = ("<= %.2fx (2x the C core's %.3fx)"):format(2 * c, c), ok = r <= 2 * c }
    end
  end
  return out
end

return M
