-- What hooks see of luv callbacks: init (with the luv type), before/after
-- around each callback, destroy when a registration can no longer run;
-- registrations made while nothing observed them stay silent.
local uv = require("luv") -- on the main thread, before anything else
local ah = require("async_hooks")
local H = require("helpers")
local L = require("support.luv")
local AsyncLocal = ah.AsyncLocal

-- Every test runs the loop until it is empty; handles are closed.
local function run_loop()
  uv.run()
end

describe("hooks and luv callbacks", function()
  local track = H.installed_each()

  it("init types, before/after per callback, destroy after one-shot requests", function()
    local events, types = {}, {}
    track(ah.createHook {
      init = function(id, type, trigger, res) types[id] = type; events[#events + 1] = "init " .. type end,
      before = function(id) events[#events + 1] = "before " .. types[id] end,
      after = function(id) events[#events + 1] = "after " .. types[id] end,
      destroy = function(id) if types[id] then events[#events + 1] = "destroy " .. types[id] end end,
    }):enable()
    local t = uv.new_timer()
    t:start(1, 0, function()
      uv.fs_stat("/", function() end)
    end)
    run_loop()
    t:close()
    run_loop()
    local s = table.concat(events, ",")
    assert.matches("init uv_timer,before uv_timer,init uv_fs,after uv_timer", s, 1, true)
    assert.matches("before uv_fs,after uv_fs,destroy uv_fs", s, 1, true)
    assert.matches("destroy uv_timer", s, 1, true)
  end)

  it("a replaced handle callback is destroyed; closing destroys the last one", function()
    local destroyed, inits = {}, {}
    track(ah.createHook {
      init = function(id, type) inits[#inits + 1] = id end,
      destroy = function(id) destroyed[#destroyed + 1] = id end,
    }):enable()
    local t = uv.new_timer()
    t:start(1000, 0, function() end)
    t:start(1000, 0, function() end) -- replaces
    run_loop() -- a timer of 1 s would block: stop it
    t:stop()
    t:close()
    run_loop()
    assert.equal(2, #inits)
    assert.same({ inits[1], inits[2] }, destroyed)
  end)

  it("re-arming a slot from outside its callback destroys the old registration; close the last", function()
    local log = L.recorder(track)
    local t = uv.new_idle()
    local seen = {}
    local v = AsyncLocal.new()
    v:run("a", function() t:start(function() seen[#seen + 1] = v:get() end) end)
    v:run("b", function() t:start(function() seen[#seen + 1] = v:get(); t:stop() end) end)
    run_loop()
    t:close()
    run_loop()
    assert.same({ "b" }, seen)
    local inits, destroys = {}, {}
    for _, e in ipairs(log) do
      if e[1] == "init" and e[3] == "uv_idle" then inits[#inits + 1] = e[2] end
      if e[1] == "destroy" then destroys[#destroys + 1] = e[2] end
    end
    assert.equal(2, #inits)
    assert.same(inits, destroys)
    L.check_order(log)
  end)

  it("a chain re-armed from its own callback: each step its own asyncId, ids balanced", function()
    local log = L.recorder(track)
    local t = uv.new_timer()
    local v = AsyncLocal.new()
    local ids, vals = {}, {}
    local left = 5
    local function step()
      ids[#ids + 1] = ah.executionAsyncId()
      vals[#vals + 1] = v:get()
      left = left - 1
      if left == 0 then t:close() return end
      v:run(left, function() t:start(0, 0, step) end)
    end
    v:run("first", function() t:start(0, 0, step) end)
    run_loop()
    assert.same({ "first", 4, 3, 2, 1 }, vals)
    for i = 2, #ids do assert.is_true(ids[i] > ids[i - 1]) end
    local state = L.check_order(log)
    for _, id in ipairs(ids) do assert.equal("dead", state[id]) end
  end)

  it("queued destroys are delivered on the next loop iteration", function()
    local destroyed = {}
    track(ah.createHook { destroy = function(id) destroyed[id] = true end }):enable()
    local id = ah.AsyncResource.new("gc-me"):asyncId()
    H.gc()
    assert.is_nil(destroyed[id])
    local t = uv.new_timer()
    t:start(1, 0, function() t:close() end)
    run_loop()
    assert.is_true(destroyed[id])
  end)

  it("untracked registrations: a hook enabled later sees no events for them", function()
    H.lua_ok([[
      local uv = require("luv")
      local ah = require("async_hooks").install()
      local t = uv.new_timer()
      local id
      t:start(5, 0, function() id = ah.executionAsyncId(); t:close() end) -- nothing observable
      local events = 0
      ah.createHook {
        before = function() events = events + 1 end,
        after = function() events = events + 1 end,
      }:enable()
      uv.run()
      print(id, events)
      -- registered now, with a hook enabled: tracked
      local t2 = uv.new_timer()
      t2:start(1, 0, function() id = ah.executionAsyncId(); t2:close() end)
      uv.run()
      print(id > 1, events)
    ]], {
      { "untracked, its executionAsyncId: 0", "before/after events: 0" },
      { "tracked, an asyncId of its own: true", "before/after events: 2" },
    })
  end)

  it("hooks enabled after a registration observed by a frame only see its before/after and a request's destroy", function()
    L.fresh([[
      local log, ids = {}, {}
      local t = uv.new_timer()
      v:run("q", function()
        t:start(1, 0, function() ids.timer = ah.executionAsyncId(); t:close() end)
        uv.fs_read(fd, 1, 0, function() ids.read = ah.executionAsyncId() end)
      end)
      ah.createHook {
        before = function(id) log[#log + 1] = "before " .. id end,
        after = function(id) log[#log + 1] = "after " .. id end,
        destroy = function(id) log[#log + 1] = "destroy " .. id end,
      }:enable()
      uv.run()
      local function has(x) for _, e in ipairs(log) do if e == x then return true end end return false end
      print(has("before " .. ids.timer), has("after " .. ids.timer), has("before " .. ids.read),
            has("after " .. ids.read), has("destroy " .. ids.read), core.stats().active)
    ]], { { "timer's before: true", "timer's after: true", "read's before: true", "read's after: true",
      "read's destroy: true", "active scopes: 0" } })
  end)

  it("a before hook that writes a frame does not leave the caller's frame unanchored", function()
    H.lua_ok([[
      local uv = require("luv")
      local ah = require("async_hooks").install()
      local v = ah.AsyncLocal.new { default = "default" }
      local w = ah.AsyncLocal.new()
      ah.createHook { before = function(id) w:run(id, function() end) end }:enable()
      v:set({ "top" }) -- the main thread's frame: held by its anchor only
      local t = uv.new_timer()
      v:run("cb", function() t:start(0, 0, function() print("cb", v:get()); t:close() end) end)
      uv.run()
      collectgarbage()
      collectgarbage()
      local got = v:get()
      print("after", type(got) == "table" and got[1] or got)
    ]], {
      { "cb", "value: cb" },
      { "after", "the main thread's value after the collections: top" },
    })
  end)
end)
