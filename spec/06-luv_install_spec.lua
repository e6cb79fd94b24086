-- install() and uninstall() with luv: what is patched and restored, luv
-- loaded before or after, callbacks registered before install() or pending
-- across uninstall(), repeated cycles.
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

describe("install() and luv", function()
  before_each(function() ah.install() end)
  after_each(function() ah.uninstall() end)

  it("install patches luv; uninstall restores every original function", function()
    ah.uninstall()
    local before = {}
    for k, f in pairs(uv) do before[k] = f end
    local timer_mt = getmetatable(uv.new_timer())
    local tcp_mt = debug.getregistry().uv_tcp
    local tstart, twrite = timer_mt.__index.start, tcp_mt.__index.write
    ah.install()
    assert.is_true(core.luv_attached())
    assert.are_not.equal(before.timer_start, uv.timer_start)
    assert.are_not.equal(before.fs_read, uv.fs_read)
    assert.equal(uv.timer_start, timer_mt.__index.start)
    assert.equal(uv.write, tcp_mt.__index.write)
    assert.equal(before.timer_stop, uv.timer_stop) -- no callback: untouched
    assert.equal(before.try_write, uv.try_write)
    ah.install() -- idempotent
    ah.uninstall()
    assert.is_false(core.luv_attached())
    for k, f in pairs(before) do assert.equal(f, uv[k], k) end
    assert.equal(tstart, timer_mt.__index.start)
    assert.equal(twrite, tcp_mt.__index.write)
    ah.install()
    run_loop()
  end)

  it("covers every callback-taking luv function", function()
    ah.uninstall()
    local orig = {}
    for k, f in pairs(uv) do orig[k] = f end
    ah.install()
    local covered = {}
    for _, name in ipairs(ah.luv_covered) do covered[name] = true end
    local present = 0
    for _, name in ipairs { "timer_start", "idle_start", "prepare_start", "check_start", "new_async",
      "poll_start", "signal_start", "signal_start_oneshot", "fs_event_start", "fs_poll_start", "listen",
      "read_start", "udp_recv_start", "spawn", "close", "tcp_close_reset", "write", "write2", "shutdown",
      "tcp_connect", "pipe_connect", "udp_send", "getaddrinfo", "getnameinfo", "random", "new_work",
      "fs_read", "fs_write", "fs_opendir", "fs_open", "fs_close", "fs_stat", "fs_scandir" } do
      assert.is_true(covered[name], name)
      -- luv 1.44 has every one of these: each is patched by install()
      assert.equal("function", type(orig[name]), name)
      assert.are_not.equal(orig[name], uv[name], name)
      present = present + 1
    end
    assert.equal(33, present)
    -- and only what the loaded luv has (luv 1.44 has no pipe_connect2)
    for _, name in ipairs(ah.luv_covered) do
      assert.equal("function", type(orig[name]), name)
    end
  end)

  it("callbacks registered before install() keep working", function()
    ah.uninstall()
    local v = AsyncLocal.new()
    local fired = 0
    local t = uv.new_timer()
    v:run("old", function()
      t:start(5, 1, function()
        fired = fired + 1
        if fired == 2 then t:close() end
      end)
    end)
    ah.install()
    run_loop()
    assert.equal(2, fired)
  end)

  it("luv required after install() is integrated when it loads", function()
    H.lua_ok([[
      local ah = require("async_hooks").install()
      local uv = require("luv")
      local v = ah.AsyncLocal.new()
      local t = uv.new_timer()
      v:run("late", function() t:start(1, 0, function() print(v:get()); t:close() end) end)
      uv.run()
      ah.uninstall()
      print(package.preload.luv == nil)
    ]], {
      { "value in the callback: late" },
      { "luv's preload entry gone after uninstall(): true" },
    })
  end)
end)

