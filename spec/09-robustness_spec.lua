-- Bad input at every public entry point, re-entrancy, and GC at awkward
-- moments: a clear error, and the library state intact afterwards.
local uv = require("luv")
local ah = require("async_hooks")
local core = require("async_hooks.core")
local H = require("helpers")
local co = ah.coroutine

local function state_intact()
  assert.equal(1, ah.executionAsyncId())
  assert.equal(0, ah.triggerAsyncId())
  local st = core.stats()
  assert.equal(0, st.active)
  assert.equal(0, st.dispatching)
end

describe("bad input", function()
  after_each(state_intact)

  it("every public function rejects wrong types with a clear error", function()
    local v = ah.AsyncLocal.new()
    local als = ah.AsyncLocalStorage.new()
    local r = ah.AsyncResource.new("X")
    local s = ah.Snapshot.new()
    local cases = {
      { function() ah.AsyncLocal.new("x") end, "table or nil expected, got string" },
      { function() ah.AsyncLocal.new({ name = {} }) end, "opts.name must be a string" },
      { function() v.get() end, "AsyncLocal expected, got no value" },
      { function() v.set(42) end, "AsyncLocal expected, got number" },
      { function() v:run(1) end, "bad argument #2 to 'run' %(function expected, got nil%)" },
      { function() v.run(als, 1, print) end, nil }, -- an AsyncLocalStorage is an AsyncLocal underneath
      { function() v.disable(r) end, "bad self" },
      { function() als:run(1, "not a function") end, "function expected, got string" },
      { function() als:exit(nil) end, "bad argument #1 to 'exit'" },
      { function() als.enterWith(1, 2) end, "AsyncLocalStorage expected, got number" },
      { function() s:run(42) end, "function expected, got number" },
      { function() ah.Snapshot.run(r, print) end, "bad self %(Snapshot expected, got AsyncResource%)" },
      { function() ah.Snapshot.wrap() end, "function expected, got nil" },
      { function() ah.AsyncLocalStorage.bind({}) end, "function expected, got table" },
      { function() ah.createHook("x") end, "table expected, got string" },
      { function() ah.createHook { init = "x" } end, "hook.init must be a function" },
      { function() ah.AsyncResource.new(42) end, "non%-empty string expected, got number" },
      { function() ah.AsyncResource.new("X", math.maxinteger + 1.5) end, "triggerAsyncId must be an integer" },
      { function() ah.AsyncResource.new("X", 2 ^ 63) end, "triggerAsyncId must be an integer" },
      { function() ah.AsyncResource.new("X", -3) end, "integer >= %-1" },
      { function() r:runInAsyncScope() end, "function expected, got nil" },
      { function() r.emitDestroy({}) end, "bad self" },
      { function() ah.AsyncResource.bind(r) end, "function expected, got nil" },
      { function() ah.install("x") end, "table or nil expected" },
      { function() ah.install({ luv = 5 }) end, "luv module in opts.luv expected, got number" },
      { function() co.resume("x") end, "coroutine expected" },
      { function() co.create({}) end, "function expected" },
      { function() co.close(nil) end, "coroutine expected" },
      { function() co.wrap(nil) end, "function expected" },
    }
    for i, c in ipairs(cases) do
      local ok, err = pcall(c[1])
      if c[2] then
        assert.is_false(ok, "case " .. i)
        assert.matches(c[2], tostring(err), nil, false, "case " .. i)
      end
      state_intact()
    end
    assert.is_false(ah.installed())
  end)

  it("huge counts: a trigger id at the integer limits", function()
    local r = ah.AsyncResource.new("X", math.maxinteger)
    assert.equal(math.maxinteger, r:triggerAsyncId())
    assert.equal(r:asyncId(), r:runInAsyncScope(ah.executionAsyncId))
    assert.equal(math.maxinteger, r:runInAsyncScope(ah.triggerAsyncId))
  end)

  it("many locals and many values in one frame", function()
    local locals = {}
    local function nest(i)
      if i > 300 then
        for k = 1, 300 do assert.equal(k, locals[k]:get()) end
        return "deep"
      end
      locals[i] = ah.AsyncLocal.new()
      return locals[i]:run(i, nest, i + 1)
    end
    assert.equal("deep", nest(1))
    for k = 1, 300 do assert.is_nil(locals[k]:get()) end
  end)
end)

