-- Errors and luv: luv's argument errors, and an error raised in a callback,
-- read as they do without the library (message, traceback, exit status);
-- the context is restored after them.
local uv = require("luv") -- on the main thread, before anything else
local ah = require("async_hooks")
local core = require("async_hooks.core")
local H = require("helpers")
local L = require("support.luv")
local AsyncLocal = ah.AsyncLocal

-- Every test runs the loop until it is empty; handles are closed.
local function run_loop()
  uv.run()
end

describe("errors and luv callbacks", function()
  local track = H.installed_each()

  it("luv argument errors read as they do without the library", function()
    local ok, err = pcall(function() uv.new_timer():start(nil) end)
    assert.is_false(ok)
    assert.matches("06%-luv_errors_spec.lua:%d+: bad argument #1 to 'start' %(number expected, got nil%)", err)
    ok, err = pcall(uv.timer_start, nil)
    assert.is_false(ok)
    assert.matches("bad argument #1 to 'luv.timer_start' %(uv_timer expected, got nil%)", err)
    run_loop()
  end)

  it("an error in a callback keeps luv's behaviour: message, traceback, exit status", function()
    local script = [[
      local uv = require("luv")
      %s
      local t = uv.new_timer()
      local v = { run = function(_, _, f) return f() end }
      if package.loaded.async_hooks then v = package.loaded.async_hooks.AsyncLocal.new() end
      v:run(1, function() t:start(1, 0, function() error("boom in callback") end) end)
      uv.run()
    ]]
    local code1, _, err1 = H.run_lua(script:format(""))
    local code2, _, err2 = H.run_lua(script:format('require("async_hooks").install()'))
    assert.equal(code1, code2)
    assert.matches("Uncaught Error: .-boom in callback", err2)
    assert.matches("stack traceback", err2)
    -- the same text, traceback included: the trampoline adds no frame
    local function norm(s) return (s:gsub("/tmp/lua_%w+", "F")) end
    assert.equal(norm(err1), norm(err2))
  end)

  it("an error in a re-armed callback has a first one's traceback (resources asked for meanwhile)", function()
    local function run(record)
      local status, out, err = H.run_lua(L.PRELUDE .. ([[
        core.luv_flags(1) -- luv: no exit, the message kept
        local function inner() error("boom") end
        local function cb() inner() end
        v:run(1, function()
          local t = uv.new_timer()
          if %s then t:start(1, 0, function() end) end -- then a record
          t:start(1, 0, function() t:close(); cb() end)
        end)
        ah.executionAsyncResource() -- from now on a quick record runs as a record
        uv.run()
        print("done")
      ]]):format(tostring(record)))
      return status, out, (err:gsub("/tmp/lua_%w+", "SCRIPT"))
    end
    local s1, o1, e1 = run(false)
    local s2, o2, e2 = run(true)
    assert.equal(0, s1)
    assert.equal("done\n", o1)
    assert.truthy(e1:find("in upvalue 'inner'", 1, true))
    assert.equal(s2, s1)
    assert.equal(o2, o1)
    assert.equal(e2, e1)
  end)

  it("an error in a callback restores the context and emits after", function()
    core.luv_flags(1 + 4) -- luv: no exit, no message
    local v = AsyncLocal.new { default = "clean" }
    local log = {}
    track(ah.createHook {
      before = function(id) log[#log + 1] = "before" end,
      after = function(id) log[#log + 1] = "after" end,
    }):enable()
    local t, t2 = uv.new_timer(), uv.new_timer()
    local later
    v:run("ctx", function()
      t:start(1, 0, function() t:close(); v:set("dirty"); error("callback failed") end)
    end)
    t2:start(20, 0, function() later = v:get(); t2:close() end)
    run_loop()
    core.luv_flags(0)
    assert.equal("clean", later)
    assert.equal("clean", v:get())
    assert.equal(1, ah.executionAsyncId())
    assert.equal(0, core.stats().active)
    -- the failing callback and the later one, each balanced
    assert.same({ "before", "after", "before", "after" }, log)
  end)

  it("an error in a callback observed by a frame only restores the context (a timer and a request)", function()
    L.fresh([[
      core.luv_flags(1 + 4) -- luv: no exit, no message
      local t, t2 = uv.new_timer(), uv.new_timer()
      local later
      v:run("ctx", function()
        t:start(1, 0, function() t:close(); v:set("dirty"); error("timer failed") end)
        uv.fs_read(fd, 1, 0, function() v:set("dirty"); error("read failed") end)
      end)
      t2:start(20, 0, function() later = { v:get(), ah.executionAsyncId() }; t2:close() end)
      uv.run()
      print(later[1], later[2], v:get(), ah.executionAsyncId(), core.stats().active)
    ]], { { "value in a later callback: clean", "its executionAsyncId: 0", "value outside: clean",
      "executionAsyncId outside: 1", "active scopes: 0" } })
  end)

  it("a Lua error in the flush at a callback's exit does not escape luv's loop", function()
    -- on_destroy_hooks' function is told at the flush that ends an inline
    -- callback when an after hook enabled the first destroy hook
    H.lua_ok([[
      local uv = require("luv")
      local ah = require("async_hooks").install()
      local core = require("async_hooks.core")
      local v = ah.AsyncLocal.new()
      local told, raising = {}, true
      core.on_destroy_hooks(function(on)
        told[#told + 1] = on
        if raising then error("raised in on_destroy_hooks") end
      end)
      local dh = ah.createHook{ destroy = function() end }
      local en = ah.createHook{ after = function() dh:enable() end }:enable()
      local t = uv.new_timer()
      v:run("x", function() t:start(0, 0, function() t:stop() end) end)
      print(pcall(uv.run))
      raising = false
      en:disable() -- told again (the failed notice is retried)
      local st = core.stats()
      print(v:get(), ah.executionAsyncId(), st.active, st.dispatching, #told, told[1], told[2])
      t:close()
      uv.run()
      dh:disable()
      print(#told, told[3])
    ]], {
      { "pcall(uv.run): true", "uv.run's result: false" },
      { "value: nil", "executionAsyncId: 1", "active scopes: 0", "dispatching: 0", "notices: 2",
        "1st notice: true", "2nd notice (retried): true" },
      { "notices: 3", "3rd notice: false" },
    })
  end)
end)
