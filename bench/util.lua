--- Benchmark helpers: warm-up, median of several runs, ratios.
local U = {}

U.RUNS = tonumber(os.getenv("BENCH_RUNS")) or 5
U.SCALE = tonumber(os.getenv("BENCH_SCALE")) or 1

--- The running interpreter (the lowest negative index of `arg`), for the
-- processes the benchmarks start.
-- (BENCH_CASE_LUA: another interpreter for them, e.g. lua5.1 for the
-- pure-Lua backend's rows: `make bench-purelua-instr`)
U.LUA = os.getenv("BENCH_CASE_LUA") or (function()
  local i = 0
  while arg and arg[i - 1] do i = i - 1 end
  return arg and i < 0 and arg[i] or "lua5.4"
end)()

--- Time several variants interleaved (a, b, c, a, b, c, ...) so that machine
-- noise hits them alike; returns medians keyed by name.
-- @param variants list of {name, f}
function U.compare(variants, n)
  local samples = {}
  for _, v in ipairs(variants) do
    v[2](math.max(1, n // 10)) -- warm-up
    samples[v[1]] = {}
  end
  for _ = 1, U.RUNS do
    for _, v in ipairs(variants) do
      collectgarbage("collect")
      local c = os.clock()
      v[2](n)
      table.insert(samples[v[1]], os.clock() - c)
    end
  end
  local med = {}
  for name, s in pairs(samples) do
    table.sort(s)
    med[name] = s[(#s + 1) // 2]
  end
  return med
end

function U.header(title)
  print(("\n## %s"):format(title))
end

--- Print one result line: name, ns/op, ratio against the baseline.
function U.line(name, secs, n, base, target)
  local ns = secs / n * 1e9
  local r = base and secs / base or nil
  local verdict = ""
  if target and r then verdict = (r <= target) and ("  (target <= %.2f: met)"):format(target)
    or ("  (target <= %.2f: MISSED)"):format(target) end
  print(("  %-44s %9.1f ns/op   %s%s"):format(name, ns, r and ("x%.3f"):format(r) or "baseline", verdict))
  return r
end

--- The whole content of a file, or "" when it cannot be read.
function U.read_file(path)
  local f = io.open(path)
  if not f then return "" end
  local s = f:read("a")
  f:close()
  return s
end

--- Resident set size of this process, in KiB (0 where /proc is missing).
function U.rss_kb()
  return tonumber(U.read_file("/proc/self/status"):match("VmRSS:%s*(%d+)")) or 0
end

--- Run `jobs` `width` at a time: `start(job)` for each job of a batch, then
-- `finish(job, started)` for each, in order (what start returned).
function U.in_batches(jobs, width, start, finish)
  for first = 1, #jobs, width do
    local running = {}
    for i = first, math.min(#jobs, first + width - 1) do
      running[#running + 1] = { jobs[i], start(jobs[i]) }
    end
    for _, r in ipairs(running) do finish(r[1], r[2]) end
  end
end

return U
