local ah = require("async_hooks")
local H = require("helpers")
local AsyncLocal, Snapshot, ALS = ah.AsyncLocal, ah.Snapshot, ah.AsyncLocalStorage
local co = ah.coroutine

describe("Snapshot", function()
  it("runs fn in the captured frame and restores afterwards", function()
    local v = AsyncLocal.new { default = "d" }
    local snap = v:run("captured", function() return Snapshot.new() end)
    v:run("now", function()
      assert.equal("captured", snap:run(function() return v:get() end))
      assert.equal("now", v:get())
    end)
  end)

  it("locals created after the snapshot read their defaults inside it", function()
    local snap = Snapshot.new()
    local late = AsyncLocal.new { default = "late-default" }
    late:run("set", function()
      assert.equal("late-default", snap:run(function() return late:get() end))
    end)
  end)

  it("a set inside Snapshot:run ends with it", function()
    local v = AsyncLocal.new()
    local snap = Snapshot.new()
    snap:run(function() v:set(1) end)
    assert.is_nil(v:get())
  end)

  it("restores on error, same error object", function()
    local v = AsyncLocal.new()
    local snap = v:run(1, Snapshot.new)
    local e = {}
    local ok, got = pcall(snap.run, snap, function() error(e) end)
    assert.is_false(ok)
    assert.equal(e, got)
    assert.is_nil(v:get())
  end)

  it("wrap runs later in the frame current at wrap time, out of order", function()
    local v = AsyncLocal.new()
    local fns = {}
    for i = 1, 3 do
      fns[i] = v:run(i, function() return Snapshot.wrap(function(x) return v:get(), x end) end)
    end
    v:run("outer", function()
      assert.same({ 3, "c" }, { fns[3]("c") })
      assert.same({ 1, "a" }, { fns[1]("a") })
      assert.same({ 2, "b" }, { fns[2]("b") })
      assert.equal("outer", v:get())
    end)
  end)

  it("wrapped functions and snapshot runs may yield inside coroutines", function()
    local v = AsyncLocal.new()
    local w = v:run("w", function()
      return Snapshot.wrap(function()
        co.yield(v:get())
        return v:get()
      end)
    end)
    local c = co.wrap(function() return w() end)
    assert.equal("w", c())
    assert.is_nil(v:get())
    assert.equal("w", c())
  end)

  it("checks its arguments", function()
    local snap = Snapshot.new()
    assert.error_matches(function() snap:run(nil) end, "bad argument #1 to 'run' %(function expected, got nil%)")
    assert.error_matches(function() Snapshot.wrap(1) end, "bad argument #1 to 'wrap' %(function expected, got number%)")
    assert.error_matches(function() snap.run({}, print) end, "bad self %(Snapshot expected")
  end)

  it("accepts callable tables", function()
    local v = AsyncLocal.new()
    local callable = setmetatable({}, { __call = function(_, x) return v:get(), x end })
    local snap = v:run(9, Snapshot.new)
    assert.same({ 9, "x" }, { snap:run(callable, "x") })
    assert.same({ 5, "y" }, { v:run(5, callable, "y") })
  end)
end)