describe("re-entrancy", function()
  after_each(state_intact)

  it("hooks that create coroutines, resources and scopes", function()
    local depth, max = 0, 0
    local h = ah.createHook {
      init = function(_, type)
        if type == "outer" then
          depth = depth + 1
          max = math.max(max, depth)
          local r = ah.AsyncResource.new("inner")
          r:runInAsyncScope(function() co.wrap(function() end)() end)
          r:emitDestroy()
          depth = depth - 1
        end
      end,
    }:enable()
    ah.AsyncResource.new("outer")
    ah.AsyncResource.new("outer")
    h:disable()
    assert.equal(1, max)
  end)

  it("a hook enabled and disabled many times inside its own callbacks", function()
    local n = 0
    local h
    h = ah.createHook {
      before = function() n = n + 1; h:disable(); h:enable() end,
    }:enable()
    for _ = 1, 10 do co.wrap(function() end)() end
    h:disable()
    assert.equal(10, n)
  end)

  it("uninstall() while luv callbacks are pending: they still run in their context", function()
    ah.install()
    local v = ah.AsyncLocal.new()
    local got
    local t = uv.new_timer()
    v:run("pending", function()
      t:start(5, 0, function() got = v:get(); t:close() end)
    end)
    ah.uninstall()
    uv.run()
    assert.equal("pending", got)
  end)

  it("install() and uninstall() from inside a luv callback", function()
    ah.install()
    local t = uv.new_timer()
    local inside
    t:start(1, 0, function()
      ah.uninstall()
      ah.install()
      inside = ah.installed()
      t:close()
    end)
    uv.run()
    ah.uninstall()
    assert.is_true(inside)
  end)
end)

describe("GC at awkward moments", function()
  after_each(state_intact)

  it("collections forced inside every hook and callback", function()
    ah.install()
    local v = ah.AsyncLocal.new()
    local counts = { init = 0, before = 0, after = 0, destroy = 0 }
    local h = ah.createHook {
      init = function() counts.init = counts.init + 1; collectgarbage("step") end,
      before = function() counts.before = counts.before + 1; collectgarbage("step") end,
      after = function() counts.after = counts.after + 1; collectgarbage() end,
      destroy = function() counts.destroy = counts.destroy + 1; collectgarbage("step") end,
    }:enable()
    local done = 0
    for i = 1, 30 do
      v:run(i, function()
        local c = co.create(function()
          collectgarbage()
          local t = uv.new_timer()
          t:start(1, 0, function()
            collectgarbage()
            assert.equal(i, v:get())
            done = done + 1
            t:close()
          end)
          co.yield()
          assert.equal(i, v:get())
        end)
        co.resume(c)
        co.resume(c)
      end)
    end
    uv.run()
    h:disable()
    ah.uninstall()
    assert.equal(30, done)
    assert.is_true(counts.before == counts.after)
    assert.is_true(counts.destroy > 0)
  end)

  it("destroy is delivered exactly once even when collection and explicit ends race", function()
    local seen, dup = {}, 0
    local h = ah.createHook {
      destroy = function(id) if seen[id] then dup = dup + 1 end; seen[id] = true end,
    }:enable()
    for _ = 1, 200 do
      local c = co.create(function() co.yield() end)
      co.resume(c)
      if math.random() < 0.5 then co.close(c) end
      local r = ah.AsyncResource.new("R")
      if math.random() < 0.5 then r:emitDestroy() end
    end
    H.gc()
    co.wrap(function() end)()
    H.gc()
    co.wrap(function() end)()
    h:disable()
    assert.equal(0, dup)
  end)
end)
