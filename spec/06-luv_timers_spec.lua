-- luv timers, idle, check, prepare and async handles: each callback runs in
-- the context its registration was made in; re-arming a handle replaces
-- that context; uv.walk runs in its caller's.
local uv = require("luv") -- on the main thread, before anything else
local ah = require("async_hooks")
local H = require("helpers")
local AsyncLocal = ah.AsyncLocal

-- Every test runs the loop until it is empty; handles are closed.
local function run_loop()
  uv.run()
end

describe("timer, idle, check, prepare and async callbacks", function()
  local track = H.installed_each()

  it("nested timers under different run values each see their own", function()
    local v = AsyncLocal.new { default = "none" }
    local seen = {}
    for i = 1, 5 do
      v:run("r" .. i, function()
        local t = uv.new_timer()
        t:start(5 * (6 - i), 0, function()
          seen[#seen + 1] = v:get()
          local t2 = uv.new_timer()
          uv.timer_start(t2, 1, 0, function()
            seen[#seen + 1] = v:get() .. "/inner"
            t2:close()
          end)
          t:close()
        end)
      end)
    end
    assert.equal("none", v:get())
    run_loop()
    table.sort(seen)
    assert.same({ "r1", "r1/inner", "r2", "r2/inner", "r3", "r3/inner", "r4", "r4/inner", "r5", "r5/inner" }, seen)
    assert.equal("none", v:get())
  end)

  it("a registration whose trigger is millions of ids back keeps its context and ids", function()
    -- (the ids of a registration are kept packed when they are close; far
    -- apart they take another path, with the same results)
    local core = require("async_hooks.core")
    local v = AsyncLocal.new { default = "none" }
    local seen = {}
    local co = coroutine.create(function()
      v:set("far")
      coroutine.yield(ah.executionAsyncId())
      local t = uv.new_timer()
      t:start(0, 0, function()
        seen.value, seen.id, seen.trigger = v:get(), ah.executionAsyncId(), ah.triggerAsyncId()
        t:close()
      end)
    end)
    local _, coid = coroutine.resume(co)
    local newest
    for _ = 1, (1 << 21) + 16 do newest = core.new_ids() end
    assert.is_true(newest - coid > (1 << 21))
    assert.is_true(coroutine.resume(co))
    run_loop()
    assert.equal("far", seen.value)
    assert.equal(coid, seen.trigger)
    assert.is_true(seen.id > newest)
  end)

  it("a set in one callback is not visible in the next unrelated one", function()
    local v = AsyncLocal.new { default = "clean" }
    local second
    local a, b = uv.new_timer(), uv.new_timer()
    a:start(1, 0, function() v:set("dirty"); a:close() end)
    b:start(20, 0, function() second = v:get(); b:close() end)
    run_loop()
    assert.equal("clean", second)
    assert.equal("clean", v:get())
  end)

  it("callbacks run in the root context when nothing was captured", function()
    -- in a fresh process: nothing has made the library observe anything yet
    H.lua_ok([[
      local uv = require("luv")
      local ah = require("async_hooks").install()
      local v = ah.AsyncLocal.new { default = "d" }
      local t = uv.new_timer()
      t:start(1, 0, function() print(ah.executionAsyncId(), ah.triggerAsyncId(), v:get()); t:close() end)
      v:run("outer", function() uv.run() end) -- uv.run inside a scope
      print(v:get())
    ]], {
      { "executionAsyncId: 0", "triggerAsyncId: 0", "value: d" },
      { "value after uv.run: d" },
    })
  end)

  it("repeating timers and timer:again keep the registration's context", function()
    local v = AsyncLocal.new()
    local seen = {}
    local t = uv.new_timer()
    v:run("rep", function()
      t:start(1, 1, function()
        seen[#seen + 1] = v:get()
        if #seen == 3 then t:stop() end
      end)
    end)
    run_loop()
    assert.same({ "rep", "rep", "rep" }, seen)
    t:set_repeat(1)
    v:run("other", function() t:again() end)
    local n = 0
    local stopper = uv.new_timer()
    stopper:start(10, 0, function() t:close(); stopper:close() end)
    seen = {}
    run_loop()
    assert.is_true(#seen >= 1)
    for _, s in ipairs(seen) do assert.equal("rep", s); n = n + 1 end
  end)

  it("new_async + async_send, idle, check and prepare", function()
    local v = AsyncLocal.new()
    local seen = {}
    local async
    v:run("async", function()
      async = uv.new_async(function(x)
        seen[#seen + 1] = v:get() .. ":" .. tostring(x)
        async:close()
      end)
    end)
    local idle, check, prepare = uv.new_idle(), uv.new_check(), uv.new_prepare()
    v:run("idle", function()
      idle:start(function() seen[#seen + 1] = v:get(); idle:stop(); idle:close() end)
    end)
    v:run("check", function()
      check:start(function() seen[#seen + 1] = v:get(); check:stop(); check:close() end)
    end)
    v:run("prepare", function()
      uv.prepare_start(prepare, function() seen[#seen + 1] = v:get(); prepare:stop(); prepare:close() end)
    end)
    async:send("42")
    run_loop()
    table.sort(seen)
    assert.same({ "async:42", "check", "idle", "prepare" }, seen)
  end)

  it("handles closed inside their own callbacks", function()
    local v = AsyncLocal.new()
    local closes = {}
    for i = 1, 10 do
      v:run(i, function()
        local t = uv.new_timer()
        t:start(1, 1, function()
          t:close(function() closes[#closes + 1] = v:get() end)
        end)
      end)
    end
    run_loop()
    table.sort(closes)
    assert.same({ 1, 2, 3, 4, 5, 6, 7, 8, 9, 10 }, closes)
  end)

  describe("re-armed (started again before or while it fires)", function()
    it("a re-armed slot can be re-armed again, stopped and closed from outside", function()
      local v = AsyncLocal.new()
      local t = uv.new_timer()
      local seen = {}
      v:run("a", function() t:start(1000, 0, function() seen[#seen + 1] = "a" end) end)
      v:run("b", function() t:start(1000, 0, function() seen[#seen + 1] = "b" end) end)
      v:run("c", function() t:start(1, 0, function() seen[#seen + 1] = v:get(); t:close() end) end)
      run_loop()
      assert.same({ "c" }, seen)
    end)

    it("re-arming from coroutines with frames of their own captures each one's", function()
      local v = AsyncLocal.new()
      local t = uv.new_timer()
      local seen = {}
      local co = ah.coroutine
      for _, name in ipairs { "one", "two", "three", "four" } do
        local c = v:run(name, function()
          return co.create(function()
            t:start(name == "four" and 1 or 1000, 0, function() seen[#seen + 1] = v:get(); t:close() end)
          end)
        end)
        assert.is_true(co.resume(c))
      end
      v:run("main", function() end)
      run_loop()
      assert.same({ "four" }, seen)
    end)

    it("a chain re-armed from its callback captures the frame at each re-arm", function()
      local v, w = AsyncLocal.new(), AsyncLocal.new()
      local function chain(inside) -- inside: the loop runs in the registration's frame
        local t = uv.new_timer()
        local seen, left = {}, 5
        local function step()
          left = left - 1
          seen[#seen + 1] = tostring(v:get()) .. "/" .. tostring(w:get())
          if left % 2 == 0 then w:set(left) end -- before the re-arm: the next step's
          if left > 0 then t:start(0, 0, step) else t:close() end
          w:set("after") -- after it: nobody's
        end
        v:run("chain", function()
          t:start(0, 0, step)
          if inside then run_loop() end
        end)
        if not inside then run_loop() end
        assert.same({ "chain/nil", "chain/4", "chain/4", "chain/2", "chain/2" }, seen)
        assert.is_nil(w:get())
        assert.is_nil(v:get())
      end
      chain(false)
      chain(true)
      -- no set at all: every step in the loop's own frame
      local t, n, seen = uv.new_timer(), 0, {}
      local function step()
        n = n + 1
        seen[n] = v:get()
        if n < 3 then t:start(0, 0, step) else t:close() end
      end
      v:run("same", function() t:start(0, 0, step); run_loop() end)
      assert.same({ "same", "same", "same" }, seen)
    end)

    it("a callback keeps its frame when a nested callback re-arms its registration and the collector runs", function()
      -- the frame a callback runs in is held by the dispatch itself, not by
      -- the thread's anchor: here nothing else holds {"a"} once b re-armed a
      H.lua_ok([[
        local uv = require("luv")
        local ah = require("async_hooks").install()
        local v = ah.AsyncLocal.new()
        local a, b = uv.new_timer(), uv.new_timer()
        local step = 0
        local function afn()
          step = step + 1
          if step == 1 then
            uv.run("nowait") -- b fires here and re-arms a in its own context
            collectgarbage()
            collectgarbage()
            print("a", v:get()[1])
          else
            print("a again", v:get()[1])
            a:close()
          end
        end
        v:run({ "a" }, function() a:start(0, 0, afn) end)
        v:run({ "b" }, function()
          b:start(0, 0, function()
            a:start(0, 0, afn)
            b:close()
            collectgarbage()
            print("b", v:get()[1])
          end)
        end)
        uv.run()
        print("top", v:get())
      ]], {
        -- a, re-armed with 0 ms inside the nested run, fires again inside it
        { "b", "value: b" },
        { "a again", "value: b" },
        { "a", "value after the collections: a" },
        { "top", "value: nil" },
      })
    end)
  end)

  describe("uv.walk", function()
    -- uv.walk(fn) calls fn at once, once per handle, through luv's cb_pcall:
    -- a call, not a registration, so fn runs in the caller's context (found
    -- by a review: it ran in the root context)
    it("runs its function in the caller's context, with no hook events", function()
      local v = AsyncLocal.new()
      local events = 0
      local t = uv.new_timer()
      local seen = {}
      v:run("request", function()
        uv.walk(function(h)
          if h == t then seen[#seen + 1] = { ah.executionAsyncId(), v:get() } end
        end)
      end)
      local co_seen
      coroutine.wrap(function()
        v:set("co")
        local id = ah.executionAsyncId()
        uv.walk(function(h) if h == t then co_seen = { id, ah.executionAsyncId(), v:get() } end end)
      end)()
      local tick = uv.new_timer()
      local in_cb
      track(ah.createHook { before = function() events = events + 1 end,
        after = function() events = events + 1 end }):enable()
      v:run("cb", function()
        tick:start(0, 0, function()
          local id = ah.executionAsyncId()
          local before = events
          uv.walk(function(h) if h == t then in_cb = { id, ah.executionAsyncId(), v:get(), events - before } end end)
          tick:close()
        end)
      end)
      t:close()
      run_loop()
      assert.same({ { 1, "request" } }, seen)
      assert.equal(co_seen[1], co_seen[2])
      assert.equal("co", co_seen[3])
      assert.is_true(in_cb[1] > 1)
      assert.same({ in_cb[1], in_cb[1], "cb", 0 }, in_cb)
    end)
  end)
end)
