-- Workload for tests/failalloc.c: every C entry point of the library.
-- AH_FAULTS_LUV=0 leaves luv out: luv itself is not safe against failing
-- allocations (a failure inside uv.new_timer leaves a half-made handle in
-- the loop that uv.run later reads: reproduced without async_hooks), so the
-- luv part makes its handles in setup and leak checking runs without it.
local with_luv = os.getenv("AH_FAULTS_LUV") ~= "0"
-- AH_FAULTS_SEEING=1: the init hook takes its resource (`...`), so
-- resources are made for init (else none is made until asked for)
local seeing = os.getenv("AH_FAULTS_SEEING") == "1"
local uv, ah, core, v, hook, timer, timer2
local T = {}

local function noop() end
local fakeuv = { run = noop }

function T.setup()
  uv = with_luv and require("luv") or fakeuv
  ah = require("async_hooks").install()
  core = require("async_hooks.core")
  if with_luv then
    core.luv_flags(1 + 4) -- a memory error in a callback must not exit
    timer, timer2 = uv.new_timer(), uv.new_timer()
  end
  v = ah.AsyncLocal.new { default = "d" }
  hook = ah.createHook { init = seeing and function(...) return ... end or function() end, before = function() end,
    after = function() end, destroy = function() end }
end

function T.work()
  hook:enable()
  v:set("top")
  local co = coroutine.create(function()
    v:set("co")
    coroutine.yield(v:get())
    return v:run("inner", function() return ah.executionAsyncResource() end)
  end)
  coroutine.resume(co)
  coroutine.resume(co)
  local w = coroutine.wrap(function() coroutine.yield(1) end)
  w()
  local c2 = coroutine.create(function() coroutine.yield() end)
  coroutine.resume(c2)
  coroutine.close(c2)
  local r = ah.AsyncResource.new("F")
  r:runInAsyncScope(function() v:set("scope") return v:get() end)
  r:emitDestroy()
  local snap = ah.Snapshot.new()
  snap:run(function() return v:get() end)
  ah.Snapshot.wrap(function() end)()
  if with_luv then
    v:run("timer", function()
      timer:start(0, 0, function() v:set("cb"); timer:stop() end)
    end)
    uv.run()
  end
  v:disable()
  hook:disable()
  v:set(nil)
end

function T.check()
  hook:disable()
  uv.run() -- let anything pending finish
  local st = core.stats()
  assert(st.active == 0, "active " .. st.active .. " dispatching " .. st.dispatching .. " queued " .. st.queued_destroys)
  assert(core.stats().dispatching == 0, "dispatching")
  local w = ah.AsyncLocal.new()
  assert(w:run(42, function() return w:get() end) == 42)
  assert(w:get() == nil)
  local co = coroutine.wrap(function() return w:get() end)
  w:run(7, function() assert(co() == nil) end)
  if with_luv then
    local got
    w:run("ok", function() timer2:start(0, 0, function() got = w:get(); timer2:stop() end) end)
    uv.run()
    assert(got == "ok", "luv propagation after the fault: " .. tostring(got))
    timer:close()
    timer2:close()
    uv.run()
  end
  ah.uninstall()
  uv.run()
end

return T
