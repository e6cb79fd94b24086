local ah = require("async_hooks")
local H = require("helpers")
local AsyncLocal = ah.AsyncLocal

describe("the module", function()
  it("has a version and keeps the C core private", function()
    assert.is_string(ah._VERSION)
    -- the release's version: the versioned rockspec's, without its revision
    local f = assert(io.open("rockspec/async-hooks-" .. ah._VERSION .. "-1.rockspec"))
    local version = f:read("a"):match('\nversion%s*=%s*"([^"]+)"')
    f:close()
    assert.equal(ah._VERSION .. "-1", version)
    assert.matches("^%d+%.%d+%.%d+$", ah._VERSION)
    assert.is_nil(ah.core)
    assert.equal("lua54", ah.backend)
  end)

  it("every public class and function carries LuaLS annotations and an LDoc comment", function()
    local f = assert(io.open("lua/async_hooks/api.lua"))
    local lines = {}
    for line in f:lines() do lines[#lines + 1] = line end
    f:close()
    -- the comment block right above line i
    local function block_above(i)
      local b = {}
      for j = i - 1, 1, -1 do
        if not lines[j]:match("^%s*%-%-") then break end
        b[#b + 1] = lines[j]
      end
      return table.concat(b, "\n")
    end
    local function definition(owner, key)
      for i, line in ipairs(lines) do
        local defined = line:match("^%s*function " .. owner .. "[.:]" .. key .. "%(")
          or line:match("^%s*" .. owner .. "%." .. key .. " = ")
        if defined then return i end
      end
    end
    local classes = { AsyncLocal = ah.AsyncLocal, AsyncLocalStorage = ah.AsyncLocalStorage, Snapshot = ah.Snapshot,
      AsyncResource = ah.AsyncResource, AsyncHook = getmetatable(ah.createHook {}) }
    local checked = 0
    local function check(owner, key)
      local i = definition(owner, key)
      assert.is_not_nil(i, owner .. "." .. key .. " not found")
      local doc = block_above(i)
      assert.matches("%-%-%- %S", doc, nil, false, owner .. "." .. key .. ": no LDoc comment")
      assert.matches("%-%-%-@%a", doc, nil, false, owner .. "." .. key .. ": no LuaLS annotation")
      checked = checked + 1
    end
    for name, class in pairs(classes) do
      local i
      for j, line in ipairs(lines) do if line:match("^%s*local " .. name .. " = {") then i = j end end
      assert.is_not_nil(i, name)
      assert.matches("%-%-%-@class " .. name, block_above(i))
      for key, v in pairs(class) do
        if type(v) == "function" then check(name, key) end
      end
    end
    for key, v in pairs(ah) do
      if type(v) == "function" or key == "coroutine" or key == "luv_covered" or key == "backend" then check("M", key) end
    end
    assert.is_true(checked >= 35)
  end)

  it("is one module per state: loading every file again returns the same classes", function()
    for _, name in ipairs { "async_hooks", "async_hooks.api", "async_hooks.backend.lua54", "async_hooks.core" } do
      package.loaded[name] = nil
    end
    local again = require("async_hooks")
    assert.equal(ah, again)
    assert.equal(AsyncLocal, again.AsyncLocal)
  end)
end)

describe("AsyncLocal", function()
  it("has a name and a default", function()
    local v = AsyncLocal.new { name = "req", default = 7 }
    assert.equal("req", v.name)
    assert.equal(7, v.default)
    assert.equal(7, v:get())
    local w = AsyncLocal.new()
    assert.equal("", w.name)
    assert.is_nil(w:get())
  end)

  it("run sets the value only for the duration of fn", function()
    local v = AsyncLocal.new { default = "d" }
    local seen = v:run("x", function() return v:get() end)
    assert.equal("x", seen)
    assert.equal("d", v:get())
  end)

  it("run returns every result of fn, nils and trailing nils included", function()
    local v = AsyncLocal.new()
    local r = table.pack(v:run(1, function(a, b, c) return nil, a, b, c, nil, nil end, "a", nil, "c"))
    assert.equal(6, r.n)
    assert.same({ n = 6, [2] = "a", [4] = "c" }, r)
    assert.equal(0, select("#", v:run(1, function() end)))
  end)

  it("passes arguments through to fn", function()
    local v = AsyncLocal.new()
    assert.equal(6, v:run(0, function(a, b, c) return a + b + c end, 1, 2, 3))
  end)

  it("nests runs of the same local", function()
    local v = AsyncLocal.new()
    v:run(1, function()
      assert.equal(1, v:get())
      v:run(2, function()
        assert.equal(2, v:get())
      end)
      assert.equal(1, v:get())
    end)
    assert.is_nil(v:get())
  end)

  it("nests runs of different locals; each keeps its own value", function()
    local a, b = AsyncLocal.new(), AsyncLocal.new()
    a:run("A", function()
      b:run("B", function()
        assert.equal("A", a:get())
        assert.equal("B", b:get())
        a:run("A2", function()
          assert.equal("A2", a:get())
          assert.equal("B", b:get())
        end)
        assert.equal("A", a:get())
      end)
      assert.is_nil(b:get())
    end)
  end)

  it("an explicit nil shadows the default", function()
    local v = AsyncLocal.new { default = "d" }
    v:run(nil, function()
      assert.is_nil(v:get())
      v:run("x", function() assert.equal("x", v:get()) end)
      assert.is_nil(v:get())
    end)
    assert.equal("d", v:get())
    local co = coroutine.wrap(function() v:set(nil); return v:get() end)
    assert.is_nil(co())
  end)

  it("false is a value like any other", function()
    local v = AsyncLocal.new { default = true }
    assert.is_false(v:run(false, function() return v:get() end))
  end)

  it("set lasts until the enclosing run ends, and so does every other set", function()
    local a, b = AsyncLocal.new(), AsyncLocal.new()
    a:run(1, function()
      a:set(2)
      b:set("b")
      assert.equal(2, a:get())
      assert.equal("b", b:get())
    end)
    assert.is_nil(a:get())
    assert.is_nil(b:get())
  end)

  it("restores on error and propagates the same error object", function()
    local v = AsyncLocal.new { default = 0 }
    local err = setmetatable({}, { __tostring = function() return "custom" end })
    local ok, e = pcall(v.run, v, 1, function()
      v:set(5)
      error(err)
    end)
    assert.is_false(ok)
    assert.equal(err, e)
    assert.equal(0, v:get())
    local ok2, e2 = pcall(v.run, v, 1, function() error("plain", 0) end)
    assert.is_false(ok2)
    assert.equal("plain", e2)
    assert.equal(0, v:get())
  end)

  it("keeps the user's traceback through run", function()
    local v = AsyncLocal.new()
    local tb
    xpcall(function()
      v:run(1, function() local x = nil; return x.field end)
    end, function(m) tb = debug.traceback(m) end)
    assert.matches("attempt to index a nil value", tb)
    assert.matches("01%-asynclocal_spec.lua", tb)
  end)

  it("nests 10,000 runs deep", function()
    local v = AsyncLocal.new()
    local function nest(n)
      if n == 0 then return v:get() end
      return v:run(n, nest, n - 1)
    end
    assert.equal(1, nest(10000))
    assert.is_nil(v:get())
    -- and the restore works all the way down
    local depth = 0
    local function check(n)
      if n == 0 then return end
      v:run(n, function()
        check(n - 1)
        assert.equal(n, v:get())
        depth = depth + 1
      end)
    end
    check(10000)
    assert.equal(10000, depth)
  end)

  it("set copies the frame: captured contexts do not change", function()
    local v = AsyncLocal.new()
    v:run(1, function()
      local snap = ah.Snapshot.new()
      v:set(2)
      assert.equal(1, snap:run(function() return v:get() end))
    end)
  end)

  describe("set, again and again", function()
    -- set() copies the current frame; the size of the frame the previous
    -- set() made is remembered rather than counted (frames.c)
    it("keeps every other local's value through repeated sets", function()
      local core = require("async_hooks.core")
      local a, b, c = AsyncLocal.new(), AsyncLocal.new(), AsyncLocal.new()
      a:run("A", function()
        for i = 1, 50 do
          b:set(i)
          assert.equal(i == 1 and 2 or 3, core.frame_size(core.current_frame()))
          c:set(-i)
          assert.equal(3, core.frame_size(core.current_frame()))
          a:set("A" .. i)
          assert.same({ "A" .. i, i, -i }, { a:get(), b:get(), c:get() })
        end
      end)
      assert.same({}, { a:get(), b:get(), c:get() })
    end)

    it("copies what is left of a frame whose entries the collector removed", function()
      local core = require("async_hooks.core")
      local v, w = AsyncLocal.new(), AsyncLocal.new()
      v:run("v", function()
        local weak = setmetatable({}, { __mode = "v" })
        do
          local tmp = AsyncLocal.new()
          tmp:set({})
          weak[1] = tmp:get()
        end
        w:set(1) -- made last: three entries, one of them about to go
        H.gc()
        assert.is_nil(weak[1])
        assert.equal(2, core.frame_size(core.current_frame()))
        w:set(2)
        assert.equal(2, core.frame_size(core.current_frame()))
        assert.same({ "v", 2 }, { v:get(), w:get() })
        v:disable()
        H.gc()
        w:set(3)
        assert.equal(1, core.frame_size(core.current_frame()))
        assert.same({ nil, 3 }, { v:get(), w:get() })
      end)
    end)

    it("frames cannot be made from Lua: their metatable is protected", function()
      local core = require("async_hooks.core")
      local fr = core.current_frame()
      assert.equal("async_hooks.frame", getmetatable(fr))
      assert.has_error(function() setmetatable(fr, nil) end)
      assert.has_error(function() core.swap(setmetatable({}, { __mode = "k" })) end)
    end)
  end)

  describe("disable", function()
    it("makes get return the default everywhere; set works again later", function()
      local v = AsyncLocal.new { default = "d" }
      v:run("x", function()
        local snap = ah.Snapshot.new()
        v:disable()
        assert.equal("d", v:get())
        assert.equal("d", snap:run(function() return v:get() end))
        v:set("y")
        assert.equal("y", v:get())
      end)
    end)

    it("releases the values stored in every frame", function()
      local v = AsyncLocal.new()
      local weak = setmetatable({}, { __mode = "v" })
      local keep = {}
      v:run({}, function()
        weak[1] = v:get()
        keep[1] = ah.Snapshot.new() -- a frame that outlives the run
        keep[2] = coroutine.create(function() end) -- so does this one
      end)
      H.gc()
      assert.is_table(weak[1]) -- still reachable through the snapshot
      v:disable()
      H.gc()
      assert.is_nil(weak[1])
      assert.is_nil(keep[1]:run(function() return v:get() end))
    end)

    it("releases values once the local itself is dropped", function()
      local weak = setmetatable({}, { __mode = "v" })
      local snap
      do
        local v = AsyncLocal.new()
        v:run({}, function()
          weak[1] = v:get()
          snap = ah.Snapshot.new()
        end)
      end
      H.gc()
      assert.is_nil(weak[1])
      assert.truthy(snap)
    end)
  end)

  describe("bad arguments", function()
    it("run without a function", function()
      local v = AsyncLocal.new { default = 1 }
      assert.error_matches(function() v:run(1, nil) end,
        "bad argument #2 to 'run' %(function expected, got nil%)")
      assert.error_matches(function() v:run(1, 42) end, "function expected, got number")
      assert.equal(1, v:get())
    end)

    it("methods on the wrong object", function()
      local v = AsyncLocal.new()
      assert.error_matches(function() v.get({}) end, "AsyncLocal expected")
      assert.error_matches(function() v.get(5) end, "AsyncLocal expected, got number")
      assert.error_matches(function() v.set(nil, 1) end, "AsyncLocal expected, got nil")
      assert.error_matches(function() v.run({}, 1, print) end, "bad self %(AsyncLocal expected")
      assert.error_matches(function() v.disable("x") end, "bad self")
      assert.error_matches(function() v.get(ah.Snapshot.new()) end, "AsyncLocal expected")
    end)

    it("new with bad options", function()
      assert.error_matches(function() AsyncLocal.new(5) end, "bad argument #1 to 'new' %(table or nil expected, got number%)")
      assert.error_matches(function() AsyncLocal.new { name = 5 } end, "opts.name must be a string")
    end)

    it("new with a typo or called with ':' names the problem and the accepted keys, at the caller's line", function()
      assert.equal("bad argument #1 to 'new' (unknown option 'defualt'; accepted: name, default)",
        H.raised_here(function() AsyncLocal.new { defualt = 1 } end))
      assert.equal("bad argument #1 to 'new' (table or nil expected, got class AsyncLocal (call with '.', not ':'))",
        H.raised_here(function() AsyncLocal:new() end))
      assert.equal("bad argument #1 to 'new' (unknown option 'default'; accepted: name, defaultValue)",
        H.raised_here(function() ah.AsyncLocalStorage.new { default = 1 } end))
    end)

    it("getStore and enterWith name AsyncLocalStorage, get and set name AsyncLocal", function()
      local als, v = ah.AsyncLocalStorage.new(), AsyncLocal.new()
      assert.equal("calling 'getStore' on bad self (AsyncLocalStorage expected, got number)",
        H.raised_here(function() als.getStore(1) end))
      assert.equal("calling 'enterWith' on bad self (AsyncLocalStorage expected, got table)",
        H.raised_here(function() als.enterWith({}, 1) end))
      assert.equal("calling 'get' on bad self (AsyncLocal expected, got boolean)",
        H.raised_here(function() v.get(true) end))
      assert.equal("calling 'set' on bad self (AsyncLocal expected, got Snapshot)",
        H.raised_here(function() v.set(ah.Snapshot.new(), 1) end))
      -- the getters stay the C functions themselves: no Lua frame on the hot path
      assert.equal("C", debug.getinfo(v.get, "S").what)
      assert.equal("C", debug.getinfo(als.getStore, "S").what)
      assert.equal(AsyncLocal.get, v.get)
    end)

    it("a failing call leaves the state intact", function()
      local v = AsyncLocal.new()
      v:run("kept", function()
        pcall(v.run, v, "lost", nil)
        pcall(v.set, {}, "lost")
        assert.equal("kept", v:get())
      end)
      assert.is_nil(v:get())
    end)
  end)
end)

-- run's own frame stays on a suspended coroutine's stack
describe("disable() with a coroutine suspended inside run", function()
  it("leaves the run's value collectable (AsyncLocal and AsyncLocalStorage)", function()
    local v = ah.AsyncLocal.new()
    local als = ah.AsyncLocalStorage.new()
    local weak = setmetatable({}, { __mode = "v" })
    local function mk(i) local t = {}; weak[i] = t; return t end -- no local keeps it
    local c1 = ah.coroutine.create(function() v:run(mk(1), function() ah.coroutine.yield() end) end)
    local c2 = ah.coroutine.create(function() als:run(mk(2), function() ah.coroutine.yield() end) end)
    assert.is_true(ah.coroutine.resume(c1))
    assert.is_true(ah.coroutine.resume(c2))
    v:disable()
    als:disable()
    collectgarbage() -- one full collection, as without the library
    assert.is_nil(weak[1])
    assert.is_nil(weak[2])
    assert.is_true(ah.coroutine.resume(c1)) -- the scopes still close cleanly
    assert.is_true(ah.coroutine.resume(c2))
    assert.is_nil(v:get())
  end)
end)
