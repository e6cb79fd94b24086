--- The real library behind the differential test's interface (see
-- spec/support/model.lua).  Real asyncIds are mapped to the model's
-- symbolic names through an always-enabled init/destroy recorder hook: both
-- sides create resources in the same order.
local uv = require("luv")
local ah = require("async_hooks")
local R = {}

function R.new(nlocals)
  local m = { events = {}, destroyed = {}, counter = 0 }
  local locals = {}
  for i = 1, nlocals do locals[i] = ah.AsyncLocal.new() end
  local names = { [1] = "top", [0] = "root" }
  local prefix_next
  local recorder = ah.createHook {
    init = function(id)
      m.counter = m.counter + 1
      names[id] = (prefix_next or "?") .. m.counter
    end,
    destroy = function(id) if names[id] then m.destroyed[names[id]] = true end end,
  }:enable()
  local toggled = ah.createHook {
    before = function(id) m.events[#m.events + 1] = "before " .. (names[id] or id) end,
    after = function(id) m.events[#m.events + 1] = "after " .. (names[id] or id) end,
  }
  local co = ah.coroutine

  function m.get(i) return locals[i]:get() end
  function m.set(i, v) locals[i]:set(v) end
  function m.run(i, v, f) return locals[i]:run(v, f) end
  function m.snap() return ah.Snapshot.new() end
  function m.snaprun(s, f) return s:run(f) end
  function m.ar_new() prefix_next = "ar"; return ah.AsyncResource.new("AR") end
  function m.ar_run(ar, f) return ar:runInAsyncScope(f) end
  function m.ar_destroy(ar) ar:emitDestroy() end
  function m.co_new(f) prefix_next = "co"; return co.create(f) end
  function m.co_resume(c)
    if co.status(c) ~= "suspended" then return false end
    return (co.resume(c))
  end
  m.yield = co.yield
  function m.timer(f)
    local t = uv.new_timer()
    prefix_next = "tm"
    t:start(0, 0, function() t:close(); f() end)
  end
  function m.finish() uv.run() end
  function m.hook(on) if on then toggled:enable() else toggled:disable() end end
  function m.exec_id() return names[ah.executionAsyncId()] or ah.executionAsyncId() end
  function m.trigger_id() return names[ah.triggerAsyncId()] or ah.triggerAsyncId() end
  function m.close()
    toggled:disable()
    recorder:disable()
  end
  return m
end

return R
