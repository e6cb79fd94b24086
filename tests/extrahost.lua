-- Workload for tests/extrahost.c: coroutines with values, scopes, hooks,
-- many live coroutines (slot growth), collected and closed ones; every
-- thread checks that its host bytes are intact.
-- luacheck: globals host_mode host_check (set by the host)
local ah = require("async_hooks").install()
local stats = require("async_hooks.core").stats
assert(stats().extraspace == not host_mode,
  "extraspace in use: " .. tostring(stats().extraspace))
local v = ah.AsyncLocal.new { default = "d" }
local function check(where)
  assert(host_check(), "host bytes overwritten " .. where)
end

check("at load")
local log = {}
local hook = ah.createHook {
  init = function(id, t) log[#log + 1] = "init " .. t end,
  destroy = function() log[#log + 1] = "destroy" end,
}
hook:enable()
v:set("main")
local live = {}
for i = 1, 300 do
  live[i] = coroutine.create(function(x)
    check("in a coroutine")
    assert(v:get() == "main")
    v:set(x)
    coroutine.yield(v:get())
    check("after a yield")
    return v:run(x + 1, function() return v:get() end)
  end)
end
for i = 1, 300 do
  local ok, got = coroutine.resume(live[i], i)
  assert(ok and got == i, tostring(got))
end
assert(v:get() == "main")
for i = 1, 300, 2 do
  local ok, got = coroutine.resume(live[i])
  assert(ok and got == i + 1, tostring(got))
  assert(coroutine.status(live[i]) == "dead")
  assert(not coroutine.resume(live[i]))
end
for i = 2, 300, 4 do assert(coroutine.close(live[i])) end
live = nil -- luacheck: ignore 311 (dropped for the collector)
-- the abandoned ones: their resources (made for init) refer to them, and
-- are held by deferred anchors for pend_age cycles
for _ = 1, stats().pend_age + 2 do collectgarbage() end
-- wrap, nested coroutines, AsyncResource scopes, ids
local outer = ah.executionAsyncId()
local w = coroutine.wrap(function()
  local inner = coroutine.wrap(function()
    check("in a nested coroutine")
    coroutine.yield(ah.triggerAsyncId())
  end)
  local trig = inner()
  assert(trig == ah.executionAsyncId())
  local r = ah.AsyncResource.new("X")
  r:runInAsyncScope(function()
    check("in a scope")
    assert(ah.executionAsyncId() == r:asyncId())
  end)
  return ah.triggerAsyncId()
end)
assert(w() == outer)
-- a coroutine made behind the library's back
ah.uninstall()
local raw = coroutine.create(function() check("in a raw coroutine"); return v:get() end)
ah.install()
local ok, got = coroutine.resume(raw)
assert(ok and got == "main", tostring(got))
hook:disable()
assert(#log > 300, #log)
assert(stats().slots < 10, "slots still in use: " .. stats().slots)
check("at the end")
print("extrahost workload done, extraspace in use: " .. tostring(stats().extraspace))
