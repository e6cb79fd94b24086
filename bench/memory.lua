--- The memory rows, each measured in a fresh process
-- (bench/mem_case.lua) under both collectors: the stand-alone lua5.4 runs
-- the generational one, embedders get the incremental one.  Bytes are
-- counted by malloc (bench/memcount.c: the Lua heap plus what luv and the
-- library's C code allocate), the Lua heap alone printed beside them.
--  * 1e6 coroutine "requests" (create, set a value, yield, finish) with a
--    value set: the peak Lua heap (sampled every 64 requests) against the
--    same loop on raw coroutines with a table per request, and the heap left
--    after a full collection against the heap before (flat).
--  * bytes retained per suspended coroutine, value set, over a raw one, and
--  * bytes retained per pending luv callback, tracked, over raw luv: the
--    steady state (the smallest of three, once the library's slot tables
--    have grown; the verdict) and the first measurement in a fresh process
--    (which also pays for that growth; printed beside it).
local U = require("util")

local M = {}

local MODES = { "generational", "incremental" }

--- build bench/memcount.c into a temporary shared object; nil when that
-- is not possible (no gcc, no Lua headers, no mallinfo2)
local function build_memcount()
  local so = os.tmpname()
  local cmd = ("cflags=$(pkg-config --cflags lua5.4 2>/dev/null || pkg-config --cflags lua 2>/dev/null);"
    .. " gcc -std=c99 -O2 -shared -fPIC $cflags bench/memcount.c -o %s 2>&1"):format(so)
  local p = io.popen(cmd)
  local out = p:read("a")
  local ok = p:close()
  if not ok then
    print("  (memcount not built, counting the Lua heap only: " .. out:gsub("\n.*", "") .. ")")
    os.remove(so)
    return nil
  end
  return so
end

local function measure(what, mode, variant, n, so)
  local cmd = ("%s bench/mem_case.lua %s %s %s %d %s 2>&1"):format(U.LUA, what, mode, variant, n, so or "")
  local p = io.popen(cmd)
  local out = p:read("a")
  p:close()
  local line = out:match("RESULT ([^\n]*)")
  if not line then error(("%s failed:\n%s"):format(cmd, out), 0) end
  local r = {}
  for k, val in line:gmatch("([%w_]+)=([%d%.%-]+)") do r[k] = tonumber(val) end
  return r
end

local function rows_for(so)
  local rows = {}
  local N = math.max(1000, math.floor(1e6 * U.SCALE))
  local S = math.max(1000, math.floor(1e5 * U.SCALE))
  local K = math.max(1000, math.floor(2e4 * U.SCALE))
  U.header(("memory: %d requests, %d suspended coroutines, %d pending timers; %s")
    :format(N, S, K, so and "Lua heap and everything malloc holds (memcount)" or "Lua heap only"))
  print("| measurement | collector | raw | library (value set) |")
  print("|---|---|---|---|")
  for _, mode in ipairs(MODES) do
    local raw = measure("churn", mode, "raw", N, so)
    local lib = measure("churn", mode, "value", N, so)
    local function fig(r)
      return ("%.0f / %.0f / %.0f; %.0f / %.0f; %d / %d; %.0f"):format(r.start, r.peak, r["end"],
        r.malloc_start, r.malloc_end, r.rss_start, r.rss_end, r.ns)
    end
    print(("| %d requests: Lua heap before / peak / after; malloc before / after; RSS before / after (KiB);"
      .. " ns per request | %s | %s | %s |"):format(N, mode, fig(raw), fig(lib)))
    local ratio = lib.peak / raw.peak
    local grew, mgrew = lib["end"] - lib.start, lib.malloc_end - lib.malloc_start
    local flat = grew <= 64 + lib.start * 0.05 and mgrew <= 64 + lib.malloc_start * 0.05
    rows[#rows + 1] = {
      path = ("%s coroutines created and finished, value set: peak live heap vs raw (%s)"):format(
        N == 1e6 and "1e6" or tostring(N), mode),
      value = ("%.2fx (%.0f vs %.0f KiB); after: Lua heap %+d KiB, malloc %+d KiB"):format(
        ratio, lib.peak, raw.peak, math.floor(grew + 0.5), math.floor(mgrew + 0.5)),
      target = "<= 2x, flat", ok = ratio <= 2 and flat,
    }
  end
  print("| bytes per object: raw / installed, nothing set / value set | collector | steady | first (tables grow) |"
    .. " steady, Lua heap only |")
  print("|---|---|---|---|---|")
  for _, spec in ipairs {
    { "suspended", S, "a suspended coroutine, value set: bytes over a raw one", "+0 B", 0, "coroutine" },
    { "pending", K, "a tracked pending luv callback (value set): bytes over raw luv", "<= 160 B", 160, "luv callback" },
  } do
    local steady, first, ok = {}, {}, true
    for _, mode in ipairs(MODES) do
      local raw = measure(spec[1], mode, "raw", spec[2], so)
      local inst = measure(spec[1], mode, "installed", spec[2], so)
      local val = measure(spec[1], mode, "value", spec[2], so)
      print(("| %s %s | %s | %.1f / %.1f / %.1f | %.1f / %.1f / %.1f | %.1f / %.1f / %.1f |"):format(
        spec[1], spec[6], mode, raw.bytes, inst.bytes, val.bytes, raw.first, inst.first, val.first,
        raw.lua, inst.lua, val.lua))
      local over = math.floor(val.bytes - raw.bytes + 0.5)
      ok = ok and over <= spec[5]
      steady[#steady + 1] = ("%s %+d B (Lua heap %+d B)"):format(mode:sub(1, 3), over,
        math.floor(val.lua - raw.lua + 0.5))
      first[#first + 1] = ("%+d B"):format(math.floor(val.first - raw.first + 0.5))
    end
    rows[#rows + 1] = { path = spec[3], target = spec[4], ok = ok,
      value = ("%s; in a fresh process, while the tables grow: %s"):format(table.concat(steady, ", "),
        table.concat(first, " / ")) }
  end
  -- programs that drop suspended coroutines, with the hooks a tracer
  -- enables (a 4-parameter init, before/after asking for the resource)
  local A = math.max(1000, math.floor(4e5 * U.SCALE))
  local G = math.max(1000, math.floor(1e5 * U.SCALE))
  local I = math.max(1000, math.floor(2e5 * U.SCALE))
  print("| abandoned coroutines: peak Lua heap, KiB | collector | raw | 4-parameter init | before/after asking for resources |")
  print("|---|---|---|---|---|")
  for _, spec in ipairs {
    { "abandon", A, "coroutines resumed once and dropped" },
    { "generator", G, "coroutine.wrap generators left with break" },
    { "idle", I, "a coroutine dropped in each luv idle callback" },
  } do
    for _, mode in ipairs(MODES) do
      local raw = measure(spec[1], mode, "raw", spec[2], so)
      local libs = { measure(spec[1], mode, "init4", spec[2], so), measure(spec[1], mode, "before_after", spec[2], so) }
      print(("| %d %s | %s | %.0f (after %.0f) | %.0f (after %.0f) | %.0f (after %.0f) |"):format(spec[2], spec[3],
        mode, raw.peak, raw["end"], libs[1].peak, libs[1]["end"], libs[2].peak, libs[2]["end"]))
      for i, hooks in ipairs { "4-parameter init", "before/after asking for resources" } do
        local over = libs[i].peak - raw.peak
        rows[#rows + 1] = {
          path = ("%d %s, value set, %s: peak heap (%s)"):format(spec[2], spec[3], hooks, mode),
          value = ("%+.0f KiB over plain Lua (%.0f vs %.0f KiB)"):format(over, libs[i].peak, raw.peak),
          target = "<= plain + 1 MiB", ok = over <= 1024,
        }
      end
    end
  end
  return rows
end

function M.run()
  local so = build_memcount()
  local ok, rows = pcall(rows_for, so)
  if so then os.remove(so) end
  if not ok then error(rows, 0) end
  return rows
end

return M
