-- What luv prints for an uncaught error in a callback, on every runtime
-- the library supports (see spec/25-portable_spec.lua): the same program
-- with and without install() must write the same stderr.  The C core and
-- the pure-Lua backend with its C helper (async_hooks.luvcb) keep the
-- whole traceback; the pure-Lua backend alone keeps the message (its first
-- line).  `make test-purelua` runs this file with the helper on each
-- runtime and without it on some (ASYNC_HOOKS_LUVCB=1 / =0).
local uv = require("luv") -- on the main thread, before the library
local ah = require("async_hooks")
local H = require("helpers")
local P = require("support.portable")

local luvcb = ah.backend == "luv_lua" and require("async_hooks.backend.luv_lua").luvcb or nil
-- whether the traceback is kept whole here
local EXACT = ah.backend == "lua54" or luvcb ~= nil
local HOW = ah.backend == "lua54" and "the C core"
  or (luvcb and "the pure-Lua backend with its C helper" or "the pure-Lua backend alone")

-- (LuaJIT prints the address of the C function below the main chunk:
-- both runs without address randomization, where setarch can do it)
local NORAND = P.has_command("setarch") and "setarch -R " or ""

-- exit status and stderr of `body` run with `first` as its second line
-- (the first requires luv), both runs from the same file, so that the
-- chunk names and lines agree
local function run_program(path, first, body)
  local f = assert(io.open(path, "w"))
  f:write('local uv = require("luv")\n', first, "\n", body)
  f:close()
  local errpath = path .. ".err"
  local ok, how, status = os.execute(("ASAN_OPTIONS=detect_leaks=0 %s%s %s >/dev/null 2>%s")
    :format(NORAND, H.lua_cmd(), path, errpath))
  if type(ok) == "number" then -- Lua 5.1 and LuaJIT: the wait status
    how, status = "exit", ok >= 256 and math.floor(ok / 256) or ok
  end
  local h = assert(io.open(errpath))
  local err = h:read("*a")
  h:close()
  os.remove(errpath)
  if NORAND == "" then err = err:gsub("at 0x%x+", "at 0x?") end
  return how == "exit" and status or -1, err
end

-- the stderr of body without the library and with it (install() on the
-- line where the other run has a no-op), checked as this runtime keeps it
local function same_report(body, expect_message)
  local path = os.tmpname()
  local s0, plain = run_program(path, "local ah = nil", body)
  local s1, with = run_program(path, 'local ah = require("async_hooks").install()', body)
  os.remove(path)
  assert.are_not.equal(0, s0)
  assert.matches("^Uncaught Error: [^\n]*" .. expect_message, plain)
  assert.matches("\nstack traceback:\n", plain)
  assert.equal(s0, s1)
  if EXACT then
    assert.equal(plain, with)
  else
    assert.equal(plain:match("^[^\n]*\n"), with:match("^[^\n]*\n"))
  end
end