describe("Snapshot.empty", function()
  it("runs fn in the empty frame: every value at its default, also inside what it creates", function()
    local v = AsyncLocal.new { default = "d" }
    local als = ALS.new { defaultValue = "dv" }
    local got = v:run("req-1", function()
      als:enterWith("store")
      return { ah.Snapshot.empty():run(function()
        local inner = co.wrap(function() return v:get(), als:getStore() end)
        return v:get(), als:getStore(), inner()
      end) }
    end)
    assert.same({ "d", "dv", "d", "dv" }, got)
  end)

  it("restores the current context afterwards, also on error, and a set inside ends with it", function()
    local v = AsyncLocal.new()
    v:run("outer", function()
      local e = {}
      local ok, err = pcall(ah.Snapshot.empty().run, ah.Snapshot.empty(), function() v:set("inner"); error(e) end)
      assert.is_false(ok)
      assert.equal(e, err)
      assert.equal("outer", v:get())
      ah.Snapshot.empty():run(function() v:set("inner") end)
      assert.equal("outer", v:get())
    end)
  end)

  it("is the same context wherever it is taken", function()
    local v = AsyncLocal.new()
    local a = ah.Snapshot.empty()
    local b = v:run(1, ah.Snapshot.empty)
    local c = co.wrap(function() v:set(2); return ah.Snapshot.empty() end)()
    for _, s in ipairs { a, b, c } do
      assert.equal(getmetatable(a), getmetatable(s))
      assert.is_nil(s:run(function() return v:get() end))
    end
    assert.equal(require("async_hooks.core").empty_frame(), a.frame)
  end)

  it("the pooled-connection example: the reader no longer logs request 1's id for request 2's data", function()
    H.lua_ok('dofile("examples/pooled_connection.lua")', table.concat({
      "pool opened inside request 1:",
      "  [req-1] reader got q1",
      "  [req-1] reply q1",
      "  [req-1] reader got q2",
      "  [req-2] reply q2",
      "pool opened in Snapshot.empty():",
      "  [-] reader got q1",
      "  [req-1] reply q1",
      "  [-] reader got q2",
      "  [req-2] reply q2",
    }, "\n") .. "\n")
  end)
end)

describe("AsyncLocalStorage", function()
  it("getStore / run / name / defaultValue", function()
    local als = ALS.new { name = "als", defaultValue = "dv" }
    assert.equal("als", als.name)
    assert.equal("dv", als.defaultValue)
    assert.equal("dv", als:getStore())
    assert.equal("s", als:run("s", function() return als:getStore() end))
    assert.equal("dv", als:getStore())
  end)

  it("enterWith sets for the rest of the context", function()
    local als = ALS.new()
    local c = co.wrap(function()
      als:enterWith({ id = 1 })
      co.yield(als:getStore().id)
      return als:getStore().id
    end)
    assert.equal(1, c())
    assert.is_nil(als:getStore())
    assert.equal(1, c())
  end)

  it("exit runs with an explicit nil store (not the default)", function()
    local als = ALS.new { defaultValue = "dv" }
    als:run("s", function()
      local inside = als:exit(function(a) return als:getStore(), a end, "arg")
      assert.is_nil(inside)
      assert.equal("s", als:getStore())
    end)
  end)

  it("disable releases stores", function()
    local als = ALS.new()
    local weak = setmetatable({}, { __mode = "v" })
    local snap
    als:run({}, function()
      weak[1] = als:getStore()
      snap = Snapshot.new()
    end)
    als:disable()
    H.gc()
    assert.is_nil(weak[1])
    assert.is_nil(snap:run(function() return als:getStore() end))
  end)

  it("bind and snapshot", function()
    local als = ALS.new()
    local bound = als:run("b", function() return ALS.bind(function(x) return als:getStore(), x end) end)
    local runner = als:run("s", function() return ALS.snapshot() end)
    als:run("other", function()
      assert.same({ "b", 1 }, { bound(1) })
      assert.same({ "s", 2 }, { runner(function(x) return als:getStore(), x end, 2) })
      assert.equal("other", als:getStore())
    end)
    assert.error_matches(function() runner(nil) end, "function expected")
    assert.error_matches(function() ALS.bind(nil) end, "bad argument #1 to 'bind'")
  end)

  it("checks its arguments and keeps its state", function()
    local als = ALS.new()
    als:run("keep", function()
      assert.error_matches(function() als:run(1) end, "bad argument #2 to 'run' %(function expected, got nil%)")
      assert.error_matches(function() als:exit() end, "bad argument #1 to 'exit'")
      assert.error_matches(function() ALS.run({}, 1, print) end, "bad self")
      assert.error_matches(function() ALS.new(1) end, "table or nil expected")
      assert.equal("keep", als:getStore())
    end)
  end)
end)
