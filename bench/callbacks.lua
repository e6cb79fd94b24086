--- Node's next-tick depth/breadth benchmark: a chain of callbacks where
-- each schedules the next, and a breadth variant with many registered at
-- once; raw luv vs installed, with a value set, with all hooks enabled.
local U = require("util")
local uv = require("luv")
local ah = require("async_hooks")

local DEPTH = math.floor(1e6 * U.SCALE)
local BREADTH = math.floor(1e5 * U.SCALE)
local v = ah.AsyncLocal.new()
local hook = ah.createHook { init = function() end, before = function() end,
  after = function() end, destroy = function() end }

local function chain(n)
  local t = uv.new_idle()
  local left = n
  local function step()
    left = left - 1
    if left == 0 then t:stop(); t:close() return end
    t:start(step) -- re-register: what a next-tick chain does
  end
  t:start(step)
  uv.run()
end

local function breadth(n)
  local done = 0
  local t = uv.new_timer() -- 0 ms timers all due in the same iteration
  for _ = 1, n do
    local h = uv.new_timer()
    h:start(0, 0, function() done = done + 1; h:close() end)
  end
  t:start(0, 0, function() t:close() end)
  uv.run()
  assert(done == n)
end

local function variant(kind, f)
  return function(n)
    if kind == "raw" then ah.uninstall() else ah.install() end
    if kind == "hooks" then hook:enable() end
    if kind == "value" or kind == "hooks" then v:run(1, f, n) else f(n) end
    hook:disable()
    ah.uninstall()
  end
end

local results = {}
for _, case in ipairs { { "chain (idle re-registered each step)", chain, DEPTH },
                        { "breadth (timers registered at once)", breadth, BREADTH } } do
  U.header(("4. callback queue, %s: %d callbacks (throughput ratio to raw luv)"):format(case[1], case[3]))
  local m = U.compare({
    { "raw", variant("raw", case[2]) },
    { "installed", variant("installed", case[2]) },
    { "value", variant("value", case[2]) },
    { "hooks", variant("hooks", case[2]) },
  }, case[3])
  local function tp(name, key, target)
    local r = m.raw / m[key]
    local verdict = target and ((r >= target) and ("  (target >= %.2f: met)"):format(target)
      or ("  (target >= %.2f: MISSED)"):format(target)) or ""
    print(("  %-44s %9.1f ns/callback  throughput x%.3f%s"):format(name, m[key] / case[3] * 1e9, r, verdict))
    return r
  end
  tp("raw luv", "raw")
  results[#results + 1] = tp("installed, nothing set (untracked)", "installed", 0.95)
  tp("installed, AsyncLocal set (tracked)", "value")
  tp("installed, 4 empty hooks", "hooks")
end
ah.install()
return results
