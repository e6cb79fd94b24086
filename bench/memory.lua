--- Memory rows of issue 9, each measured in a fresh process
-- (bench/mem_case.lua) under both collectors: the stand-alone lua5.4 runs
-- the generational one, embedders get the incremental one.
--  * 1e6 coroutine "requests" (create, set a value, yield, finish) with a
--    value set: the peak Lua heap (sampled every 64 requests) against the
--    same loop on raw coroutines with a table per request, and the heap left
--    after a full collection against the heap before (flat).
--  * bytes retained per suspended coroutine, value set, over a raw one.
--  * bytes retained per pending luv callback, tracked, over raw luv.
local U = require("util")

local M = {}

local MODES = { "generational", "incremental" }

local function measure(what, mode, variant, n)
  local cmd = ("%s bench/mem_case.lua %s %s %s %d 2>&1"):format(U.LUA, what, mode, variant, n)
  local p = io.popen(cmd)
  local out = p:read("a")
  p:close()
  local line = out:match("RESULT ([^\n]*)")
  if not line then error(("%s failed:\n%s"):format(cmd, out), 0) end
  local r = {}
  for k, val in line:gmatch("([%w_]+)=([%d%.%-]+)") do r[k] = tonumber(val) end
  return r
end

function M.run()
  local rows = {}
  local N = math.max(1000, math.floor(1e6 * U.SCALE))
  local S = math.max(1000, math.floor(1e5 * U.SCALE))
  local K = math.max(1000, math.floor(2e4 * U.SCALE))
  U.header(("memory (Lua heap from collectgarbage(\"count\"); %d requests, %d suspended coroutines, %d pending timers)")
    :format(N, S, K))
  print("| measurement | collector | raw | library (value set) | |")
  print("|---|---|---|---|---|")
  for _, mode in ipairs(MODES) do
    local raw = measure("churn", mode, "raw", N)
    local lib = measure("churn", mode, "value", N)
    local function fig(r)
      return ("%.0f / %.0f / %.0f, %d / %d, %.0f"):format(r.start, r.peak, r["end"], r.rss_start, r.rss_end, r.ns)
    end
    print(("| %d requests: heap before / peak / after (KiB), RSS before / after (KiB), ns per request"
      .. " | %s | %s | %s | |"):format(N, mode, fig(raw), fig(lib)))
    local ratio = lib.peak / raw.peak
    local grew = lib["end"] - lib.start
    local flat = grew <= 64 + lib.start * 0.05
    rows[#rows + 1] = {
      path = ("%s coroutines created and finished, value set: peak live heap vs raw (%s)"):format(
        N == 1e6 and "1e6" or tostring(N), mode),
      value = ("%.2fx (%.0f vs %.0f KiB), %+.0f KiB after"):format(ratio, lib.peak, raw.peak, grew),
      target = "<= 2x, flat", ok = ratio <= 2 and flat,
    }
  end
  for _, spec in ipairs {
    { "suspended", S, "a suspended coroutine, value set: bytes over a raw one", "+0 B", 0 },
    { "pending", K, "a tracked pending luv callback (value set): bytes over raw luv", "<= 160 B", 160 },
  } do
    local parts, ok = {}, true
    for _, mode in ipairs(MODES) do
      local raw = measure(spec[1], mode, "raw", spec[2]).bytes
      local inst = measure(spec[1], mode, "installed", spec[2]).bytes
      local val = measure(spec[1], mode, "value", spec[2]).bytes
      print(("| bytes per %s object: raw / installed, nothing set / value set | %s | %.1f | %.1f / %.1f | |")
        :format(spec[1], mode, raw, inst, val))
      local over = math.floor(val - raw + 0.5)
      ok = ok and over <= spec[5]
      parts[#parts + 1] = ("%+d B (%s)"):format(over, mode:sub(1, 3))
    end
    rows[#rows + 1] = { path = spec[3], value = table.concat(parts, ", "), target = spec[4], ok = ok }
  end
  return rows
end

return M
