-- Fault-injection workload (tests/failalloc.c, spec/11): hooks of every
-- kind that allocate and call C functions, around creates, resumes, wraps,
-- closes, scopes (one open across a yield) and resources, so that the
-- failing allocation lands inside hook calls too.  An out-of-memory error
-- there is not the hook's own: it must surface as a catchable error and
-- leave the library as it was: the ids at top level, nothing active, no
-- scope stuck, the value as it was, and later work whose hooks fire
-- balanced and in order.
-- AH_FAULTS_LUV=1 adds luv timers (made in setup: see tests/faults.lua):
-- an error of a callback's hooks is the callback's, which luv reports (told
-- here not to exit); the state must be as consistent.
local with_luv = os.getenv("AH_FAULTS_LUV") == "1"
local uv, ah, core, v, hook, hook2, seen, timer, timer2
local T = {}

function T.setup()
  uv = with_luv and require("luv")
  ah = require("async_hooks").install()
  core = require("async_hooks.core")
  if with_luv then
    core.luv_flags(1 + 4) -- luv: no exit, no message
    timer, timer2 = uv.new_timer(), uv.new_timer()
  end
  v = ah.AsyncLocal.new { default = "d" }
  v:set("base")
  seen = {}
  hook = ah.createHook {
    init = function(id, type_, trigger)
      seen[id] = { ("%s %d<-%d"):format(type_, id, trigger) }
    end,
    before = function(id)
      local s = seen[id]
      if s then s[#s + 1] = "before " .. select("#", id) end
    end,
    after = function(id)
      local s = seen[id]
      if s then s[#s + 1] = ("after %d"):format(id) end
    end,
    destroy = function(id) seen[id] = nil end,
  }
  hook:enable()
  -- a second before/after hook: those kinds go through the list (run_hooks)
  hook2 = ah.createHook {
    before = function(id) local s = seen[id]; if s then s.n = (s.n or 0) + 1 end end,
    after = function(id) local s = seen[id]; if s then s[#s + 1] = tostring(s.n) end end,
  }
  hook2:enable()
end

-- every result checked: an error inside a coroutine surfaces too
local function ok(status, ...)
  if not status then error((...), 0) end
  return ...
end

function T.work()
  v:run("work", function()
    for i = 1, 2 do
      local c = coroutine.create(function(a)
        v:set("co")
        local b = coroutine.yield(a + 1)
        return v:get(), b
      end)
      ok(coroutine.resume(c, i))
      ok(coroutine.resume(c, i))
      local w = coroutine.wrap(function() coroutine.yield(1); return 2 end)
      w()
      w()
      local c2 = coroutine.create(function() coroutine.yield() end)
      ok(coroutine.resume(c2))
      ok(coroutine.close(c2))
      local r = ah.AsyncResource.new("F")
      r:runInAsyncScope(function() v:set("scope"); return v:get() end)
      local c3 = coroutine.create(function()
        r:runInAsyncScope(function() coroutine.yield(); return ah.executionAsyncId() end)
      end)
      ok(coroutine.resume(c3))
      ok(coroutine.resume(c3))
      r:emitDestroy()
      ah.Snapshot.new():run(function() return v:get() end)
      if with_luv then
        timer:start(0, 0, function() v:set("cb"); timer:stop() end)
        uv.run()
      end
    end
  end)
end

-- the events of hooks enabled now, as a list
local function recorder()
  local log = {}
  local function note(ev) return function(id) log[#log + 1] = ev .. " " .. id end end
  local h = ah.createHook { init = note("init"), before = note("before"), after = note("after"),
    destroy = note("destroy") }
  return h, log
end

function T.check()
  collectgarbage()
  collectgarbage()
  core.flush() -- destroys of what the failed run left to the collector
  assert(ah.executionAsyncId() == 1, "executionAsyncId " .. ah.executionAsyncId())
  assert(ah.triggerAsyncId() == 0, "triggerAsyncId " .. ah.triggerAsyncId())
  assert(v:get() == "base", "value " .. tostring(v:get()))
  local st = core.stats()
  assert(st.active == 0, "active " .. st.active)
  assert(st.dispatching == 0, "dispatching " .. st.dispatching)
  assert(st.queued_destroys == 0, "queued " .. st.queued_destroys)
  -- later work: the allocating hook still enabled, and a recorder
  local h, log = recorder()
  h:enable()
  local c = coroutine.create(function()
    v:set("in")
    coroutine.yield(ah.executionAsyncId())
    return v:get()
  end)
  local _, cid = coroutine.resume(c)
  local _, got = coroutine.resume(c)
  assert(got == "in", "coroutine value " .. tostring(got))
  local r = ah.AsyncResource.new("R", { requireManualDestroy = true })
  local rid = r:asyncId()
  local sc = coroutine.create(function()
    return r:runInAsyncScope(function() coroutine.yield(); return ah.executionAsyncId() end)
  end)
  local sid = ah.executionAsyncId() -- (sc's id is the next after rid)
  coroutine.resume(sc)
  local _, inner = coroutine.resume(sc)
  assert(inner == rid, "scope id " .. tostring(inner))
  r:emitDestroy()
  h:disable()
  assert(sid == 1)
  local scid = rid + 1
  local want = {
    "init " .. cid, "before " .. cid, "after " .. cid, "before " .. cid, "after " .. cid, "destroy " .. cid,
    "init " .. rid, "init " .. scid,
    "before " .. scid, "before " .. rid, "after " .. rid, "after " .. scid,
    "before " .. scid, "before " .. rid, "after " .. rid, "after " .. scid, "destroy " .. scid,
    "destroy " .. rid,
  }
  assert(table.concat(log, ",") == table.concat(want, ","), "events: " .. table.concat(log, ","))
  assert(v:get() == "base" and ah.executionAsyncId() == 1, "after the check's work")
  if with_luv then
    uv.run() -- what the failed run left pending
    local seen_cb
    v:run("ok", function() timer2:start(0, 0, function() seen_cb = v:get(); timer2:stop() end) end)
    uv.run()
    assert(seen_cb == "ok", "luv propagation after the fault: " .. tostring(seen_cb))
    assert(ah.executionAsyncId() == 1 and core.stats().active == 0, "after the loop")
    timer:close()
    timer2:close()
    uv.run()
  end
  hook:disable()
  hook2:disable()
  ah.uninstall()
end

return T