describe("uninstall() with luv callbacks pending", function()
  before_each(function() ah.install() end)
  after_each(function() ah.uninstall() end)

  it("a re-armed registration pending across uninstall() still runs in its context", function()
    local v = AsyncLocal.new()
    local t = uv.new_timer()
    local seen, steps = {}, 0
    local function step()
      steps = steps + 1
      seen[#seen + 1] = v:get()
      if steps == 1 then
        t:start(1, 0, step) -- re-armed: luv gets the record's closure
        ah.uninstall()      -- its callback runs without the library's cb_pcall
      else
        t:close()
      end
    end
    v:run("armed", function() t:start(1, 0, step) end)
    run_loop()
    assert.same({ "armed", "armed" }, seen)
    assert.is_nil(v:get())
    assert.equal(0, core.stats().active)
  end)

  it("uninstall() runs no user code; a later install and uv.run still work", function()
    H.lua_ok([[
      local uv = require("luv")
      local ah = require("async_hooks").install()
      local h = ah.createHook { destroy = function() end }:enable()
      local ran = false
      local t = uv.new_timer()
      t:start(0, 0, function() ran = true; t:close() end)
      uv.sleep(5) -- the timer is due
      ah.uninstall()
      print("after uninstall", ran)
      ah.install()
      ah.uninstall()
      h:disable()
      uv.run()
      print("after run", ran)
      -- exit without running the loop again: luv 1.44 would crash here on a
      -- handle closed since the loop last ran
    ]], {
      { "after uninstall", "the callback ran: false" },
      { "after run", "the callback ran: true" },
    })
  end)

  it("pending across uninstall(), it still runs in its context, with its ids", function()
    L.fresh([[
      local t = uv.new_timer()
      local seen, outer = {}, nil
      v:run("armed", function()
        outer = ah.executionAsyncId()
        t:start(1, 0, function()
          seen.timer = { v:get(), ah.triggerAsyncId() == outer }
          t:close()
        end)
        uv.fs_read(fd, 1, 0, function() seen.read = { v:get(), ah.triggerAsyncId() == outer } end)
      end)
      ah.uninstall() -- luv calls them without the library's cb_pcall
      uv.run()
      print(seen.timer[1], seen.timer[2], seen.read[1], seen.read[2], v:get(), core.stats().active)
    ]], { { "timer's value: armed", "timer triggered by the registering context: true",
      "read's value: armed", "read triggered by the registering context: true",
      "value outside: clean", "active scopes: 0" } })
  end)
end)

-- review findings: every install()/uninstall() cycle made a new
-- set of wrappers (each anchoring its spec for the life of the state), and
-- install() ignored a luv module required again while installed
describe("luv across install cycles and re-required modules", function()
  it("install()/uninstall() cycles keep memory flat", function()
    local out = H.lua_ok([[
      require("luv")
      local ah = require("async_hooks")
      local function mem() collectgarbage(); collectgarbage(); return collectgarbage("count") end
      ah.install(); ah.uninstall()
      local m0 = mem()
      for _ = 1, 300 do ah.install(); ah.uninstall() end
      print(math.floor((mem() - m0) * 1024 / 300))
    ]])
    assert.is_true(tonumber(out) < 64, "bytes per cycle: " .. out) -- was about 15000
  end)

  it("install() patches a luv module required again, and uninstall() restores both", function()
    H.lua_ok([[
      local uv = require("luv")
      local ah = require("async_hooks").install()
      local orig = debug.getregistry().uv_timer.__index.start
      package.loaded.luv = nil
      local uv2 = require("luv")
      assert(uv2 ~= uv)
      ah.install()
      local v = ah.AsyncLocal.new()
      v:set("ctx")
      local got1, got2
      local t1, t2 = uv2.new_timer(), uv2.new_timer()
      uv2.timer_start(t1, 1, 0, function() got1 = v:get(); t1:close() end)
      t2:start(1, 0, function() got2 = v:get(); t2:close() end)
      uv2.run()
      ah.uninstall()
      local raw = debug.getregistry().uv_timer.__index.start
      print(got1, got2, rawget(uv, "timer_start") == rawget(uv2, "timer_start"), raw == rawget(uv2, "timer_start"),
        raw ~= orig)
      uv2.run("nowait")
    ]], { { "value in uv2.timer_start's callback: ctx", "value in t2:start's callback: ctx",
      "uv.timer_start restored as uv2.timer_start: true", "the method restored as uv2.timer_start: true",
      "the method no longer the installed one: true" } })
  end)
end)
