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
      { function() co.resume("x") end, "thread expected" },
      { function() co.create({}) end, "function expected" },
      { function() co.close(nil) end, "thread expected" },
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

  -- each case is a one-line function whose bad call is a statement: the
  -- error must be positioned at that very line of this file
  it("every error carries the position of the user's call, at every entry point", function()
    local v, als = ah.AsyncLocal.new(), ah.AsyncLocalStorage.new()
    local r, s, h = ah.AsyncResource.new("X"), ah.Snapshot.new(), ah.createHook {}
    local runner = ah.AsyncLocalStorage.snapshot()
    local AL, ALS, AR, Snap = ah.AsyncLocal, ah.AsyncLocalStorage, ah.AsyncResource, ah.Snapshot
    local cases = {
      { function() AL.new(42) end, "^bad argument #1 to 'new' %(table or nil expected, got number%)$" },
      { function() AL.new { name = 5 } end, "^bad argument #1 to 'new' %(opts.name must be a string, got number%)$" },
      { function() AL.new { defualt = 1 } end, "unknown option 'defualt'; accepted: name, default" },
      { function() AL:new() end, "got class AsyncLocal %(call with '%.', not ':'%)" },
      { function() v.get(5) end, "^calling 'get' on bad self %(AsyncLocal expected, got number%)$" },
      { function() v.set(nil, 1) end, "^calling 'set' on bad self %(AsyncLocal expected, got nil%)$" },
      { function() v:run(1) end, "^bad argument #2 to 'run' %(function expected, got nil%)$" },
      { function() v.run({}, 1, print) end, "^calling 'run' on bad self %(AsyncLocal expected, got table%)$" },
      { function() v.disable("x") end, "^calling 'disable' on bad self %(AsyncLocal expected, got string%)$" },
      { function() ALS.new(42) end, "^bad argument #1 to 'new' %(table or nil expected, got number%)$" },
      { function() ALS.new { default = 1 } end, "unknown option 'default'; accepted: name, defaultValue" },
      { function() ALS:new() end, "got class AsyncLocalStorage" },
      { function() als.getStore() end, "^calling 'getStore' on bad self %(AsyncLocalStorage expected, got no value%)$" },
      { function() als.enterWith(1, 2) end, "^calling 'enterWith' on bad self %(AsyncLocalStorage expected, got number%)$" },
      { function() als:run(1, "f") end, "^bad argument #2 to 'run' %(function expected, got string%)$" },
      { function() als.run(r, 1, print) end, "^calling 'run' on bad self %(AsyncLocalStorage expected, got AsyncResource%)$" },
      { function() als:exit() end, "^bad argument #1 to 'exit' %(function expected, got nil%)$" },
      { function() als.exit(s, print) end, "^calling 'exit' on bad self %(AsyncLocalStorage expected, got Snapshot%)$" },
      { function() als.disable(1) end, "^calling 'disable' on bad self %(AsyncLocalStorage expected, got number%)$" },
      { function() ALS.bind(nil) end, "^bad argument #1 to 'bind' %(function expected, got nil%)$" },
      { function() runner(1) end, "^bad argument #1 to 'snapshot' %(function expected, got number%)$" },
      { function() s:run(nil) end, "^bad argument #1 to 'run' %(function expected, got nil%)$" },
      { function() Snap.run(r, print) end, "^calling 'run' on bad self %(Snapshot expected, got AsyncResource%)$" },
      { function() Snap.wrap(1) end, "^bad argument #1 to 'wrap' %(function expected, got number%)$" },
      { function() ah.createHook("x") end, "^bad argument #1 to 'createHook' %(table expected, got string%)$" },
      { function() ah.createHook { inti = print } end, "unknown option 'inti'; accepted: init, before, after, destroy" },
      { function() ah.createHook { init = "x" } end, "hook.init must be a function, got string" },
      { function() h.enable(5) end, "^calling 'enable' on bad self %(AsyncHook expected, got number%)$" },
      { function() h.disable() end, "^calling 'disable' on bad self %(AsyncHook expected, got nil%)$" },
      { function() AR.new(42) end, "^bad argument #1 to 'new' %(non%-empty string expected, got number%)$" },
      { function() AR:new("X") end, "got class AsyncResource" },
      { function() AR.new("X", true) end, "^bad argument #2 to 'new' %(number, table or nil expected, got boolean%)$" },
      { function() AR.new("X", { triggerAsyncId = "5" }) end, "triggerAsyncId must be an integer >= %-1, got string%)$" },
      { function() AR.new("X", { trigerAsyncId = 1 }) end,
        "unknown option 'trigerAsyncId'; accepted: triggerAsyncId, requireManualDestroy" },
      { function() AR.new("X", { requireManualDestroy = 1 }) end, "requireManualDestroy must be a boolean, got number" },
      { function() r.runInAsyncScope({}, print) end, "^calling 'runInAsyncScope' on bad self %(AsyncResource expected, got table%)$" },
      { function() r:runInAsyncScope(nil) end, "^bad argument #1 to 'runInAsyncScope' %(function expected, got nil%)$" },
      { function() r.emitDestroy({}) end, "^calling 'emitDestroy' on bad self %(AsyncResource expected, got table%)$" },
      { function() r.asyncId(5) end, "^calling 'asyncId' on bad self %(AsyncResource expected, got number%)$" },
      { function() r.triggerAsyncId(v) end, "^calling 'triggerAsyncId' on bad self %(AsyncResource expected, got AsyncLocal%)$" },
      { function() r:bind(nil) end, "^bad argument #1 to 'bind' %(function expected, got nil%)$" },
      { function() AR.bind(42) end, "^bad argument #1 to 'bind' %(function expected, got number%)$" },
      { function() AR.bind(print, "") end, "^bad argument #2 to 'bind' %(non%-empty string or nil expected, got string%)$" },
      { function() ah.install("x") end, "^bad argument #1 to 'install' %(table or nil expected, got string%)$" },
      { function() ah:install() end, "got the async_hooks module %(call with '%.', not ':'%)" },
      { function() ah.install { luv = 5 } end, "^bad argument #1 to 'install' %(luv module in opts.luv expected, got number%)$" },
      { function() ah.install { luv = {} } end, "luv module in opts.luv expected, got a table without 'new_check'" },
      { function() ah.install { lvu = uv } end, "unknown option 'lvu'; accepted: debug, luv" },
      { function() co.create({}) end, "function expected" },
      { function() co.resume("x") end, "thread expected" },
      { function() co.wrap(nil) end, "function expected" },
      { function() co.close(nil) end, "thread expected" },
    }
    for i, c in ipairs(cases) do
      local msg = H.raised_here(c[1])
      assert.matches(c[2], msg, nil, false, "case " .. i)
      state_intact()
    end
    assert.is_false(ah.installed())
  end)

  it("option typos name the key and the accepted keys", function()
    local function msg(f) local _, e = pcall(f); return e end
    assert.matches("bad argument #1 to 'new' %(unknown option 'defualt'; accepted: name, default%)",
      msg(function() ah.AsyncLocal.new { defualt = 1 } end))
    assert.matches("unknown option 1;", msg(function() ah.AsyncLocal.new { 1 } end))
    assert.matches("bad argument #2 to 'new' %(unknown option 'trigerAsyncId'",
      msg(function() ah.AsyncResource.new("T", { trigerAsyncId = 1 }) end))
    -- the accepted keys themselves still work
    assert.equal(7, ah.AsyncLocal.new { name = "n", default = 7 }:get())
    assert.equal(8, ah.AsyncLocalStorage.new { name = "n", defaultValue = 8 }:getStore())
    assert.equal(-1, ah.AsyncResource.new("T", { triggerAsyncId = -1, requireManualDestroy = true }):triggerAsyncId())
  end)

  it("a callable table is a function everywhere, hooks included", function()
    local calls = {}
    local function callable(name)
      return setmetatable({}, { __call = function(_, ...) calls[#calls + 1] = { name, ... } return name end })
    end
    local h = ah.createHook { init = callable("init"), before = callable("before"),
      after = callable("after"), destroy = callable("destroy") }:enable()
    local r = ah.AsyncResource.new("T")
    r:runInAsyncScope(function() end)
    r:emitDestroy()
    h:disable()
    local id = r:asyncId()
    local mine = {} -- (destroys of resources collected meanwhile may come too)
    for _, c in ipairs(calls) do if c[2] == id then mine[#mine + 1] = c end end
    assert.same({ { "init", id, "T", ah.executionAsyncId(), r }, { "before", id }, { "after", id }, { "destroy", id } },
      mine)
    -- __call that is itself a callable table: accepted, as by the C core
    local inner = callable("inner")
    local outer = setmetatable({}, { __call = inner })
    assert.has_no.errors(function() ah.createHook { init = outer } end)
    local v = ah.AsyncLocal.new()
    assert.equal("inner", v:run(1, callable("inner")))
    assert.equal("inner", ah.Snapshot.new():run(callable("inner")))
    -- a __call behind __metatable still counts (raw metatable, as in C)
    local hidden = setmetatable({}, { __call = function() return "hidden" end, __metatable = false })
    assert.equal("hidden", v:run(1, hidden))
    assert.equal("hidden", ah.AsyncLocalStorage.new():exit(hidden))
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

describe("the api layer under LuaJIT", function()
  -- api.lua is shared with the OpenResty backend: Lua 5.1 syntax, and the
  -- same checks, messages and positions under LuaJIT (a stub backend here)
  it("loads in LuaJIT and raises the same errors at the caller's line", function()
    local src = debug.getinfo(1, "S").source:sub(2):gsub("spec/09%-robustness_spec%.lua$", "")
    local script = os.tmpname()
    local f = assert(io.open(script, "w"))
    f:write(([[
      package.path = %q .. "lua/?.lua;" .. package.path
      local nop = function() end
      local B = { name = "stub", persist = {}, install_options = { luv = true }, coroutine = coroutine }
      for _, k in ipairs { "current_frame", "empty_frame", "executionAsyncId", "triggerAsyncId",
        "executionAsyncResource", "emit_init", "emit_destroy", "flush", "gc_token", "hook_enable", "hook_disable",
        "uninstall", "install", "set_debug" } do B[k] = nop end
      B.newtoken = function() return {} end
      B.getter = function() return function(self) return self.default end end
      B.setter = function() return nop end
      B.run_with = function(_, _, fn, ...) return fn(...) end
      B.run_in_frame = function(_, fn, ...) return fn(...) end
      B.run_in_scope = function(_, _, _, _, fn, ...) return fn(...) end
      local n = 1
      B.new_ids = function(t) n = n + 1; return n, t or 1 end
      B.hook_count = function() return 0 end
      B.installed = function() return false end
      local ah = require("async_hooks.api")(B)
      assert(require("async_hooks.api")(B) == ah, "one module per backend")
      local function msg(f) local ok, e = pcall(f); assert(not ok); return e end
      print(msg(function() ah.AsyncLocal.new(42) end))
      print(msg(function() ah.AsyncLocal.new { defualt = 1 } end))
      print(msg(function() ah.AsyncResource.new("X", 2.5) end))
      print(ah.AsyncResource.new("X", 2.0):triggerAsyncId())
      print(msg(function() ah.AsyncResource.new("X", 2 ^ 60) end))
      local callable = setmetatable({}, { __call = function(_, x) return "called " .. x end })
      print(ah.AsyncLocal.new():run(1, callable, "run"))
      print(msg(function() ah.createHook { init = 1 } end))
      print(ah.createHook { init = callable }.init == callable)
      print(msg(function() ah.install { lvu = 1 } end))
      B.persist, B.install_options = {}, {}
      print(msg(function() require("async_hooks.api")(B).install { luv = 1 } end))
    ]]):format(src))
    f:close()
    local p = io.popen(("luajit %s 2>&1"):format(script))
    local out = p:read("a")
    local ok = p:close()
    os.remove(script)
    assert.is_true(ok, out)
    local name = script:match("[^/]+$")
    local expected = {
      "%s:20: bad argument #1 to 'new' (table or nil expected, got number)",
      "%s:21: bad argument #1 to 'new' (unknown option 'defualt'; accepted: name, default)",
      "%s:22: bad argument #2 to 'new' (triggerAsyncId must be an integer >= -1, got 2.5)",
      "2",
      "%s:24: bad argument #2 to 'new' (triggerAsyncId must be an integer >= -1, got 1.1529215046068e+18)",
      "called run",
      "%s:27: bad argument #1 to 'createHook' (hook.init must be a function, got number)",
      "true",
      "%s:29: bad argument #1 to 'install' (unknown option 'lvu'; accepted: luv)",
      "%s:31: bad argument #1 to 'install' (unknown option 'luv'; accepted: none)",
    }
    local lines = {}
    for line in out:gmatch("[^\n]+") do lines[#lines + 1] = (line:gsub("^.-" .. name:gsub("%p", "%%%0"), "%%s")) end
    assert.same(expected, lines)
  end)
end)

describe("metamethods of internal objects", function()
  it("a luv record's __call rejects a self that is not a record", function()
    H.lua_ok([[
      local uv = require("luv")
      local ah = require("async_hooks").install()
      local v = ah.AsyncLocal.new()
      local t = uv.new_timer()
      -- the first registration on a fresh handle is a quick record (a
      -- closure); the second one, a record, which the handle keeps
      v:run(1, function() t:start(10, 0, function() end); t:start(10, 0, function() end) end)
      local rec = debug.getuservalue(t, 1)
      if type(rec) == "function" then rec = select(2, debug.getupvalue(rec, 1)) end
      local call = debug.getmetatable(rec).__call
      for _, bad in ipairs{ {}, io.stdout, 5, t } do
        local ok, e = pcall(call, bad)
        print(ok, tostring(e):match("bad self") ~= nil)
      end
      print(ah.executionAsyncId(), v:get())
      t:close()
      uv.run()
      print("done")
    ]], {
      { "pcall: false", "a bad self: true" },
      { "pcall: false", "a bad self: true" },
      { "pcall: false", "a bad self: true" },
      { "pcall: false", "a bad self: true" },
      { "executionAsyncId: 1", "value: nil" },
      "done",
    })
  end)
end)

describe("install / uninstall", function()
  after_each(state_intact)

  it("install checks everything first: when it raises, nothing is patched", function()
    local orig = {}
    for k, f in pairs(coroutine) do orig[k] = f end
    local preload = package.preload.luv
    local bad = { { luv = {} }, { luv = { new_check = print } }, { luv = 5 }, { luv = uv, lvu = 1 }, { coroutine = true } }
    for i, opts in ipairs(bad) do
      assert.has_error(function() ah.install(opts) end, nil, "case " .. i)
      for k, f in pairs(orig) do assert.equal(f, coroutine[k], "case " .. i .. ": coroutine." .. k) end
      assert.is_false(ah.installed(), "case " .. i)
      assert.equal(preload, package.preload.luv, "case " .. i)
      assert.is_false(core.luv_attached(), "case " .. i)
    end
    -- a package.loaded.luv that is not luv is refused too, by its name
    local loaded = package.loaded.luv
    package.loaded.luv = { "not luv" }
    local ok, err = pcall(ah.install)
    package.loaded.luv = loaded
    assert.is_false(ok)
    assert.matches("luv module in package.loaded.luv expected, got a table without 'new_check'", err)
    assert.is_false(ah.installed())
    assert.equal(orig.create, coroutine.create)
  end)

  -- require("luv") after install(), luv not loaded yet: both results, the
  -- error message and its traceback are those of the same script without
  -- the library (run here as the reference); no package.preload entry
  describe("require('luv') after install() answers as without the library", function()
    -- line 4 installs or not; the rest is the same script (same lines)
    local SCRIPT = [[
local setup = %q
if setup == "host" then package.preload.luv = assert(package.searchers[3]("luv")) end
if setup == "host-error" then package.preload.luv = function() error("the host refuses", 2) end end
%s
if setup == "missing" or setup == "broken" then package.cpath = %q end
local preload = rawget(package.preload, "luv")
local r = table.pack(xpcall(require, debug.traceback, "luv"))
local me = arg[0]:gsub("%%p", "%%%%%%0")
local out = { "n=" .. r.n, tostring(r[1]), type(r[2]) }
if type(r[2]) == "string" then out[#out + 1] = (r[2]:gsub(me, "SCRIPT")) end
out[#out + 1] = tostring(r[3])
out[#out + 1] = "preload kept: " .. tostring(rawget(package.preload, "luv") == preload)
if r[1] then
  -- (install() waits for cqueues too where it can be required: required
  -- here; where it cannot, install() did not wait for it)
  pcall(require, "cqueues")
  out[#out + 1] = "loaded has no metatable: " .. tostring(debug.getmetatable(package.loaded) == nil)
end
io.write(table.concat(out, "\n"), "\n")
if ah then io.stderr:write("attached: ", tostring(require("async_hooks.core").luv_attached()), "\n") end
]]
    local NO_MT = "loaded has no metatable: true\n"
    local dirs = {}
    local function mkdir()
      local d = os.tmpname()
      os.remove(d)
      assert(os.execute("mkdir '" .. d .. "'"))
      dirs[#dirs + 1] = d
      return d
    end
    teardown(function()
      for _, d in ipairs(dirs) do os.execute("rm -rf '" .. d .. "'") end
    end)

    local function both(setup, cpath)
      local plain = { H.run_lua(SCRIPT:format(setup, "local ah = nil", cpath or "")) }
      local with = { H.run_lua(SCRIPT:format(setup, "local ah = require('async_hooks').install()", cpath or "")) }
      assert.equal(0, plain[1], plain[3])
      assert.equal(0, with[1], with[3])
      assert.equal("", plain[3])
      assert.equal(plain[2], with[2])
      return plain[2], with[3]
    end

    it("luv found on package.cpath: the module and its file", function()
      local out, err = both("found")
      assert.matches("^n=3\ntrue\ntable\n/[^\n]*luv%.so\npreload kept: true\n" .. NO_MT .. "$", out)
      assert.equal("attached: true\n", err)
    end)

    it("luv missing: 'module not found' with every place searched", function()
      local d = mkdir()
      local out, err = both("missing", d .. "/?.so")
      assert.matches("module 'luv' not found:\n\tno field package.preload%['luv'%]\n", out)
      assert.matches("\tno file '" .. d:gsub("%p", "%%%0") .. "/luv.so'", out)
      assert.matches("stack traceback:\n\t%[C%]: in function 'require'", out)
      assert.equal("attached: false\n", err)
    end)

    it("a broken luv.so: the loader's error, with no position of the library", function()
      local d = mkdir()
      local f = assert(io.open(d .. "/luv.so", "w"))
      f:write("not a shared object\n")
      f:close()
      local out, err = both("broken", d .. "/?.so")
      assert.matches("error loading module 'luv' from file '" .. d:gsub("%p", "%%%0") .. "/luv%.so':\n\t", out)
      assert.is_nil(out:find("async_hooks", 1, true), out)
      assert.equal("attached: false\n", err)
    end)

    it("the host's package.preload.luv: its module and ':preload:', its own error", function()
      local out, err = both("host")
      assert.equal("n=3\ntrue\ntable\n:preload:\npreload kept: true\n" .. NO_MT, out)
      assert.equal("attached: true\n", err)
      out = both("host-error")
      assert.matches("^n=2\nfalse\nstring\nthe host refuses\nstack traceback:", out)
    end)
  end)

  -- hosts that bundle luv register it in package.preload
  local HOST = [[
    local ah = require("async_hooks")
    local open_luv = assert(package.searchers[3]("luv"))
    local loads = 0
    local function host_loader(...) loads = loads + 1; return open_luv(...) end
    package.preload.luv = host_loader
  ]]

  it("install() leaves the host's package.preload.luv as it is; luv loaded by it is integrated", function()
    H.lua_ok(HOST .. [[
      ah.install()
      assert(package.preload.luv == host_loader, "the host's loader was replaced")
      local uv = require("luv")
      assert(loads == 1, "the host's loader was not used")
      assert(package.preload.luv == host_loader, "the host's loader was not kept")
      assert(require("async_hooks.core").luv_attached(), "luv not integrated")
      local v = ah.AsyncLocal.new()
      local got
      local t = uv.new_timer()
      v:run("ctx", function() t:start(1, 0, function() got = v:get(); t:close() end) end)
      uv.run()
      ah.uninstall()
      assert(package.preload.luv == host_loader)
      print(got)
    ]], "ctx\n")
  end)

  it("uninstall() before luv is required restores the host's package.preload.luv", function()
    H.lua_ok(HOST .. [[
      ah.install()
      ah.install()
      ah.uninstall()
      assert(package.preload.luv == host_loader, "the host's loader was lost")
      local uv = require("luv")
      assert(loads == 1)
      assert(not require("async_hooks.core").luv_attached(), "luv integrated after uninstall")
      assert(type(uv.new_timer) == "function")
      -- without a host loader, uninstall leaves no preload entry behind
      package.loaded.luv, package.preload.luv = nil, nil
      ah.install()
      ah.uninstall()
      assert(package.preload.luv == nil)
      assert(debug.getmetatable(package.loaded) == nil, "the loaded table keeps a metatable")
      print("ok")
    ]], "ok\n")
  end)

  it("luv that failed to load after install() is integrated when a later require finds it", function()
    H.lua_ok([[
      local ah = require("async_hooks").install()
      local cpath = package.cpath
      package.cpath = ""
      assert(not pcall(require, "luv"))
      package.cpath = cpath
      local uv = require("luv")
      assert(require("async_hooks.core").luv_attached(), "luv not integrated")
      -- the metatable goes once nothing is awaited (cqueues neither, where
      -- it can be required)
      pcall(require, "cqueues")
      assert(debug.getmetatable(package.loaded) == nil, "the loaded table keeps a metatable")
      local v = ah.AsyncLocal.new()
      local t = uv.new_timer()
      v:run("later", function() t:start(1, 0, function() print(v:get()); t:close() end) end)
      uv.run()
      print("ok")
    ]], "later\nok\n")
  end)

  -- a loaded table that has a metatable of its own keeps it: luv comes
  -- through a package.preload.luv entry instead (chained to the host's)
  it("a host metatable on package.loaded is left alone; luv is still integrated", function()
    H.lua_ok(HOST .. [[
      local mt = { __index = function() end }
      setmetatable(package.loaded, mt)
      ah.install()
      assert(getmetatable(package.loaded) == mt, "the host's metatable was replaced")
      assert(package.preload.luv ~= host_loader, "luv not hooked")
      local uv = require("luv")
      assert(loads == 1, "the host's loader was not used")
      assert(package.preload.luv == host_loader, "the host's loader was not restored")
      assert(require("async_hooks.core").luv_attached(), "luv not integrated")
      ah.uninstall()
      assert(getmetatable(package.loaded) == mt)
      -- uninstall() before luv is required: the host's entry back
      package.loaded.luv = nil
      ah.install()
      ah.uninstall()
      assert(package.preload.luv == host_loader)
      assert(getmetatable(package.loaded) == mt)
      print(type(uv.new_timer))
    ]], "function\n")
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

-- review finding 6: the scope guard's metatable is reachable from Lua; its
-- __close must check its self instead of casting it
describe("the scope guard's __close", function()
  after_each(state_intact)

  it("rejects a self that is not a guard with a clear error", function()
    local g = core.enter_scope(5, 1, {}, core.empty_frame())
    local close = getmetatable(g).__close
    for _, bad in ipairs { {}, 5, "x", io.stdout, co.create(print) } do
      assert.error_matches(function() close(bad) end, "async_hooks.scope expected")
    end
    assert.equal(5, ah.executionAsyncId())
    close(g)
    assert.equal(1, ah.executionAsyncId())
  end)
end)

-- a bad call in tail position (`return
-- als:run(s, nil)`) inside a library scope was positioned inside the
-- library (its scope function's line).  Lua drops the frame of a caller
-- that tail-calls, so the position is the nearest user code still on the
-- stack: here the scope's call, on the same line.
describe("errors of bad calls in tail position", function()
  it("are never positioned inside the library", function()
    local v, als = ah.AsyncLocal.new(), ah.AsyncLocalStorage.new()
    local AR, S = ah.AsyncResource, ah.Snapshot
    local cases = {
      { function() local r = v:run(1, function() return als:run({}, nil) end); return r end, "bad argument #2 to 'run'" },
      { function() local r = v:run(1, function() return v:run(1, nil) end); return r end, "bad argument #2 to 'run'" },
      { function() local r = S.new():run(function() return AR.new("") end); return r end, "bad argument #1 to 'new'" },
      { function() local r = AR.new("R"):runInAsyncScope(function() return ah.AsyncLocal.new(5) end); return r end,
        "bad argument #1 to 'new'" },
      { function() local r = S.wrap(function() return ah.createHook(1) end)(); return r end, "bad argument #1 to 'createHook'" },
      { function() local r = als:run({}, function() return als.exit(1) end); return r end, "calling 'exit' on bad self" },
      { function() local r = v:run(1, function() return v.get(5) end); return r end, "calling 'get' on bad self" },
      { function() local r = AR.bind(function() return S.new():run(7) end)(); return r end, "bad argument #1 to 'run'" },
    }
    -- (each case keeps its own frame: `local r = ...; return r`, not a
    -- tail call, which would leave no user frame at all but pcall's)
    for i, c in ipairs(cases) do
      local msg = H.raised_here(c[1]) -- positioned at this file's line
      assert.matches(c[2], msg, 1, true, "case " .. i)
    end
  end)
end)

-- The name Lua's debug info gives a function (tracebacks, a logger that
-- prints its caller's name) comes from the instruction that called it: a
-- function the library runs gets the name a C caller gives, as under
-- pcall(f) or as a coroutine's body: none.
describe("the name of a function the library runs", function()
  local function name_of(...)
    local n = debug.getinfo(1, "n").name
    return n, select("#", ...)
  end
  local callable = setmetatable({}, { __call = function(_, ...) return name_of(...) end })

  it("is the one pcall gives: none", function()
    local plain = { select(2, pcall(name_of)) }
    assert.same({ nil, 0 }, plain)
    assert.same({ nil, 0 }, { select(2, pcall(callable)) })
    local v, als = ah.AsyncLocal.new(), ah.AsyncLocalStorage.new()
    local r = ah.AsyncResource.new("names")
    local cases = {
      { "AsyncLocal:run", function(f) return v:run(1, f, "a") end },
      { "AsyncLocalStorage:run", function(f) return als:run({}, f, "a") end },
      { "AsyncLocalStorage:exit", function(f) return als:exit(f, "a") end },
      { "AsyncLocalStorage.bind", function(f) return ah.AsyncLocalStorage.bind(f)("a") end },
      { "AsyncLocalStorage.snapshot", function(f) return ah.AsyncLocalStorage.snapshot()(f, "a") end },
      { "Snapshot:run", function(f) return ah.Snapshot.new():run(f, "a") end },
      { "Snapshot.wrap", function(f) return ah.Snapshot.wrap(f)("a") end },
      { "AsyncResource:runInAsyncScope", function(f) return r:runInAsyncScope(f, "a") end },
      { "AsyncResource:bind", function(f) return r:bind(f)("a") end },
      { "AsyncResource.bind", function(f) return ah.AsyncResource.bind(f)("a") end },
      { "async_hooks.coroutine.wrap", function(f) return co.wrap(f)("a") end, fn_only = true },
      { "async_hooks.coroutine.create", function(f) return select(2, co.resume(co.create(f), "a")) end, fn_only = true },
    }
    for _, c in ipairs(cases) do
      -- (each result kept in a local: `return c[2](f)` would be a tail call)
      local n, k = c[2](name_of)
      assert.same({ nil, 1 }, { n, k }, c[1])
      if not c.fn_only then
        n, k = c[2](callable)
        assert.same({ nil, 1 }, { n, k }, c[1] .. " (a callable table)")
      end
    end
    r:emitDestroy()
  end)
end)

-- at lua_close, code that runs after the
-- library's state was finalized (luv's loop finalizer runs pending
-- callbacks; finalizers of objects made before the library) read and wrote
-- past the slot array once it had grown, and leaked the destroy queue.
-- Under `make asan` the subprocess runs with AddressSanitizer and leak
-- detection: any memory error or leak fails its exit status.
describe("lua_close with library work left", function()
  local function run_closing(code)
    local path = H.tmpfile(code)
    local out, err = path .. ".out", path .. ".err"
    local asan = os.getenv("AH_ASAN") and ("detect_leaks=1:exitcode=23 LSAN_OPTIONS=suppressions="
      .. os.getenv("PWD") .. "/.ci/lsan.supp") or "detect_leaks=0"
    local ok, how, status = os.execute(("ASAN_OPTIONS=%s %s %s >%s 2>%s"):format(asan, H.lua_cmd(), path, out, err))
    local function slurp(p) local h = io.open(p); local s = h and h:read("a") or ""; if h then h:close() end; os.remove(p); return s end
    os.remove(path)
    return how == "exit" and status or -1, slurp(out), slurp(err), ok
  end
  local GROWN = [[
    KEEP = {}
    for i = 1, 100 do -- more live coroutines than the inline slots
      KEEP[i] = coroutine.create(function() coroutine.yield() end)
      coroutine.resume(KEEP[i])
    end
  ]]

  it("runs luv's pending callbacks (creating coroutines) without a memory error", function()
    H.child_ok("callback at close: req\n", run_closing([[
      local uv = require("luv")
      local ah = require("async_hooks").install()
      local v = ah.AsyncLocal.new()
      v:set("req")
    ]] .. GROWN .. [[
      uv.fs_stat("/", function()
        coroutine.wrap(function() io.stdout:write("callback at close: ", tostring(v:get()), "\n") end)()
      end)
    ]]))
  end)

  it("queues no destroy it would leak (pending tracked requests, a destroy hook)", function()
    H.child_ok(("x"):rep(20), run_closing([[
      local uv = require("luv")
      local ah = require("async_hooks").install()
      ah.createHook { destroy = function() end }:enable()
      local v = ah.AsyncLocal.new()
      v:set("x")
      for _ = 1, 20 do uv.fs_stat("/", function() io.stdout:write(tostring(v:get())) end) end
    ]]))
  end)

  it("lets a finalizer of an object made before the library create coroutines", function()
    H.child_ok("late: 1\n", run_closing([[
      EARLY = setmetatable({}, { __gc = function()
        local c = coroutine.create(function() return 1 end)
        io.stdout:write("late: ", tostring(select(2, coroutine.resume(c))), "\n")
      end })
      local ah = require("async_hooks").install()
      ah.AsyncLocal.new():set("x")
    ]] .. GROWN))
  end)
end)