describe("an uncaught error in a luv callback on " .. P.RUNTIME .. ", " .. HOW, function()
  it("in a timer callback: the same stderr as without the library", function()
    same_report([[
      local t = uv.new_timer()
      local function fail(n) if n == 0 then error("timer boom") end; fail(n - 1) end
      t:start(1, 0, function() t:close(); fail(2) end)
      uv.run()
      print("not reached")
    ]], "timer boom")
  end)

  it("in an fs callback: the same stderr as without the library", function()
    same_report([[
      uv.fs_stat(".", function(err, st)
        local x = st and nil
        return x.field
      end)
      uv.run()
    ]], "attempt to index")
  end)

  it("in a coroutine the callback resumes (coroutine.wrap): the same stderr", function()
    same_report([[
      local t = uv.new_timer()
      t:start(1, 0, function()
        t:close()
        local w = coroutine.wrap(function() coroutine.yield(); error("in the coroutine") end)
        w()
        w()
      end)
      uv.run()
    ]], "in the coroutine")
  end)

  it("raised again from coroutine.resume's result, in a callback: the same stderr", function()
    same_report([[
      local t = uv.new_timer()
      t:start(1, 0, function()
        t:close()
        local co = coroutine.create(function() error("resumed") end)
        assert(coroutine.resume(co))
      end)
      uv.run()
    ]], "resumed")
  end)

  it("in an async callback (luv takes only a function there): the same stderr", function()
    same_report([[
      local a
      a = uv.new_async(function(x) a:close(); error("async " .. x) end)
      a:send("sent")
      uv.run()
    ]], "async sent")
  end)

  it("in a callback made in a context, with hooks: the same stderr", function()
    same_report([[
      local ok, lib = pcall(require, "async_hooks")
      local v = lib.AsyncLocal.new()
      lib.createHook { before = function() end, after = function() end }:enable()
      local t = uv.new_timer()
      v:run("ctx", function()
        t:start(1, 0, function() t:close(); error("in context " .. tostring(ok)) end)
      end)
      uv.run()
    ]], "in context true")
  end)

  it("in a callback registered before install(): the same stderr", function()
    -- (luv's own callback, which the library did not wrap, goes through
    -- untouched)
    local path = os.tmpname()
    local body = [[
      local t = uv.new_timer()
      t:start(1, 0, function() t:close(); error("registered first") end)
      %s
      uv.run()
    ]]
    local s0, plain = run_program(path, "", body:format("local ah = nil"))
    local s1, with = run_program(path, "", body:format('local ah = require("async_hooks").install()'))
    os.remove(path)
    assert.matches("^Uncaught Error: [^\n]*registered first\n", plain)
    assert.equal(s0, s1)
    if EXACT then assert.equal(plain, with) end
  end)
end)

