-- The library on every runtime it supports: these specs are written in
-- Lua 5.1 syntax and run under lua5.4 (the C core), luajit, lua5.1, lua5.2
-- and lua5.3 (the pure-Lua backend: `make test-purelua`).  The same
-- behaviour, names and messages on each; where a runtime cannot do
-- something, the test is pending with the reason (docs/purelua.md).
require("luv") -- on the main thread, before the library
local ah = require("async_hooks")
local H = require("helpers")
local P = require("support.portable")
local AsyncLocal, AsyncLocalStorage, Snapshot, AsyncResource =
  ah.AsyncLocal, ah.AsyncLocalStorage, ah.Snapshot, ah.AsyncResource

describe("on " .. P.RUNTIME .. " (" .. ah.backend .. ")", function()
  local track = H.installed_each()

  describe("the backend", function()
    it("is the C core on Lua 5.4 and the pure-Lua backend elsewhere", function()
      if P.RUNTIME == "Lua 5.4" then
        assert.equal("lua54", ah.backend)
      else
        assert.equal("luv_lua", ah.backend)
      end
      assert.equal("0.1.0", ah._VERSION)
    end)

    it("ids at top level: 1, triggered by 0, one fixed resource", function()
      assert.equal(1, ah.executionAsyncId())
      assert.equal(0, ah.triggerAsyncId())
      assert.equal(ah.executionAsyncResource(), ah.executionAsyncResource())
    end)

    it("install, uninstall and installed; install checks its options", function()
      assert.is_true(ah.installed())
      local create = coroutine.create
      assert.equal(ah.coroutine.create, create)
      ah.uninstall()
      assert.is_false(ah.installed())
      assert.are_not.equal(ah.coroutine.create, coroutine.create)
      assert.equal(ah, ah.install())
      assert.equal(ah.coroutine.create, coroutine.create)
      assert.equal("bad argument #1 to 'install' (unknown option 'bogus'; accepted: debug, luv)",
        H.raised_here(function() ah.install { bogus = 1 } end))
      assert.equal("bad argument #1 to 'install' (luv module in opts.luv expected, got number)",
        H.raised_here(function() ah.install { luv = 5 } end))
      assert.equal(ah, ah.install { debug = false }) -- accepted everywhere
      assert.equal("bad argument #1 to 'install' (luv module in opts.luv expected, got a table without 'new_check')",
        H.raised_here(function() ah.install { luv = {} } end))
    end)
  end)

  describe("AsyncLocal and AsyncLocalStorage", function()
    it("get, set, run: the whole context restored on return and on error", function()
      local v = AsyncLocal.new { name = "v", default = "d" }
      local w = AsyncLocal.new()
      assert.equal("v", v.name)
      assert.equal("d", v:get())
      local r1, r2 = v:run("a", function(x)
        w:set("inside")
        assert.equal("a", v:get())
        return x, v:run(nil, function() return v:get() end)
      end, 7)
      assert.equal(7, r1)
      assert.is_nil(r2) -- an explicit nil shadows the default
      assert.equal("d", v:get())
      assert.is_nil(w:get())
      local boom = {}
      local ok, e = pcall(v.run, v, "b", function() error(boom) end)
      assert.is_false(ok)
      assert.equal(boom, e) -- the same error value
      assert.equal("d", v:get())
    end)

    it("disable forgets every value", function()
      local v = AsyncLocal.new { default = 0 }
      v:set(1)
      v:disable()
      assert.equal(0, v:get())
      v:set(2)
      assert.equal(2, v:get())
      v:disable()
    end)

    it("AsyncLocalStorage: run, getStore, exit, enterWith, bind, snapshot", function()
      local als = AsyncLocalStorage.new { defaultValue = "none" }
      local bound, snap
      als:run({ user = "ada" }, function()
        assert.equal("ada", als:getStore().user)
        assert.is_nil(als:exit(als.getStore, als))
        bound = AsyncLocalStorage.bind(function() return als:getStore().user end)
        snap = AsyncLocalStorage.snapshot()
      end)
      assert.equal("none", als:getStore())
      assert.equal("ada", bound())
      assert.equal("ada", snap(function() return als:getStore().user end))
      als:run("x", function()
        als:enterWith("y")
        assert.equal("y", als:getStore())
      end)
      assert.equal("none", als:getStore())
    end)

    it("errors name the class and point at the caller's line", function()
      local v = AsyncLocal.new()
      local als = AsyncLocalStorage.new()
      assert.equal("bad argument #2 to 'run' (function expected, got nil)",
        H.raised_here(function() v:run(1, nil) end))
      assert.equal("calling 'get' on bad self (AsyncLocal expected, got number)",
        H.raised_here(function() AsyncLocal.get(5) end))
      assert.equal("calling 'run' on bad self (AsyncLocalStorage expected, got number)",
        H.raised_here(function() als.run(5, 1, print) end))
      assert.equal("bad argument #1 to 'new' (unknown option 'x'; accepted: name, default)",
        H.raised_here(function() AsyncLocal.new { x = 1 } end))
    end)
  end)

  describe("Snapshot", function()
    it("captures the context; empty() has every value at its default", function()
      local v = AsyncLocal.new { default = "d" }
      local snap = v:run("inside", Snapshot.new)
      assert.equal("inside", snap:run(v.get, v))
      assert.equal("d", v:get())
      v:run("x", function()
        assert.equal("d", Snapshot.empty():run(v.get, v))
        local wrapped = Snapshot.wrap(function(a) return v:get() .. a end)
        v:set("y")
        assert.equal("x!", wrapped("!"))
      end)
    end)
  end)

  describe("coroutines", function()
    it("capture the creator's frame; a set inside stays inside", function()
      local v = AsyncLocal.new { default = "d" }
      local co
      v:run("creator", function()
        co = coroutine.create(function()
          assert.equal("creator", v:get())
          v:set("mine")
          coroutine.yield(v:get())
          return v:get()
        end)
      end)
      v:set("resumer")
      local ok, got = coroutine.resume(co)
      assert.is_true(ok)
      assert.equal("mine", got)
      assert.equal("resumer", v:get())
      ok, got = coroutine.resume(co)
      assert.is_true(ok)
      assert.equal("mine", got)
      assert.equal("resumer", v:get())
      v:set(nil)
    end)

    it("ids: the coroutine's own, triggered by its creator; its resource has thread", function()
      local outer = ah.executionAsyncId()
      local co
      co = coroutine.create(function()
        local res = ah.executionAsyncResource()
        coroutine.yield(ah.executionAsyncId(), ah.triggerAsyncId(), res.thread == co)
      end)
      local _, id, trig, same = coroutine.resume(co)
      assert.is_true(id > outer)
      assert.equal(outer, trig)
      assert.is_true(same)
      assert.equal(outer, ah.executionAsyncId())
    end)

    it("wrap propagates; a wrapped coroutine's error comes out with its message", function()
      local v = AsyncLocal.new()
      local f = v:run("w", function()
        return coroutine.wrap(function(a)
          local b = coroutine.yield(v:get() .. a)
          return v:get() .. b
        end)
      end)
      assert.equal("w1", f("1"))
      assert.equal("w2", f("2"))
      local g = coroutine.wrap(function() error({ code = 1 }) end)
      local ok, e = pcall(g)
      assert.is_false(ok)
      assert.equal(1, e.code)
      local ok2, e2 = pcall(coroutine.wrap(function() error("plain", 0) end))
      assert.is_false(ok2)
      assert.equal("plain", e2)
    end)

    it("a scope stays open across a yield, invisible to the resumer", function()
      if P.NO_YIELD then pending(P.NO_YIELD); return end
      local v = AsyncLocal.new { default = "d" }
      local co = coroutine.wrap(function()
        v:run("scoped", function()
          coroutine.yield(v:get())
          coroutine.yield(v:get())
        end)
        return v:get()
      end)
      assert.equal("scoped", co())
      assert.equal("d", v:get())
      assert.equal("scoped", co())
      assert.equal("d", co())
    end)

    it("PUC Lua 5.1: a yield inside a scope raises Lua's own error", function()
      if P.yield_across_pcall then
        pending("only PUC Lua 5.1 cannot yield across pcall")
        return
      end
      local v = AsyncLocal.new()
      local co = coroutine.create(function() v:run(1, coroutine.yield) end)
      local ok, e = coroutine.resume(co)
      assert.is_false(ok)
      assert.matches("attempt to yield across", e, 1, true)
    end)

    it("argument errors of create, wrap and resume: the runtime's, named and at the caller's line", function()
      assert.matches("^bad argument #1 to 'create' %(", H.raised_here(function() coroutine.create(5) end))
      assert.matches("^bad argument #1 to 'wrap' %(", H.raised_here(function() coroutine.wrap(5) end))
      assert.matches("^bad argument #1 to 'resume' %(", H.raised_here(function() coroutine.resume(5) end))
    end)

    it("the library's coroutine table works without install()", function()
      ah.uninstall()
      local v = AsyncLocal.new()
      v:set("x")
      local co = ah.coroutine.create(function() return v:get() end)
      assert.same({ true, "x" }, { ah.coroutine.resume(co) })
      local raw = coroutine.create(function() return v:get() end)
      -- a coroutine the library did not make: resumed in the resumer's context
      assert.same({ true, "x" }, { ah.coroutine.resume(raw) })
      v:set(nil)
      ah.install()
    end)

    it("a coroutine made before install(): a library coroutine from its first resume", function()
      ah.uninstall()
      local v = AsyncLocal.new()
      local raw = coroutine.create(function()
        for _ = 1, 2 do
          local seen = v:get()
          v:set("inside")
          coroutine.yield(seen, ah.executionAsyncId(), ah.triggerAsyncId())
        end
      end)
      ah.install()
      local hook, log = H.recorder(ah)
      track(hook):enable()
      v:set("top")
      local _, seen, id, trig = coroutine.resume(raw)
      assert.equal("top", seen) -- the resumer's frame, at the first resume
      assert.equal(1, trig)
      v:set("top2")
      local _, seen2, id2 = coroutine.resume(raw)
      assert.equal("inside", seen2) -- its own from then on
      assert.equal(id, id2)
      coroutine.resume(raw)
      assert.equal("top2", v:get())
      assert.same({ ("init %d coroutine 1"):format(id), "before " .. id, "after " .. id,
        "before " .. id, "after " .. id, "before " .. id, "after " .. id, "destroy " .. id }, log)
      v:set(nil)
    end)
  end)

  describe("memory", function()
    local function collected(make)
      local weak = setmetatable({}, { __mode = "k" })
      make(weak)
      H.gc()
      return next(weak) == nil
    end

    it("abandoned coroutines are collected, suspended or never started, with hooks or without", function()
      local v = AsyncLocal.new()
      v:set("held")
      for _, hooked in ipairs { false, true } do
        local hook
        if hooked then
          hook = track(ah.createHook { init = function(_, _, _, res) return res end, destroy = function() end })
          hook:enable()
        end
        assert.is_true(collected(function(weak)
          for _ = 1, 50 do
            local co = coroutine.create(function() coroutine.yield(ah.executionAsyncResource()) end)
            weak[co] = true
            coroutine.resume(co)
            weak[coroutine.create(function() end)] = true
          end
        end), hooked and "with hooks" or "without hooks")
        if hook then hook:disable() end
      end
      v:set(nil)
    end)

    it("a value is collectable after disable(), also when a suspended coroutine captured it", function()
      local v = AsyncLocal.new()
      local co
      assert.is_true(collected(function(weak)
        local value = {}
        weak[value] = true
        v:run(value, function()
          co = coroutine.create(function() coroutine.yield() end)
          coroutine.resume(co)
        end)
        v:disable()
      end))
      assert.equal("suspended", coroutine.status(co))
    end)

    it("a suspended coroutine that is collected gets its destroy at the next flush", function()
      local destroyed = {}
      track(ah.createHook { destroy = function(id) destroyed[#destroyed + 1] = id end }):enable()
      local id
      do
        local co = coroutine.create(function() coroutine.yield(ah.executionAsyncId()) end)
        local _, got = coroutine.resume(co)
        id = got
      end
      H.gc()
      ah.flush()
      assert.same({ id }, destroyed)
    end)

    it("150 nested scopes (PUC Lua stops near 196: the C-call limit)", function()
      local v = AsyncLocal.new()
      local function nest(n)
        if n == 0 then return v:get() end
        return v:run(n, nest, n - 1)
      end
      assert.equal(1, nest(150))
      assert.is_nil(v:get())
    end)
  end)

  describe("hooks", function()
    local function recorder(filter)
      local hook, log = H.recorder(ah, filter)
      track(hook):enable()
      return log
    end

    it("a coroutine: init, before/after per slice, destroy when it returns", function()
      local log = recorder()
      local top = ah.executionAsyncId()
      local co = coroutine.create(function() coroutine.yield() end)
      coroutine.resume(co)
      coroutine.resume(co)
      local id = top + 0
      for _, line in ipairs(log) do
        local n = line:match("^init (%d+) coroutine")
        if n then id = tonumber(n) end
      end
      assert.same({
        ("init %d coroutine %d"):format(id, top),
        "before " .. id, "after " .. id, "before " .. id, "after " .. id, "destroy " .. id,
      }, log)
    end)

    it("AsyncResource: init at new, before/after around runInAsyncScope, destroy once", function()
      local log = recorder()
      local v = AsyncLocal.new()
      local r = v:run("at new", function() return AsyncResource.new("Job") end)
      local id = r:asyncId()
      assert.equal(ah.executionAsyncId(), r:triggerAsyncId())
      local seen = r:runInAsyncScope(function(a)
        assert.equal(id, ah.executionAsyncId())
        assert.equal(r, ah.executionAsyncResource())
        return v:get() .. a
      end, "!")
      assert.equal("at new!", seen)
      r:emitDestroy()
      r:emitDestroy()
      assert.same({ ("init %d Job 1"):format(id), "before " .. id, "after " .. id, "destroy " .. id }, log)
    end)

    it("emitDestroy inside the resource's own scope: destroy after its after", function()
      local log = recorder()
      local r = AsyncResource.new("Job")
      local id = r:asyncId()
      r:runInAsyncScope(function() r:emitDestroy() end)
      assert.same({ ("init %d Job 1"):format(id), "before " .. id, "after " .. id, "destroy " .. id }, log)
    end)

    it("a scope open across a yield: after at the yield, before again at the resume", function()
      if P.NO_YIELD then pending(P.NO_YIELD); return end
      local r = AsyncResource.new("Job")
      local log = recorder()
      local co = coroutine.create(function()
        r:runInAsyncScope(function() coroutine.yield() end)
      end)
      coroutine.resume(co)
      coroutine.resume(co)
      local cid
      for _, line in ipairs(log) do cid = cid or tonumber(line:match("^init (%d+) coroutine")) end
      local rid = r:asyncId()
      assert.same({
        ("init %d coroutine 1"):format(cid),
        "before " .. cid, "before " .. rid, "after " .. rid, "after " .. cid,
        "before " .. cid, "before " .. rid, "after " .. rid, "after " .. cid, "destroy " .. cid,
      }, log)
    end)

    it("a coroutine's before/after run in its own ids and resource, also with a scope open in it", function()
      if P.NO_YIELD then pending(P.NO_YIELD); return end
      local r = AsyncResource.new("Job")
      local co
      local seen = {}
      track(ah.createHook {
        before = function(id)
          seen[#seen + 1] = ("before %s: %s %s"):format(id == r:asyncId() and "job" or "co",
            tostring(ah.executionAsyncId() == id), tostring(ah.executionAsyncResource().thread == co))
        end,
      }):enable()
      co = coroutine.create(function()
        r:runInAsyncScope(function() coroutine.yield() end)
      end)
      coroutine.resume(co)
      coroutine.resume(co)
      assert.same({ "before co: true true", "before job: true false", "before co: true true",
        "before job: true false" }, seen)
    end)

    it("AsyncResource.bind and the error of a bound function", function()
      local log = recorder()
      local f = AsyncResource.bind(function(x) return x * 2, ah.executionAsyncId() end, "Bound")
      local r, id = f(21)
      assert.equal(42, r)
      assert.equal("init " .. id .. " Bound 1", log[1])
      local g = AsyncResource.bind(function() error("inside", 0) end)
      local ok, e = pcall(g)
      assert.is_false(ok)
      assert.equal("inside", e)
      assert.equal(1, ah.executionAsyncId())
    end)

    it("an error of a hook's own code is fatal: its message on stderr, exit status 1", function()
      local status, out, err = H.run_lua([[
        local ah = require("async_hooks").install()
        ah.createHook { init = function() error("broken hook") end }:enable()
        coroutine.create(function() end)
        print("not reached")
      ]])
      assert.equal(1, status)
      assert.equal("", out)
      assert.matches("^async_hooks: error in init hook %(fatal%): [^\n]*broken hook", err)
    end)

    it("init gets the resource only where a hook can read it (four parameters or `...`)", function()
      if _VERSION == "Lua 5.1" and not rawget(_G, "jit") then
        pending("Lua 5.1's debug.getinfo does not count parameters: every init gets the resource")
        return
      end
      local got = {}
      local three = track(ah.createHook { init = function(_, t, _) got[#got + 1] = t end })
      three:enable()
      local res3
      local h3 = track(ah.createHook { init = function(...) res3 = select(4, ...) end })
      local co = coroutine.create(function() end)
      assert.same({ "coroutine" }, got)
      h3:enable()
      local co2 = coroutine.create(function() end)
      assert.equal(co2, res3.thread)
      h3:disable()
      -- a hook that cannot see it: the resource is made when first asked for
      local inside
      coroutine.resume(co2)
      coroutine.resume(coroutine.create(function() inside = ah.executionAsyncResource() end))
      assert.is_table(inside)
      assert.is_true(coroutine.status(co) == "suspended")
    end)

    it("createHook checks its callbacks; enable and disable are idempotent", function()
      assert.equal("bad argument #1 to 'createHook' (hook.init must be a function, got number)",
        H.raised_here(function() ah.createHook { init = 1 } end))
      local n = 0
      local h = ah.createHook { before = function() n = n + 1 end }
      h:enable():enable()
      AsyncResource.new("X"):runInAsyncScope(function() end)
      h:disable():disable()
      AsyncResource.new("X"):runInAsyncScope(function() end)
      assert.equal(1, n)
    end)

    it("a callable table as a hook and as the function of run", function()
      local seen = {}
      local hook = track(ah.createHook {
        init = setmetatable({}, { __call = function(_, id, t) seen[#seen + 1] = t end }),
      })
      hook:enable()
      AsyncResource.new("Callable")
      assert.same({ "Callable" }, seen)
      local v = AsyncLocal.new()
      local fn = setmetatable({}, { __call = function() return v:get() end })
      assert.equal("t", v:run("t", fn))
    end)

    it("a collected coroutine gets its destroy after other resources' destroys were delivered", function()
      -- (a coroutine run to its end, a resource whose emitDestroy was
      -- called and that is still alive, then collected coroutines: each
      -- destroy once)
      local destroyed = {}
      track(ah.createHook { destroy = function(id) destroyed[#destroyed + 1] = id end }):enable()
      local finished = coroutine.wrap(function() return ah.executionAsyncId() end)()
      local res = AsyncResource.new("Kept")
      res:emitDestroy()
      local ids = {}
      do
        for i = 1, 3 do
          local co = coroutine.create(function() coroutine.yield(ah.executionAsyncId()) end)
          local _, got = coroutine.resume(co)
          ids[i] = got
        end
      end
      H.gc()
      ah.flush()
      -- (each once; other tests' garbage may be destroyed here too)
      local times = {}
      for _, id in ipairs(destroyed) do times[id] = (times[id] or 0) + 1 end
      local want = { finished, res:asyncId(), ids[1], ids[2], ids[3] }
      local got = {}
      for i, id in ipairs(want) do got[i] = times[id] or 0 end
      assert.same({ 1, 1, 1, 1, 1 }, got)
      assert.is_table(res) -- (alive until here)
    end)

    it("flush() delivers what a collected resource queued", function()
      local log = recorder()
      do AsyncResource.new("Lost") end
      H.gc()
      ah.flush()
      local destroyed = false
      for _, line in ipairs(log) do
        if line:match("^destroy ") then destroyed = true end
      end
      assert.is_true(destroyed)
    end)
  end)
end)
