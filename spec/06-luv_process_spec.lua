-- luv processes and signals: the exit callback and signal callbacks run in
-- the context of their registration.
local uv = require("luv") -- on the main thread, before anything else
local ah = require("async_hooks")
local AsyncLocal = ah.AsyncLocal

-- Every test runs the loop until it is empty; handles are closed.
local function run_loop()
  uv.run()
end

local L = require("support.luv")

describe("process and signal callbacks", function()
  before_each(function() ah.install() end)
  after_each(function() ah.uninstall() end)

  it("spawn of `true`: the exit callback keeps the context", function()
    local v = AsyncLocal.new()
    local got
    v:run("child", function()
      local handle
      handle = uv.spawn("true", {}, function(code, signal)
        got = { v:get(), code, signal }
        handle:close()
      end)
      assert.truthy(handle)
    end)
    run_loop()
    assert.same({ "child", 0, 0 }, got)
  end)

  -- review finding: re-arming kept what the first registration was made
  -- by, so a resource made later named the first function
  it("signal_start_oneshot re-arming a signal_start: a resource made later names signal_start_oneshot", function()
    L.fresh([[
      ah.createHook { init = function() end }:enable() -- cannot see resources
      local sig = uv.new_signal()
      sig:start("sigusr1", function() print("the replaced callback ran") end)
      local op, same
      uv.signal_start_oneshot(sig, "sigusr1", function()
        local r = ah.executionAsyncResource()
        op, same = r.op, r.handle == sig and r == ah.executionAsyncResource()
        sig:close()
      end)
      uv.kill(uv.os_getpid(), "sigusr1")
      uv.run()
      uv.run("nowait")
      print(op, same)
    ]], { { "op: signal_start_oneshot", "the handle's, the same on each call: true" } })
  end)
end)
