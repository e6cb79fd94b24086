-- Errors raised while a hook is dispatched that are not the hook's own: a
-- stack overflow (C or Lua), an out-of-memory error (tests/failalloc.c, in
-- spec/11), an error raised by a debug hook (debug.sethook).  They never
-- end the process: each surfaces as a catchable error from the operation
-- that dispatched, with the library's state consistent.  A hook's own error
-- stays fatal (spec/04).  Every case runs in a process of its own.
local H = require("helpers")

-- What every script starts with: the library installed, a recording hook
-- (its functions in `hooks`), trap(fn, msg) and check().
--  * trap(fn, msg[, id[, thread]]): a debug hook ("call" events, on the
--    running thread or on thread) raises msg the next time fn is called
--    (with id as its first argument, if given), i.e. inside the dispatch
--    that calls the hook fn: an error that is not the hook's own, where
--    the test wants it;
--  * check(): the state after a failure: top-level ids, nothing active, no
--    dispatch open, the value as it was; then a coroutine, a scope and a
--    resource whose events are balanced and in order.
local PRELUDE = [[
local ah = require("async_hooks").install()
local core = require("async_hooks.core")
local v = ah.AsyncLocal.new { default = "d" }
v:set("top")
local log = {}
local function note(ev) return function(id) log[#log + 1] = ev .. " " .. id end end
local hooks = { init = function(id) log[#log + 1] = "init " .. id end,
  before = note("before"), after = note("after"), destroy = note("destroy") }
local hook = ah.createHook(hooks):enable()
local function trap(fn, msg, id, thread)
  local armed = true
  local function dbg()
    if armed and debug.getinfo(2, "f").func == fn and (id == nil or select(2, debug.getlocal(2, 1)) == id) then
      armed = false
      error(msg, 0)
    end
  end
  if thread then debug.sethook(thread, dbg, "c") else debug.sethook(dbg, "c") end
end
local function untrap(thread) if thread then debug.sethook(thread) else debug.sethook() end end
local function check()
  untrap()
  collectgarbage()
  collectgarbage()
  core.flush() -- what the failures left queued (the destroys of collected resources)
  assert(ah.executionAsyncId() == 1, "executionAsyncId " .. ah.executionAsyncId())
  assert(ah.triggerAsyncId() == 0, "triggerAsyncId " .. ah.triggerAsyncId())
  assert(v:get() == "top", "value " .. tostring(v:get()))
  local st = core.stats()
  assert(st.active == 0 and st.dispatching == 0, "active " .. st.active .. ", dispatching " .. st.dispatching)
  log = {}
  local c = coroutine.create(function() v:set("in"); coroutine.yield(ah.executionAsyncId()); return v:get() end)
  local cid = select(2, coroutine.resume(c))
  assert(select(2, coroutine.resume(c)) == "in")
  local r = ah.AsyncResource.new("R", { requireManualDestroy = true })
  assert(r:runInAsyncScope(function() return ah.executionAsyncId() end) == r:asyncId())
  r:emitDestroy()
  local want = { "init " .. cid, "before " .. cid, "after " .. cid, "before " .. cid, "after " .. cid,
    "destroy " .. cid, "init " .. r:asyncId(), "before " .. r:asyncId(), "after " .. r:asyncId(),
    "destroy " .. r:asyncId() }
  assert(table.concat(log, ",") == table.concat(want, ","), table.concat(log, ","))
  assert(v:get() == "top" and ah.executionAsyncId() == 1)
  print("consistent")
end
]]

local function run(code)
  return H.run_lua(PRELUDE .. code)
end

-- the script ran to its end: its output, status 0, nothing on stderr
local function completes(code, out)
  H.lua_ok(PRELUDE .. code, out)
end

-- the first value of pcall(f, ...) and the error, as one line
local PCALL = [[
local function try(f, ...)
  local ok, e = pcall(f, ...)
  print(ok, ok and "" or tostring(e))
end
]]

describe("an error raised by a debug hook inside a hook's dispatch", function()
  it("is raised by create and wrap (init); the coroutine is registered all the same", function()
    completes(PCALL .. [[
      trap(hooks.init, "trapped")
      try(coroutine.create, function() end)
      trap(hooks.init, "trapped")
      try(coroutine.wrap, function() end)
      collectgarbage() collectgarbage()
      check()
    ]], "false\ttrapped\nfalse\ttrapped\nconsistent\n")
  end)

  it("is raised by resume (before): the coroutine does not run and stays suspended", function()
    completes(PCALL .. [[
      local ran = 0
      local c = coroutine.create(function() ran = ran + 1; coroutine.yield(); ran = ran + 1 end)
      trap(hooks.before, "trapped")
      try(coroutine.resume, c)
      print(ran, coroutine.status(c))
      assert(coroutine.resume(c))
      trap(hooks.before, "trapped")
      try(coroutine.resume, c)
      print(ran, coroutine.status(c))
      assert(coroutine.resume(c))
      print(ran, coroutine.status(c))
      check()
    ]], "false\ttrapped\n0\tsuspended\nfalse\ttrapped\n1\tsuspended\n2\tdead\nconsistent\n")
  end)

  it("is raised by resume (after) once the slice is over: yielded, returned or failed", function()
    completes(PCALL .. [[
      local c = coroutine.create(function() coroutine.yield(1); return 2 end)
      trap(hooks.after, "trapped")
      try(coroutine.resume, c)
      print(coroutine.status(c))
      trap(hooks.after, "trapped")
      try(coroutine.resume, c)
      print(coroutine.status(c))
      local f = coroutine.create(function() error("its own", 0) end)
      trap(hooks.after, "trapped")
      try(coroutine.resume, f)
      print(coroutine.status(f))
      check()
    ]], "false\ttrapped\nsuspended\nfalse\ttrapped\ndead\nfalse\ttrapped\ndead\nconsistent\n")
  end)

  it("is raised by a wrapped coroutine's call (before, after)", function()
    completes(PCALL .. [[
      local ran = 0
      local w = coroutine.wrap(function() while true do ran = ran + 1; coroutine.yield() end end)
      trap(hooks.before, "trapped")
      try(w)
      trap(hooks.after, "trapped")
      try(w)
      try(w)
      print(ran)
      check()
    ]], "false\ttrapped\nfalse\ttrapped\ntrue\t\n2\nconsistent\n")
  end)

  it("is raised by a wrapped coroutine's call (after) once the coroutine that raised is closed", function()
    -- as wrap does: the to-be-closed variables of a coroutine that raised
    -- are closed before its call raises
    completes(PCALL .. [[
      local w = coroutine.wrap(function()
        local x <close> = setmetatable({}, { __close = function() print("closed", ah.executionAsyncId() ~= 1) end })
        error("its own", 0)
      end)
      trap(hooks.after, "trapped")
      try(w)
      check()
    ]], "closed\ttrue\nfalse\ttrapped\nconsistent\n")
  end)

  it("is raised by runInAsyncScope (before: fn does not run; after: once the scope is left)", function()
    completes(PCALL .. [[
      local r = ah.AsyncResource.new("R")
      local ran = 0
      local function fn() ran = ran + 1; v:set("inside"); return ah.executionAsyncId() end
      trap(hooks.before, "trapped")
      try(r.runInAsyncScope, r, fn)
      trap(hooks.after, "trapped")
      try(r.runInAsyncScope, r, fn)
      print(ran, v:get(), ah.executionAsyncId())
      try(r.runInAsyncScope, r, fn)
      print(ran)
      check()
    ]], "false\ttrapped\nfalse\ttrapped\n1\ttop\t1\ntrue\t\n2\nconsistent\n")
  end)

  it("is raised by the resume of a coroutine with a scope open across its yield", function()
    completes(PCALL .. [[
      local r = ah.AsyncResource.new("R")
      local c = coroutine.create(function()
        r:runInAsyncScope(function() coroutine.yield(); coroutine.yield() end)
        return "done"
      end)
      local R, C = r:asyncId(), nil
      assert(coroutine.resume(c))
      log = {}
      -- the scope's before at the next slice: the coroutine does not run,
      -- and both get their after
      trap(hooks.before, "trapped", R)
      try(coroutine.resume, c)
      C = log[1]:match("%d+")
      print(table.concat(log, " "):gsub(R, "R"):gsub(C, "C"), coroutine.status(c))
      log = {}
      -- the scope's after at the yield: raised once the slice is over
      trap(hooks.after, "trapped", R)
      try(coroutine.resume, c)
      print(table.concat(log, " "):gsub(R, "R"):gsub(C, "C"), coroutine.status(c))
      print(select(2, coroutine.resume(c)))
      check()
    ]], "false\ttrapped\nbefore C after R after C\tsuspended\n" .. -- (r's before: trapped at its call)
      "false\ttrapped\nbefore C before R after C\tsuspended\ndone\nconsistent\n")
  end)

  it("is raised by AsyncResource.new (init) and emitDestroy (destroy)", function()
    completes(PCALL .. [[
      trap(hooks.init, "trapped")
      try(ah.AsyncResource.new, "R")
      local r = ah.AsyncResource.new("R", { requireManualDestroy = true })
      trap(hooks.destroy, "trapped")
      try(r.emitDestroy, r)
      try(r.emitDestroy, r) -- once only
      -- one destroyed when collected too: the failed emitDestroy was its
      -- destroy (trapped at the hook's call: not logged), no second one
      local r2 = ah.AsyncResource.new("R2")
      local id2 = r2:asyncId()
      trap(hooks.destroy, "trapped")
      try(r2.emitDestroy, r2)
      r2 = nil
      collectgarbage()
      collectgarbage()
      core.flush()
      print((table.concat(log, ","):find("destroy " .. id2, 1, true)))
      check()
    ]], "false\ttrapped\nfalse\ttrapped\ntrue\t\nfalse\ttrapped\nnil\nconsistent\n")
  end)

  it("is raised by coroutine.close, once closed, when a queued destroy fails", function()
    completes(PCALL .. [[
      local c = coroutine.create(function() coroutine.yield() end)
      assert(coroutine.resume(c))
      trap(hooks.destroy, "trapped")
      try(coroutine.close, c)
      print(coroutine.status(c))
      check()
    ]], "false\ttrapped\ndead\nconsistent\n")
  end)

  it("is raised by the resume and the close that adopt a thread the library did not create (init)", function()
    -- (coroutine.create saved before install(): a thread made behind the
    -- library's back)
    H.lua_ok("local raw_create = coroutine.create\n" .. PRELUDE .. PCALL .. [[
      local got = {}
      local c = raw_create(function(...) got[#got + 1] = table.concat({ ... }, " "); coroutine.yield() end)
      trap(hooks.init, "trapped")
      try(coroutine.resume, c, "a", "b")
      print(#got, coroutine.status(c), #log) -- it did not run; its init (trapped at the call) is not logged
      assert(coroutine.resume(c, "a", "b")) -- adopted: a coroutine like any other
      print(got[1], coroutine.status(c), log[1]:match("^before") ~= nil)
      local d = raw_create(function() coroutine.yield() end)
      trap(hooks.init, "trapped")
      try(coroutine.close, d)
      print(coroutine.status(d))
      assert(coroutine.resume(c))
      check()
    ]], {
      { "resume's pcall: false", "error: trapped" },
      { "the body's runs: 0", "status: suspended", "events logged: 0" },
      { "arguments: a b", "status: suspended", "a before logged first: true" },
      { "close's pcall: false", "error: trapped" },
      { "status: dead" },
      "consistent",
    })
  end)

  it("reaches the other hooks of the list: the event is delivered, its after follows", function()
    completes(PCALL .. [[
      local got = {}
      local second = ah.createHook {
        before = function(id) got[#got + 1] = "before" end,
        after = function(id) got[#got + 1] = "after" end,
      }:enable()
      local c = coroutine.create(function() end)
      trap(hooks.before, "trapped")
      try(coroutine.resume, c)
      print(table.concat(got, " "), coroutine.status(c))
      second:disable()
      check()
    ]], "false\ttrapped\nbefore after\tsuspended\nconsistent\n")
  end)

  it("keeps its nature through an operation called by a hook (not the hook's own)", function()
    completes(PCALL .. [[
      local r = ah.AsyncResource.new("R")
      local outer = ah.createHook {
        init = function(id, type_)
          if type_ == "coroutine" then r:runInAsyncScope(function() end) end
        end,
      }:enable()
      trap(hooks.before, "trapped") -- r's before, inside the init of the coroutine
      try(coroutine.create, function() end)
      outer:disable()
      -- through wrap, which positions the error again
      local th
      local inner = coroutine.wrap(function()
        th = coroutine.running()
        while true do coroutine.yield(); coroutine.create(print) end
      end)
      inner()
      local outer2 = ah.createHook {
        before = function(id) if id == r:asyncId() then inner() end end,
      }:enable()
      trap(hooks.init, "trapped", nil, th) -- inside inner
      print((select(2, pcall(r.runInAsyncScope, r, function() end)):gsub("^[^:]*:%d+: ", "WHERE: ")))
      outer2:disable()
      check()
    ]], "false\ttrapped\nWHERE: trapped\nconsistent\n")
  end)
end)

describe("an error raised by a debug hook inside a luv callback's hooks", function()
  -- (luv is not required here: it must be required on the main thread, by
  -- the spec that uses it in this process)
  local has_luv = package.searchpath("luv", package.cpath) ~= nil
  local function luv_run(code)
    return H.run_lua('local uv = require("luv")\n' .. PRELUDE .. code)
  end

  it("is the callback's error: luv reports it as it reports a callback's own", function()
    if not has_luv then return end
    local plain_status, _, plain_err = H.run_lua([[
      local uv = require("luv")
      uv.new_timer():start(0, 0, function() error("trapped", 0) end)
      uv.run()
    ]])
    for _, kind in ipairs { "before", "after" } do
      local status, out, err = luv_run(([[
        local t = uv.new_timer()
        v:run("cb", function() t:start(0, 0, function() print("callback ran") end) end)
        trap(hooks.%s, "trapped")
        uv.run()
        print("not reached")
      ]]):format(kind))
      assert.equal(plain_status, status, kind)
      assert.equal(kind == "after" and "callback ran\n" or "", out, kind)
      assert.matches("^Uncaught Error: trapped", err, kind)
      assert.equal(plain_err:match("^[^\n]*"), err:match("^[^\n]*"), kind)
      assert.not_matches("fatal", err, kind)
    end
  end)

  it("leaves the loop and the context consistent when luv is told not to exit", function()
    if not has_luv then return end
    H.lua_ok('local uv = require("luv")\n' .. PRELUDE .. [[
      core.luv_flags(1 + 4) -- luv: no exit, no message
      local t, t2 = uv.new_timer(), uv.new_timer()
      local ran = {}
      for _, kind in ipairs { "before", "after", "destroy" } do
        v:run("cb", function()
          t:start(0, 0, function() ran[#ran + 1] = kind .. " " .. v:get() end)
        end)
        trap(hooks[kind], "trapped")
        uv.run()
        untrap()
      end
      print(table.concat(ran, ", "))
      -- the slow path: the loop run by a coroutine (luv calls back on the
      -- main thread, outside the library's uv.run there)
      for _, kind in ipairs { "before", "after" } do
        v:run("co", function() t:start(0, 0, function() ran[#ran + 1] = "slow " .. kind .. " " .. v:get() end) end)
        local main = coroutine.running()
        coroutine.wrap(function() trap(hooks[kind], "trapped", nil, main); uv.run() end)()
        untrap()
      end
      print(table.concat(ran, ", ", 3))
      print(#ran)
      core.luv_flags(0)
      t:close()
      t2:close()
      uv.run()
      check()
    ]], { "after cb, destroy cb", "slow after co", "3", "consistent" })
  end)

  it("is the callback's error when luv calls a record itself (after uninstall)", function()
    if not has_luv then return end
    local status, out, err = luv_run([[
      local t = uv.new_timer()
      v:run("cb", function() t:start(0, 0, function() print("callback ran") end) end)
      ah.uninstall()
      trap(hooks.before, "trapped")
      uv.run()
      print("not reached")
    ]])
    assert.equal("", out)
    assert.matches("^Uncaught Error: trapped", err)
    assert.not_equal(0, status)
    assert.not_matches("fatal", err)
  end)

  it("is raised by the registration (init), which is made all the same", function()
    if not has_luv then return end
    completes('local uv = require("luv")\n' .. PCALL .. [[
      local t = uv.new_timer()
      local got
      trap(hooks.init, "trapped")
      v:run("cb", function() try(t.start, t, 0, 0, function() got = v:get() end) end)
      uv.run()
      print(got)
      t:close()
      uv.run()
      check()
    ]], "false\ttrapped\ncb\nconsistent\n")
  end)
end)

-- the programs of the reports, each with hooks of one kind or of all kinds
-- enabled: their output and status as without the library
local function same_as_plain(program, kinds_code)
  local plain_status, plain_out, plain_err = H.run_lua(program)
  assert.equal(0, plain_status, plain_err)
  for _, kinds in ipairs { "init", "before", "after", "destroy", "init before after destroy" } do
    local hooks = {}
    for k in kinds:gmatch("%a+") do hooks[#hooks + 1] = k .. " = " .. kinds_code end
    H.lua_ok(([[
      local ah = require("async_hooks").install()
      ah.AsyncLocal.new():set("a value")
      ah.createHook { %s }:enable()
    ]]):format(table.concat(hooks, ", ")) .. program, plain_out, kinds)
  end
end

describe("a stack overflow inside a hook's dispatch #slow", function()
  it("C: coroutines nested until the C stack is full print Lua's message (empty hooks)", function()
    same_as_plain([[
      local function f() local co = coroutine.create(f); local ok, e = coroutine.resume(co); return e end
      print(f())
    ]], "function() end")
  end)

  it("C: resume returns it when the C stack is full at the coroutine's before", function()
    H.lua_ok(PRELUDE .. [[
      hook:disable()
      ah.createHook { before = function() end }:enable()
      local depth, got = 0, nil
      local function f()
        depth = depth + 1
        local co = coroutine.create(f)
        local ok, e = coroutine.resume(co)
        if not ok and got == nil then got = { depth, e, coroutine.status(co) } end
        return e
      end
      f()
      print(got[2], got[3])
    ]], { { "error: C stack overflow", "status: suspended" } })
  end)

  it("Lua: a recursion that makes coroutines overflows the same way when it lands in a hook", function()
    -- the hook calls a C function: the overflow comes where that call
    -- needs stack; the message says where it was raised
    local program = [[
      local function r(n) local co = coroutine.create(function() end); coroutine.resume(co); return 1 + r(n + 1) end
      local ok, e = pcall(r, 1)
      print(ok, (e:gsub("^.-:%d+: ", "")))
    ]]
    same_as_plain(program, "function(...) select('#', ...) end")
    same_as_plain(program, "function(id) string.format('%d', id) end")
  end)
end)

describe("a debug hook's error (the instruction-budget sandbox) #slow", function()
  it("ends the sandboxed coroutine as without the library, wherever the count lands", function()
    for _, count in ipairs { 100, 1000, 1237 } do
      same_as_plain(([[
        local co = coroutine.create(function()
          for i = 1, 1e7 do local c = coroutine.create(function() end); coroutine.resume(c) end
        end)
        debug.sethook(co, function() error("budget") end, "", %d)
        local ok, e = coroutine.resume(co)
        print(ok, (e:gsub("^.-:%%d+: ", "")), coroutine.status(co))
      ]]):format(count), "function(id) local x = 0; for i = 1, 50 do x = x + i end end")
    end
  end)
end)

-- Lua 5.4.4's own test files whose stack-overflow cases made the library
-- exit (with hooks enabled, even empty ones)
describe("Lua 5.4.4's test files with hooks enabled #slow", function()
  local dir = "../shared/external/lua-5.4.4-tests"
  local present = io.open(dir .. "/coroutine.lua") ~= nil
  for _, file in ipairs { "coroutine", "errors", "cstack" } do
    it(file .. ".lua passes", function()
      if not present then
        print("\n  skipped: " .. dir .. " is absent")
        return
      end
      local prelude = [[local ah = require("async_hooks").install(); ah.AsyncLocal.new():set("x"); ]] ..
        [[local function h(...) select("#", ...) end; ]] ..
        [[ah.createHook { init = h, before = h, after = h, destroy = h }:enable()]]
      local cmd = ("cd %s && ASAN_OPTIONS=detect_leaks=0 %s -e '%s' %s.lua 2>&1")
        :format(dir, H.lua_cmd(), prelude, file)
      local p = io.popen(cmd)
      local out = p:read("a")
      local ok = p:close()
      assert.is_true(ok, out)
      assert.not_matches("fatal", out)
    end)
  end
end)

describe("a hook's own error", function()
  -- (the message handler looks for a debug hook between the raise and the
  -- hook only: one that called the operation does not count)
  for _, alone in ipairs { true, false } do
    local hooks = alone and "the only init hook" or "one of two init hooks"
    it("is fatal also when the operation runs inside a debug hook (" .. hooks .. ")", function()
      local status, out, err = run(([[
        if %s then hook:disable() end
        ah.createHook { init = function() error("its own") end }:enable()
        debug.sethook(function()
          debug.sethook()
          coroutine.create(function() end)
        end, "", 1)
        print("not reached")
      ]]):format(tostring(alone)))
      assert.equal(1, status)
      assert.equal("", out)
      assert.matches("async_hooks: error in init hook %(fatal%): .-its own", err)
      assert.matches("stack traceback", err)
    end)
  end

  it("is fatal when raised past a tail call of the hook, inside a debug hook", function()
    local status, _, err = run([[
      hook:disable()
      local function deep() error("its own") end
      ah.createHook { before = function() return deep() end }:enable()
      local c = coroutine.create(function() end)
      debug.sethook(function() debug.sethook(); coroutine.resume(c) end, "", 1)
      print("not reached")
    ]])
    assert.equal(1, status)
    assert.matches("async_hooks: error in before hook %(fatal%): .-its own", err)
  end)
end)

-- The OpenResty backend has its own dispatch (ngx_hooks.lua, plain Lua for
-- LuaJIT) with the same rule; its classification and its dispatch run here
-- without nginx, under this Lua and under LuaJIT when there is one.
describe("the OpenResty backend's dispatch (ngx_hooks.lua)", function()
  local root = debug.getinfo(1, "S").source:sub(2):gsub("spec/17%-hook_errors_spec%.lua$", "")
  local SCRIPT = [[
    package.path = %q .. "lua/?.lua;" .. package.path
    io.stdout:setvbuf("no")
    local M = require("async_hooks.backend.ngx_hooks")
    for _, e in ipairs { "C stack overflow", "stack overflow", "x.lua:3: stack overflow",
      "stack overflow (too many arguments)", "a:1: b:2: not enough memory", "error in error handling",
      "my stack overflow", "stack overflow x", "x.lua:3: budget", 42 } do
      io.write(tostring(M.limit_message(e)), " ")
    end
    print()
    -- where the error was raised, from a message handler
    local function where(f, stop)
      local got
      xpcall(f, function() got = M.in_debug_hook(2, stop) end)
      return got
    end
    -- (call hooks: LuaJIT runs no count hook inside compiled code; a debug
    -- hook that stays set, as a sandbox's does)
    local function once(f)
      local armed = true
      return function() if armed then armed = false; f() end end
    end
    local function budget() debug.sethook(once(function() error("budget") end), "c"); tostring(1) end
    local function own() error("own") end
    local function hook_calls_own() debug.sethook(once(own), "c"); tostring(1) end
    print(where(function() error("own") end), where(budget), where(hook_calls_own, { own }))
    debug.sethook()
    if not newproxy then return end
    -- the dispatch itself (M.new needs newproxy: LuaJIT, 5.1)
    local counts
    local H = M.new({}, function(...) counts = { ... } end)
    local log = {}
    local trapped = false
    local h1 = { before = function(id)
      if trapped then
        trapped = false
        debug.sethook(once(function() error("budget", 0) end), "c")
        tostring(id)
      end
      log[#log + 1] = "h1 " .. id
    end }
    local h2 = { before = function(id) log[#log + 1] = "h2 " .. id end }
    H.hook_enable(h1)
    H.hook_enable(h2)
    trapped = true
    print(H.emit_before(7))
    debug.sethook()
    print(table.concat(log, " "))
    H.hook_enable { init = function()
      debug.sethook(once(function() error("budget", 0) end), "c")
      tostring(1)
    end }
    print(pcall(H.emit_init, 8, "T", 1, {})) -- raised by init
    debug.sethook()
    H.hook_enable { destroy = function() error("its own") end }
    H.emit_destroy(9)
    print("not reached")
  ]]

  local function check(lua)
    local script = os.tmpname()
    local f = assert(io.open(script, "w"))
    f:write(SCRIPT:format(root))
    f:close()
    local p = io.popen(("%s %s 2>&1"):format(lua, script))
    local out = p:read("a")
    local ok, _, status = p:close()
    os.remove(script)
    if lua == "luajit" then -- the hook's own error: fatal
      assert.equal(1, status, out)
      assert.matches("async_hooks: error in destroy hook %(fatal%): .-its own", out)
    else
      assert.is_true(ok, out)
    end
    local lines = {}
    for l in out:gmatch("[^\n]+") do lines[#lines + 1] = l end
    assert.equal("true true true true true true false false false false ", lines[1])
    assert.equal("false\ttrue\tfalse", lines[2])
    return lines, out
  end

  it("tells a hook's own error from a limit's and from a debug hook's (this Lua)", function()
    check(H.lua_cmd())
  end)

  it("does the same under LuaJIT, and its dispatch reaches every hook and returns the error", function()
    if not io.open("/usr/bin/luajit") then
      print("\n  skipped: no /usr/bin/luajit")
      return
    end
    local lines, out = check("luajit")
    assert.equal("true\tbudget", lines[3])
    assert.equal("h2 7", lines[4]) -- h1 stopped by the debug hook, h2 reached
    assert.equal("false\tbudget", lines[5])
    assert.not_matches("not reached", out)
  end)
end)
