--- One measured case for bench/instructions.lua: lua5.4 bench/cg_case.lua <case> <variant> <n>
package.path = "bench/?.lua;examples/?.lua;" .. package.path
local case, variant, n = arg[1], arg[2], tonumber(arg[3])
local uv = require("luv")
local ah = require("async_hooks")
local raw = { create = coroutine.create, resume = coroutine.resume, yield = coroutine.yield }
local lib = ah.coroutine
local co = variant == "raw" and raw or lib
local v = ah.AsyncLocal.new()
local function with_value(f, ...)
  if variant == "value" then return v:run(1, f, ...) end
  return f(...)
end
if variant ~= "raw" then ah.install() end
if variant == "hooks" then
  ah.createHook { init = function() end, before = function() end,
    after = function() end, destroy = function() end }:enable()
end

local cases = {}
function cases.switch()
  local c = co.create(function() local y = co.yield; while true do y() end end)
  local resume = co.resume
  for _ = 1, n do resume(c) end
end
function cases.lifecycle()
  local create, resume, f = co.create, co.resume, function(x) return x end
  for i = 1, n do resume(create(f), i) end
end
function cases.get()
  v:set(1)
  if variant == "raw" then
    local t = { x = 1 }
    for _ = 1, n do local _ = t.x end
  else
    for _ = 1, n do v:get() end
  end
end
function cases.run()
  local f = function() end
  if variant == "raw" then
    for i = 1, n do f(i) end
  else
    for i = 1, n do v:run(i, f) end
  end
end
function cases.chain()
  local t = uv.new_idle()
  local left = n
  local function step()
    left = left - 1
    if left <= 0 then t:stop(); t:close() return end
    t:start(step)
  end
  t:start(step)
  uv.run()
end
with_value(cases[case])
