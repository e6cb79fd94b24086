local ah = require("async_hooks")
local H = require("helpers")
local co = ah.coroutine
local AsyncResource = ah.AsyncResource

local function boundary() co.wrap(function() end)() end

describe("ids at top level", function()
  it("executionAsyncId 1, triggerAsyncId 0, one fixed resource table", function()
    assert.equal(1, ah.executionAsyncId())
    assert.equal(0, ah.triggerAsyncId())
    local r = ah.executionAsyncResource()
    assert.is_table(r)
    assert.equal(r, ah.executionAsyncResource())
    assert.is_nil(next(r))
  end)

  it("ids are unique and increasing", function()
    local a = AsyncResource.new("A"):asyncId()
    local b = co.wrap(function() return ah.executionAsyncId() end)()
    local c = AsyncResource.new("C"):asyncId()
    assert.is_true(a > 1 and b > a and c > b)
  end)
end)

describe("AsyncResource", function()
  local track, untrack = H.hook_tracker()
  after_each(untrack)

  -- test-embedder.api.async-resource
  it("validates type and trigger", function()
    assert.error_matches(function() AsyncResource.new() end, "bad argument #1 to 'new' %(non%-empty string expected, got nil%)")
    assert.error_matches(function() AsyncResource.new("") end, "non%-empty string expected")
    assert.error_matches(function() AsyncResource.new("x", -2) end, "triggerAsyncId must be an integer >= %-1")
    assert.error_matches(function() AsyncResource.new("x", 1.5) end, "triggerAsyncId must be an integer")
    assert.error_matches(function() AsyncResource.new("x", { triggerAsyncId = "1" }) end, "triggerAsyncId must be an integer")
    assert.error_matches(function() AsyncResource.new("x", { requireManualDestroy = 1 }) end, "requireManualDestroy must be a boolean")
    assert.error_matches(function() AsyncResource.new("x", true) end, "number, table or nil expected")
    assert.equal(-1, AsyncResource.new("x", -1):triggerAsyncId())
    assert.equal(ah.executionAsyncId(), AsyncResource.new("default_trigger_id"):triggerAsyncId())
  end)

  it("emits init with the resource itself, before/after around runInAsyncScope, destroy once", function()
    local log, res = {}, {}
    track(ah.createHook {
      init = function(id, type, trigger, r) log[#log + 1] = { "init", id, type, trigger }; res[id] = r end,
      before = function(id) log[#log + 1] = { "before", id } end,
      after = function(id) log[#log + 1] = { "after", id } end,
      destroy = function(id) log[#log + 1] = { "destroy", id } end,
    }):enable()
    local trig = ah.executionAsyncId()
    local r = AsyncResource.new("alcazares", trig)
    local id = r:asyncId()
    assert.are_not.equal(trig, id)
    assert.equal(trig, r:triggerAsyncId())
    assert.equal(r, res[id])
    r:runInAsyncScope(function() end)
    r:runInAsyncScope(function() end)
    assert.equal(r, r:emitDestroy())
    r:emitDestroy()
    local pob = AsyncResource.new("poblado", 111)
    assert.same({
      { "init", id, "alcazares", trig },
      { "before", id }, { "after", id },
      { "before", id }, { "after", id },
      { "destroy", id },
      { "init", pob:asyncId(), "poblado", 111 },
    }, log)
  end)

  it("runInAsyncScope: ids, resource and frame, results and arguments", function()
    local v = ah.AsyncLocal.new()
    local r = v:run("captured", function() return AsyncResource.new("X") end)
    local id, trig, res, val, a, b = v:run("now", function()
      return r:runInAsyncScope(function(x, y)
        return ah.executionAsyncId(), ah.triggerAsyncId(), ah.executionAsyncResource(), v:get(), x, y
      end, 1, nil)
    end)
    assert.equal(r:asyncId(), id)
    assert.equal(r:triggerAsyncId(), trig)
    assert.equal(r, res)
    assert.equal("captured", val)
    assert.equal(1, a)
    assert.is_nil(b)
    assert.equal(1, ah.executionAsyncId())
    assert.equal(ah.executionAsyncResource(), ah.executionAsyncResource())
    assert.are_not.equal(r, ah.executionAsyncResource())
  end)

  -- test-async-exec-resource-match
  it("executionAsyncResource matches init's resource in before, after and the callback", function()
    local map, mism = {}, 0
    track(ah.createHook {
      init = function(id, _, _, resource) map[id] = resource end,
      before = function(id) if map[id] and ah.executionAsyncResource() ~= map[id] then mism = mism + 1 end end,
      after = function(id) if map[id] and ah.executionAsyncResource() ~= map[id] then mism = mism + 1 end end,
    }):enable()
    local r = AsyncResource.new("TheResource")
    assert.equal(r, map[r:asyncId()])
    r:runInAsyncScope(function() assert.equal(r, ah.executionAsyncResource()) end)
    local c = co.create(function() co.yield(ah.executionAsyncResource()) end)
    local _, cr = co.resume(c)
    co.resume(c)
    assert.equal(c, cr.thread)
    assert.equal(0, mism)
  end)

  -- test-async-hooks-recursive-stack-runInAsyncScope
  it("1000 nested scopes each see their own id, and unwind", function()
    local function recurse(n)
      local r = AsyncResource.new("foobar")
      r:runInAsyncScope(function()
        assert.equal(r:asyncId(), ah.executionAsyncId())
        assert.equal(r:triggerAsyncId(), ah.triggerAsyncId())
        if n > 0 then recurse(n - 1) end
        assert.equal(r:asyncId(), ah.executionAsyncId())
      end)
    end
    recurse(1000)
    assert.equal(1, ah.executionAsyncId())
    assert.equal(0, ah.triggerAsyncId())
  end)

  -- test-async-hooks-run-in-async-scope-caught-exception
  it("an error inside runInAsyncScope restores, emits after, and propagates unchanged", function()
    local log = {}
    track(ah.createHook {
      before = function(id) log[#log + 1] = "before " .. id end,
      after = function(id) log[#log + 1] = "after " .. id end,
    }):enable()
    local r = AsyncResource.new("X")
    local v = ah.AsyncLocal.new()
    local e = {}
    local ok, got = pcall(r.runInAsyncScope, r, function() v:set(1); error(e) end)
    assert.is_false(ok)
    assert.equal(e, got)
    assert.same({ "before " .. r:asyncId(), "after " .. r:asyncId() }, log)
    assert.equal(1, ah.executionAsyncId())
    assert.is_nil(v:get())
    -- and the library still works afterwards
    assert.equal(r:asyncId(), r:runInAsyncScope(ah.executionAsyncId))
  end)

  it("runInAsyncScope may yield inside a coroutine; invisible to the resumer", function()
    local log = {}
    track(ah.createHook {
      before = function(id) log[#log + 1] = "before " .. id end,
      after = function(id) log[#log + 1] = "after " .. id end,
    }):enable()
    local r = AsyncResource.new("Y")
    local cid
    local c = co.create(function()
      cid = ah.executionAsyncId()
      return r:runInAsyncScope(function()
        co.yield(ah.executionAsyncId())
        return ah.executionAsyncId()
      end)
    end)
    local _, inside = co.resume(c)
    assert.equal(r:asyncId(), inside)
    assert.equal(1, ah.executionAsyncId())
    local _, again = co.resume(c)
    assert.equal(r:asyncId(), again)
    local R = r:asyncId()
    assert.same({
      "before " .. cid, "before " .. R, "after " .. R, "after " .. cid,
      "before " .. cid, "before " .. R, "after " .. R, "after " .. cid,
    }, log)
  end)

  -- test-asyncresource-bind
  it("bind: the bound function runs in the resource's scope", function()
    local r = AsyncResource.new("B")
    local f = r:bind(function(x) return ah.executionAsyncId(), x end)
    assert.same({ r:asyncId(), 5 }, { f(5) })
    local g = AsyncResource.bind(function() return ah.executionAsyncId(), ah.triggerAsyncId() end)
    local gid, gtrig = g()
    assert.is_true(gid > r:asyncId())
    assert.equal(1, gtrig)
    local seen
    track(ah.createHook { init = function(_, type) seen = type end }):enable()
    AsyncResource.bind(function() end, "MyType")
    assert.equal("MyType", seen)
    AsyncResource.bind(function() end)
    assert.equal("bound-anonymous-fn", seen)
    assert.error_matches(function() r:bind(nil) end, "function expected")
    assert.error_matches(function() AsyncResource.bind(nil) end, "function expected")
  end)

  it("checks self on every method", function()
    for _, m in ipairs { "runInAsyncScope", "emitDestroy", "asyncId", "triggerAsyncId" } do
      assert.error_matches(function() AsyncResource[m]({}) end, "bad self %(AsyncResource expected")
    end
    local r = AsyncResource.new("Z")
    assert.error_matches(function() r:runInAsyncScope(nil) end, "bad argument #1 to 'runInAsyncScope' %(function expected, got nil%)")
    assert.equal(1, ah.executionAsyncId())
  end)

  it("bad-self errors of every method point at the caller's line", function()
    local where = {
      runInAsyncScope = H.raised_here(function() AsyncResource.runInAsyncScope(5, print) end),
      emitDestroy = H.raised_here(function() AsyncResource.emitDestroy(5) end),
      asyncId = H.raised_here(function() AsyncResource.asyncId(5) end),
      triggerAsyncId = H.raised_here(function() AsyncResource.triggerAsyncId(5) end),
    }
    for m, msg in pairs(where) do
      assert.equal(("calling '%s' on bad self (AsyncResource expected, got number)"):format(m), msg)
    end
  end)

  it("options: the type given is named, typos are refused", function()
    assert.equal("bad argument #2 to 'new' (triggerAsyncId must be an integer >= -1, got string)",
      H.raised_here(function() AsyncResource.new("X", { triggerAsyncId = "5" }) end))
    assert.equal("bad argument #2 to 'new' (triggerAsyncId must be an integer >= -1, got -2)",
      H.raised_here(function() AsyncResource.new("X", { triggerAsyncId = -2 }) end))
    assert.equal("bad argument #2 to 'new' (unknown option 'trigerAsyncId'; accepted: triggerAsyncId, requireManualDestroy)",
      H.raised_here(function() AsyncResource.new("X", { trigerAsyncId = 1 }) end))
    assert.equal(3, AsyncResource.new("X", { triggerAsyncId = 3.0 }):triggerAsyncId())
    assert.equal(math.type(3), math.type(AsyncResource.new("X", 3.0):triggerAsyncId()))
  end)

  -- test-async-hooks-prevent-double-destroy
  it("destroy is delivered once, also when emitDestroy is followed by GC", function()
    local count = 0
    local id
    track(ah.createHook { destroy = function(d) if d == id then count = count + 1 end end }):enable()
    do
      local r = AsyncResource.new("foobar")
      id = r:asyncId()
      r:emitDestroy()
      r:emitDestroy()
    end
    H.gc()
    boundary()
    assert.equal(1, count)
  end)

  -- test-async-hooks-destroy-on-gc
  it("a collected resource gets its destroy, after the collection, not inside it", function()
    local destroyed = {}
    track(ah.createHook { destroy = function(d) destroyed[d] = true end }):enable()
    local id = AsyncResource.new("foobar"):asyncId()
    H.gc()
    assert.is_nil(destroyed[id])
    boundary()
    assert.is_true(destroyed[id])
  end)

  -- test-async-hooks-disable-gc-tracking
  it("no GC destroy for requireManualDestroy, nor when no destroy hook existed at creation", function()
    local destroyed = {}
    local manual = AsyncResource.new("foobar", { requireManualDestroy = true }):asyncId()
    local untracked = AsyncResource.new("foobar"):asyncId() -- no destroy hook yet
    track(ah.createHook { destroy = function(d) destroyed[d] = true end }):enable()
    local manual2 = AsyncResource.new("foobar", { requireManualDestroy = true }):asyncId()
    H.gc()
    boundary()
    assert.is_nil(destroyed[manual])
    assert.is_nil(destroyed[untracked])
    assert.is_nil(destroyed[manual2])
  end)

  -- test-nexttick-default-trigger, with coroutines as the deferred work
  it("the default trigger of new work is the current execution id", function()
    local r = AsyncResource.new("T")
    local trig_in_scope = r:runInAsyncScope(function()
      return co.wrap(function() return ah.triggerAsyncId() end)()
    end)
    assert.equal(r:asyncId(), trig_in_scope)
    local inner_trig, outer_id = co.wrap(function()
      local id = ah.executionAsyncId()
      return co.wrap(function() return ah.triggerAsyncId() end)(), id
    end)()
    assert.equal(outer_id, inner_trig)
    assert.equal(r:asyncId(), r:runInAsyncScope(function() return AsyncResource.new("U"):triggerAsyncId() end))
  end)

  it("resources are collectable after use", function()
    local weak = setmetatable({}, { __mode = "k" })
    track(ah.createHook { init = function() end, destroy = function() end }):enable()
    do
      local r = AsyncResource.new("W")
      r:runInAsyncScope(function() end)
      weak[r] = true
    end
    H.gc()
    assert.is_nil(next(weak))
  end)
end)