describe("luv's no-exit flags on " .. P.RUNTIME .. ", " .. HOW, function()
  local track = H.installed_each()

  -- luv's LUVF_CALLBACK_* flags on every callback, where a test can set them
  local function set_flags(n)
    if ah.backend == "lua54" then
      require("async_hooks.core").luv_flags(n)
      return true
    end
    if luvcb then
      luvcb.flags(n)
      return true
    end
  end

  it("the context is restored after a callback's error that luv reports and survives", function()
    if not set_flags(1 + 4) then -- no exit, no message
      pending("no way to set luv's flags: the pure-Lua backend without its C helper")
      return
    end
    local v = ah.AsyncLocal.new { default = "outside" }
    local log = {}
    track(ah.createHook {
      before = function() log[#log + 1] = "before" end,
      after = function() log[#log + 1] = "after" end,
    }):enable()
    local seen = {}
    local ok, e = pcall(function()
      local t, t2 = uv.new_timer(), uv.new_timer()
      v:run("outer", function()
        t:start(1, 0, function()
          t:close()
          v:run("inner", function()
            t2:start(1, 0, function() t2:close(); seen[#seen + 1] = v:get(); error("inner boom") end)
          end)
          uv.run() -- nested: its callback's error leaves this callback's context
          seen[#seen + 1] = v:get()
          error("outer boom")
        end)
      end)
      uv.run()
    end)
    set_flags(0)
    assert(ok, e)
    assert.same({ "inner", "outer" }, seen)
    assert.equal("outside", v:get())
    assert.equal(1, ah.executionAsyncId())
    assert.same({ "before", "before", "after", "after" }, log)
  end)
end)

describe("the C helper (async_hooks.luvcb) on " .. P.RUNTIME, function()
  local function need_helper()
    if luvcb then return true end
    pending(ah.backend == "lua54" and "the C core has no helper"
      or os.getenv("ASYNC_HOOKS_LUVCB") == "0" and "the C helper is turned off (ASYNC_HOOKS_LUVCB=0)"
      or "the C helper is not built for this runtime")
  end

  -- a copy of the helper's library in a file of its own: loaded with
  -- package.loadlib, a separate module with its own state (the caller
  -- removes the file)
  local function helper_copy()
    local file
    for template in package.cpath:gmatch("[^;]+") do
      local path = template:gsub("%?", "async_hooks/luvcb")
      local f = io.open(path, "rb")
      if f then
        file = f:read("*a")
        f:close()
        break
      end
    end
    assert(file, "the helper's file is not on package.cpath")
    local copy = os.tmpname() .. ".so"
    local f = assert(io.open(copy, "wb"))
    f:write(file)
    f:close()
    return copy
  end

  it("install() puts it in front of luv's cb_pcall, uninstall() gives luv's back", function()
    if not need_helper() then return end
    assert.is_false(luvcb.attached())
    ah.install()
    assert.is_true(luvcb.attached())
    ah.uninstall()
    assert.is_false(luvcb.attached())
    ah.install()
    assert.is_true(luvcb.attached())
    ah.uninstall()
    assert.is_false(luvcb.attached())
  end)

  it("a luv thread's own Lua state with the helper, next to the main state's", function()
    if not need_helper() then return end
    -- (each state's callbacks find that state's helper: two timer chains
    -- at once, each checking its value at every step)
    local out = H.lua_ok([[
      local uv = require("luv")
      local function body(name, n, path, cpath)
        if path then package.path, package.cpath = path, cpath end
        local uv = require("luv")
        local ah = require("async_hooks").install()
        local v = ah.AsyncLocal.new()
        local t = uv.new_timer()
        local left, bad = n, 0
        local function step()
          if v:get() ~= name then bad = bad + 1 end
          left = left - 1
          if left == 0 then t:close() else t:start(0, 0, step) end
        end
        v:run(name, function() t:start(0, 0, step) end)
        uv.run()
        local attached = require("async_hooks.backend.luv_lua").luvcb.attached()
        -- (one write per state, the main state's after the join: the two
        -- lines do not interleave)
        local line = name .. " " .. tostring(attached) .. " " .. bad .. "\n"
        if path then io.write(line) end
        return line
      end
      local th = uv.new_thread(body, "thread", 20000, package.path, package.cpath)
      local line = body("main", 20000)
      th:join()
      io.write(line)
    ]], nil)
    local lines = {}
    for line in out:gmatch("[^\n]+") do lines[#lines + 1] = line end
    table.sort(lines)
    assert.same({ "main true 0", "thread true 0" }, lines)
  end)

  it("a second luv table: one helper for both, the context kept in each", function()
    if not need_helper() then return end
    H.lua_ok([[
      local uv = require("luv")
      local ah = require("async_hooks").install()
      local cb = require("async_hooks.luvcb")
      package.loaded.luv = nil
      local uv2 = require("luv")
      assert(uv2 ~= uv)
      ah.install { luv = uv2 }
      print(cb.attached())
      local v = ah.AsyncLocal.new()
      local t, t2 = uv.new_timer(), uv2.new_timer()
      v:run("first", function() t:start(1, 0, function() print(v:get()); t:close() end) end)
      v:run("second", function() t2:start(2, 0, function() print(v:get()); t2:close() end) end)
      uv2.run()
      ah.uninstall()
      print(cb.attached())
    ]], { "true", "first", "second", "false" })
  end)

  it("an error of enter or leave is luv's to report; leave runs after the callback's error", function()
    if not need_helper() then return end
    -- (a record of a metatable of the test's own, and enter and leave that
    -- fail where told to; luv's no-exit flag keeps the process going)
    local program = [[
      local uv = require("luv")
      local cb = require("async_hooks.luvcb")
      local MT = { __call = function() print("__call: not expected") end }
      local mode = %q
      local function enter(rec)
        if mode == "enter" then error("enter fails") end
        return rec, "prev", function(...)
          print("callback", select("#", ...))
          if mode == "callback" then error("callback fails") end
        end
      end
      local function leave(_, prev, ok)
        print("leave", prev, ok)
        if mode == "leave" then error("leave fails") end
      end
      assert(cb.attach(enter, leave, MT, {}))
      cb.flags(1)
      local t = uv.new_timer()
      t:start(1, 0, setmetatable({}, MT))
      uv.run("once")
      t:close()
      uv.run()
      print("end")
    ]]
    for mode, want in pairs {
      enter = { "end" },
      leave = { "callback\t0", "leave\tprev\ttrue", "end" },
      callback = { "callback\t0", "leave\tprev\tfalse", "end" },
      none = { "callback\t0", "leave\tprev\ttrue", "end" },
    } do
      local status, out, err = H.run_lua(program:format(mode))
      assert.equal(0, status)
      assert.equal(table.concat(want, "\n") .. "\n", out)
      if mode == "none" then
        assert.equal("", err)
      else
        assert.matches("^Uncaught Error: [^\n]*: " .. mode .. " fails\n", err)
      end
    end
  end)

  it("uninstall() and install() again behind a cb_pcall put in front of the helper's later", function()
    if not need_helper() then return end
    -- (a second copy of the helper's library chains to the first one)
    local copy = helper_copy()
    local status, out, err = H.run_lua(([[
      local uv = require("luv")
      local ah = require("async_hooks").install()
      local other = assert(package.loadlib(%q, "luaopen_async_hooks_luvcb"))()
      local function f() end
      assert(other.attach(f, f, {}, {}))
      local v = ah.AsyncLocal.new()
      local function tick(what)
        local t = uv.new_timer()
        v:run(what, function() t:start(1, 0, function() print(v:get()); t:close() end) end)
        uv.run()
      end
      tick("behind")
      ah.uninstall()
      ah.install()
      tick("again")
      other.detach()
      tick("alone")
    ]]):format(copy))
    os.remove(copy)
    assert.equal("", err)
    assert.equal(0, status)
    assert.equal("behind\nagain\nalone\n", out)
  end)

  it("a cb_pcall behind the helper's gets the callbacks it cannot take for want of stack", function()
    if not need_helper() then return end
    -- (a copy of the helper attached between luv's cb_pcall and the
    -- helper's, adding luv's no-exit flag: a callback's error must go
    -- through it with the stack nearly full too.  uv.run's 7995 arguments
    -- leave its frame too little room on Lua 5.1 and LuaJIT, whose limit
    -- is 8000 slots a C frame; the other runtimes have room)
    local copy = helper_copy()
    local status, out, err = H.run_lua(([[
      local uv = require("luv")
      local unpack = unpack or table.unpack
      local ah = require("async_hooks")
      ah.install()
      ah.uninstall()
      local other = assert(package.loadlib(%q, "luaopen_async_hooks_luvcb"))()
      local function f() end
      assert(other.attach(f, f, {}, {}))
      other.flags(1)
      ah.install()
      local function tick(n)
        local t = uv.new_timer()
        t:start(1, 0, function() t:close(); error("boom " .. n) end)
        local args = { "default" }
        for i = 2, n do args[i] = "x" end
        uv.run(unpack(args, 1, n))
        print("survived " .. n)
      end
      tick(1)
      tick(7995)
    ]]):format(copy))
    os.remove(copy)
    assert.equal(0, status, err)
    assert.equal("survived 1\nsurvived 7995\n", out)
    assert.matches("^Uncaught Error: [^\n]*boom 1\n", err)
    assert.matches("\nUncaught Error: [^\n]*boom 7995\n", err)
  end)

  it("leaves a uv.run that is a C function with upvalues to the Lua wrapper", function()
    if not need_helper() then return end
    -- (the helper's run calls luv's as C with its own upvalues; a
    -- coroutine.wrap function has some of its own)
    H.lua_ok([[
      local uv = require("luv")
      local unpack = unpack or table.unpack
      local run = uv.run
      uv.run = coroutine.wrap(function(...)
        local args = { ... }
        while true do args = { coroutine.yield(run(unpack(args))) } end
      end)
      require("async_hooks").install()
      local t = uv.new_timer()
      t:start(1, 0, function() print("tick"); t:close() end)
      print(pcall(uv.run))
    ]], { "tick", "true\tfalse" })
  end)

  it("flags() in a Lua state it is not attached to: an error that says so", function()
    if not need_helper() then return end
    H.lua_ok([[
      local cb = require("async_hooks.luvcb")
      print(pcall(cb.flags, 1))
      print(pcall(cb.flags, "x") == false)
    ]], { "false\tasync_hooks.luvcb: flags() before attach() in this Lua state", "true" })
  end)

  it("stays out when registry.luv_context is not luv's context", function()
    if not need_helper() then return end
    H.lua_ok([[
      local cb = require("async_hooks.luvcb")
      local function f() end
      print(cb.attach(f, f, {}, {}))
      debug.getregistry().luv_context = io.stdout
      print(cb.attach(f, f, {}, {}))
      print(cb.attached())
    ]], {
      "nil\tluv is not loaded in this Lua state (no registry.luv_context)",
      "nil\tregistry.luv_context is not the context of luv 1.42 or later",
      "false",
    })
  end)
end)
