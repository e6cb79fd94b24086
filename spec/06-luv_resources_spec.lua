-- The ids and the resource a luv callback runs with: an asyncId of its own,
-- triggered by the registering context; executionAsyncResource() the
-- registration's resource (op, handle), the same table on every call, also
-- for callbacks nested in another's loop; what a finished callback held is
-- released.
local uv = require("luv") -- on the main thread, before anything else
local ah = require("async_hooks")
local H = require("helpers")
local L = require("support.luv")
local AsyncLocal = ah.AsyncLocal

-- Every test runs the loop until it is empty; handles are closed.
local function run_loop()
  uv.run()
end

describe("luv callbacks", function()
  local track = H.installed_each()

  describe("executionAsyncId() and triggerAsyncId()", function()
    it("a tracked callback has its own asyncId, triggered by the registering context", function()
      local v = AsyncLocal.new()
      local cid, ctrig, outer
      local t = uv.new_timer()
      local c = coroutine.wrap(function()
        outer = ah.executionAsyncId()
        v:run(1, function()
          t:start(1, 0, function() cid, ctrig = ah.executionAsyncId(), ah.triggerAsyncId(); t:close() end)
        end)
      end)
      c()
      run_loop()
      assert.equal(outer, ctrig)
      assert.is_true(cid > outer)
      assert.equal(1, ah.executionAsyncId())
    end)

    it("a registration observed by a frame only: its own asyncId, triggered by the registering context;"
      .. " the loop's ids come back", function()
      L.fresh([[
        local ids, outer = {}, nil
        ah.coroutine.wrap(function()
          v:set(1)
          outer = ah.executionAsyncId()
          local t = uv.new_timer()
          t:start(0, 0, function()
            ids.timer = { ah.executionAsyncId(), ah.triggerAsyncId(), v:get() }
            t:close()
          end)
          uv.fs_read(fd, 1, 0, function()
            ids.read = { ah.executionAsyncId(), ah.triggerAsyncId(), v:get() }
          end)
        end)()
        uv.run()
        print(ids.timer[2] == outer, ids.read[2] == outer, ids.timer[1] > outer, ids.read[1] > outer,
              ids.timer[1] ~= ids.read[1], ids.timer[3], ids.read[3], ah.executionAsyncId(),
              core.stats().active, v:get())
      ]], { { "timer triggered by the registering context: true", "read triggered by the registering context: true",
        "timer's asyncId newer: true", "read's asyncId newer: true", "timer's and read's differ: true",
        "timer's value: 1", "read's value: 1", "executionAsyncId after the loop: 1", "active scopes: 0",
        "value after the loop: clean" } })
    end)

    it("an asyncId taken by a finalizer while a registration is made is not the registration's too", function()
      for _, mode in ipairs { "generational", "incremental" } do
        L.fresh(([[
          collectgarbage(%q)
          local fin, ids = {}, {}
          v:run("x", function()
            for _ = 1, 20000 do
              setmetatable({}, { __gc = function() fin[ah.AsyncResource.new("FIN"):asyncId()] = true end })
              uv.fs_stat(".", function() ids[#ids + 1] = ah.executionAsyncId() end)
            end
          end)
          uv.run()
          local dup, seen = 0, {}
          for _, id in ipairs(ids) do
            if fin[id] or seen[id] then dup = dup + 1 end
            seen[id] = true
          end
          print(#ids, dup)
        ]]):format(mode), { { "callbacks: 20000", "asyncIds taken twice: 0" } }, mode)
      end
    end)
  end)

  describe("executionAsyncResource()", function()
    it("is the init hook's resource, with the handle", function()
      local res = {}
      local ok = true
      track(ah.createHook {
        init = function(id, type, trigger, r) res[id] = r end,
        before = function(id) ok = ok and ah.executionAsyncResource() == res[id] end,
      }):enable()
      local t = uv.new_timer()
      local inside
      t:start(1, 0, function() inside = ah.executionAsyncResource(); t:close() end)
      run_loop()
      assert.is_true(ok)
      assert.equal(t, inside.handle)
    end)

    it("first asked for inside the callback: its own, the same on each call and across a repeating timer's calls",
      function()
      L.fresh([[
        local t = uv.new_timer()
        local seen, req = {}, nil
        v:run(1, function()
          t:start(1, 1, function()
            local r = ah.executionAsyncResource()
            seen[#seen + 1] = r
            assert(r == ah.executionAsyncResource())
            if #seen == 3 then t:close() end
          end)
          uv.fs_read(fd, 1, 0, function() req = ah.executionAsyncResource() end)
        end)
        uv.run()
        print(seen[1] == seen[2], seen[2] == seen[3], seen[1].op, seen[1].handle == t,
              req.op, req ~= seen[1], ah.executionAsyncResource() ~= seen[1])
      ]], { { "1st and 2nd call's the same: true", "2nd and 3rd call's the same: true", "timer's op: timer_start",
        "timer's handle: true", "read's op: fs_read", "read's differs from the timer's: true",
        "outside, another: true" } })
    end)

    -- with an init hook enabled, the resource made for init is the one the
    -- callback gets when it first asks, also after re-arming from it
    it("first asked for in a callback that re-armed its handle: the init hook's, for both", function()
      L.fresh([==[
        local inits, seen = {}, {}
        ah.createHook { init = function(id, type, _, res) inits[id] = res end }:enable()
        local t = uv.new_timer()
        local n = 0
        local function step()
          n = n + 1
          local id = ah.executionAsyncId()
          if n == 1 then
            t:start(0, 0, step) -- re-armed from its own callback, first
            local r1 = ah.executionAsyncResource()
            local r2 = ah.executionAsyncResource()
            seen[1] = { r1 == inits[id], r1 == r2, r1.handle == t, r1.op }
          else
            local r = ah.executionAsyncResource()
            seen[2] = { r == inits[id], r.handle == t }
            t:close()
          end
        end
        t:start(0, 0, step)
        uv.run()
        print(seen[1][1], seen[1][2], seen[1][3], seen[1][4], seen[2][1], seen[2][2])
      ]==], { { "1st is init's: true", "1st the same twice: true", "1st's handle: true", "1st's op: timer_start",
        "2nd is init's: true", "2nd's handle: true" } })
    end)

    -- a loop run inside a callback has callbacks with resources of their
    -- own, and the outer callback's is found again when that loop returns
    it("first asked for in a callback whose loop runs inside another's, and in that other after it", function()
      L.fresh([[
        local t = uv.new_timer()
        local res = {}
        v:run("outer", function()
          uv.fs_read(fd, 3, 0, function()
            v:run("inner", function()
              t:start(0, 0, function()
                res.inner = ah.executionAsyncResource()
                res.inner2 = ah.executionAsyncResource()
                t:close()
              end)
            end)
            uv.run("default") -- inside the read's callback (an argument:
                              -- its callbacks sit at another index)
            res.outer = ah.executionAsyncResource()
            res.outer2 = ah.executionAsyncResource()
          end)
        end)
        uv.run()
        print(res.inner.op, res.inner.handle == t, res.inner == res.inner2,
              res.outer.op, res.outer == res.outer2, res.outer ~= res.inner)
      ]], { { "inner op: timer_start", "inner handle: true", "inner the same twice: true",
        "outer op: fs_read", "outer the same twice: true", "outer differs from inner: true" } })
    end)

    it("keeps its identity in loops the library does not run"
      .. " (after uninstall, uv.run from a coroutine, a uv.run taken before install)", function()
      for _, how in ipairs { "uninstall", "coroutine", "raw" } do
        L.fresh(([[
          local how = %q
          local rawrun = package.loaded["luv.rawrun"]
          local t = uv.new_timer()
          local seen = {}
          v:run(1, function()
            t:start(1, 1, function()
              seen[#seen + 1] = ah.executionAsyncResource()
              if #seen == 3 then t:close() end
            end)
          end)
          if how == "uninstall" then ah.uninstall(); uv.run()
          elseif how == "coroutine" then coroutine.wrap(function() uv.run() end)()
          else rawrun() end
          print(seen[1] == seen[2], seen[2] == seen[3], seen[1].op, seen[1].handle == t)
        ]]):format(how), { { "1st and 2nd call's the same: true", "2nd and 3rd call's the same: true",
          "op: timer_start", "handle: true" } }, how)
      end
    end)

    it("asked for in a re-armed chain step: that step's", function()
      local t = uv.new_timer()
      local v = AsyncLocal.new()
      local res, left = {}, 3
      local function step()
        left = left - 1
        if left > 0 then t:start(0, 0, step) end -- re-armed before asking
        res[#res + 1] = ah.executionAsyncResource()
        if left == 0 then t:close() end
      end
      v:run(1, function() t:start(0, 0, step) end)
      run_loop()
      assert.equal(3, #res)
      for i, r in ipairs(res) do
        assert.equal("timer_start", r.op, i)
        assert.equal(t, r.handle, i)
        for j = 1, i - 1 do assert.are_not.equal(res[j], r) end
      end
    end)

    it("a callback re-armed from itself after an init hook was enabled keeps its own resource", function()
      H.lua_ok([[
        local uv = require("luv")
        local ah = require("async_hooks").install()
        local v = ah.AsyncLocal.new()
        local t = uv.new_timer()
        local inits = {}
        v:run("ctx", function()
          t:start(0, 0, function()
            local running = ah.executionAsyncId()
            ah.createHook{init = function(id, _, _, res) inits[id] = res end}:enable()
            t:start(1000, 0, function() end) -- re-armed: a new registration
            local res = ah.executionAsyncResource()
            local newid = next(inits)
            print(running ~= newid, res ~= inits[newid], res == ah.executionAsyncResource(),
                  res.op, res.handle == t, inits[newid].handle == t, v:get())
            t:close()
          end)
        end)
        uv.run()
      ]], { { "the re-arm a new asyncId: true", "the running one not the re-arm's: true", "the same twice: true",
        "op: timer_start", "handle: true", "the re-arm's handle: true", "value: ctx" } })
    end)

    -- in a fresh process: before the first executionAsyncResource() call
    -- (the specs before this one made it), a callback without a hook that
    -- sees resources gets its resource only when it asks
    local nested = [[
      local uv = require("luv")
      local ah = require("async_hooks").install()
      local v = ah.AsyncLocal.new()
      local a, b = uv.new_timer(), uv.new_timer()
      local h = ah.createHook{init = function() end}:enable()
      a:start(0, 0, function() -- has a resource (an init hook was on)
        uv.run("nowait") -- b fires here
        local ra = ah.executionAsyncResource()
        print("a", ra.op, ra.handle == a)
        a:close()
      end)
      h:disable()
      %s
      uv.run()
    ]]

    it("a nested tracked callback without a resource does not see the outer callback's", function()
      H.lua_ok(nested:format([[
        v:run("x", function()
          b:start(0, 0, function()
            local rb = ah.executionAsyncResource()
            print("b", v:get(), rb.op, rb.handle == b, rb.handle == a)
            b:close()
          end)
        end)]]), {
        { "b", "value: x", "op: timer_start", "b's handle: true", "a's handle: false" },
        { "a", "op: timer_start", "a's handle: true" },
      })
    end)

    it("a nested untracked callback does not see the outer callback's resource", function()
      H.lua_ok(nested:format([[
        b:start(0, 0, function()
          local rb = ah.executionAsyncResource()
          print("b", type(rb), type(rb) == "table" and rb.handle == a)
          b:close()
        end)]]), {
        { "b", "type: table", "a's handle: false" },
        { "a", "op: timer_start", "a's handle: true" },
      })
    end)
  end)

  describe("what a finished callback held", function()
    it("its callback and value are let go once it ended (both collectors)", function()
      for _, mode in ipairs { "generational", "incremental" } do
        L.fresh(([[
          collectgarbage("%s")
          local weak = setmetatable({}, { __mode = "k" })
          local done = 0
          do
            local a, b = {}, {}
            weak[a], weak[b] = true, true
            v:run(a, function()
              local t = uv.new_timer()
              t:start(0, 0, function() done = done + 1; t:close() end)
            end)
            v:run(b, function() uv.fs_read(fd, 1, 0, function() done = done + 1 end) end)
          end
          uv.run()
          collectgarbage("collect"); collectgarbage("collect")
          print(done, next(weak))
        ]]):format(mode), { { "callbacks run: 2", "values left: nil" } }, mode)
      end
    end)
  end)
end)
