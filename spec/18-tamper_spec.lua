--- What the debug library can do to the library's internals, and what it
-- cannot: Lua code reaches all of them (the upvalues of the C functions,
-- the tables and userdata behind them, their metatables and user values,
-- the registry), and whatever it changes there, the process does not
-- crash: a damaged value makes the call that finds it raise an error (see
-- the README, "The debug library").  Each case runs in a process of its
-- own: before these checks, every one of them crashed.
local H = require("helpers")
local sweep = require("support.tamper_sweep")

-- run code in a fresh process: it must end normally, printing "done" last
local function survives(code)
  local status, out, err = H.run_lua(code .. '\nio.stdout:write("done\\n")\n')
  assert.equal("", err)
  assert.equal(0, status)
  assert.matches("done\n$", out)
  return out
end

describe("the debug library's view of the core's functions", function()
  local ah = require("async_hooks")

  it("upvalue 1 of a coroutine.wrap function is its coroutine, as in Lua's own", function()
    for _, wrap in ipairs { ah.coroutine.wrap, coroutine.wrap } do
      local co
      local f = wrap(function() co = coroutine.running(); coroutine.yield() end)
      f()
      local name, up = debug.getupvalue(f, 1)
      assert.equal("", name)
      assert.equal(co, up)
    end
  end)

  it("a coroutine.wrap function resumes the coroutine its upvalue 1 names", function()
    local f = ah.coroutine.wrap(function() return "first" end)
    local g = ah.coroutine.wrap(function() return "second" end)
    debug.setupvalue(f, 1, select(2, debug.getupvalue(g, 1)))
    assert.equal("second", f())
    assert.has_error(function() g() end, "cannot resume dead coroutine")
  end)

  it("upvalue 1 of the other core functions is nil", function()
    for _, k in ipairs { "create", "resume", "close", "wrap" } do
      local name, up = debug.getupvalue(ah.coroutine[k], 1)
      assert.equal("", name, k)
      assert.is_nil(up, k)
    end
  end)
end)

describe("damaged internals raise errors instead of crashing", function()
  it("any upvalue of coroutine.create set to 42", function()
    local out = survives [[
      local ah = require("async_hooks").install()
      for i = 1, debug.getinfo(coroutine.create, "u").nups do
        local _, old = debug.getupvalue(coroutine.create, i)
        debug.setupvalue(coroutine.create, i, 42)
        local ok = pcall(coroutine.create, print)
        io.stdout:write(i, " ", tostring(ok), "\n")
        debug.setupvalue(coroutine.create, i, old)
      end
      assert(coroutine.resume(coroutine.create(function() end)))
    ]]
    -- the state (2) and the tables it uses (F: 3, TH: 7) are checked
    assert.matches("2 false\n3 false\n", out, 1, true)
    assert.matches("7 false\n", out, 1, true)
  end)

  it("a coroutine.wrap function whose upvalue 1 is not a coroutine (Lua's own crashes)", function()
    local out = survives [[
      local ah = require("async_hooks")
      local f = ah.coroutine.wrap(function() end)
      debug.setupvalue(f, 1, 42)
      io.stdout:write(select(2, pcall(f)), "\n")
    ]]
    assert.matches("cannot resume a number", out, 1, true)
  end)

  it("the table of internals cleared, with hooks enabled", function()
    survives [[
      local uv = require("luv")
      local ah = require("async_hooks").install()
      ah.createHook { init = function() end, before = function() end,
        after = function() end, destroy = function() end }:enable()
      local v = ah.AsyncLocal.new()
      v:set(1)
      -- the aux table: the upvalue of coroutine.create with the most entries
      local aux, n = nil, 0
      for i = 1, debug.getinfo(coroutine.create, "u").nups do
        local _, t = debug.getupvalue(coroutine.create, i)
        if type(t) == "table" and #t > n then aux, n = t, #t end
      end
      for k in pairs(aux) do aux[k] = nil end
      for _ = 1, 3 do
        pcall(function() coroutine.wrap(function() coroutine.yield() end)() end)
        pcall(function()
          local t = uv.new_timer()
          t:start(0, 0, function() t:close() end)
          uv.run()
        end)
        pcall(v.get, v)
        collectgarbage()
      end
    ]]
  end)

  it("a luv function's upvalues set to 42, one at a time", function()
    survives [[
      local uv = require("luv")
      local ah = require("async_hooks").install()
      ah.AsyncLocal.new():set(1)
      local t = uv.new_timer()
      local start = t.start
      for i = 1, debug.getinfo(start, "u").nups do
        local _, old = debug.getupvalue(start, i)
        debug.setupvalue(start, i, 42)
        pcall(start, t, 0, 0, function() end)
        debug.setupvalue(start, i, old)
        t:stop()
      end
      t:close()
      uv.run()
    ]]
  end)

  it("a record closure's record replaced (luv calls it: a callback's error, no crash)", function()
    survives [[
      local uv = require("luv")
      local ah = require("async_hooks").install()
      require("async_hooks.core").luv_flags(1 + 4) -- callback errors: no exit
      local v = ah.AsyncLocal.new()
      local t = uv.new_timer()
      local function cb() end
      -- a quick record, a record, then the record's closure
      v:run(1, function() t:start(0, 0, cb); t:start(0, 0, cb); t:start(0, 0, cb) end)
      local rec = debug.getuservalue(t, 1)
      assert(type(rec) == "function", "no record closure")
      debug.setupvalue(rec, 1, 42)
      pcall(uv.run)
      pcall(function() v:run(2, function() t:start(0, 0, cb) end) end)
      pcall(uv.run)
      if not t:is_closing() then t:close() end
      uv.run()
    ]]
  end)

  it("the library's registry entries replaced", function()
    local out = survives [[
      local uv = require("luv")
      local raw_run = uv.run
      local ah = require("async_hooks").install()
      local v = ah.AsyncLocal.new()
      v:set(1)
      local reg = debug.getregistry()
      for k, x in pairs(reg) do
        if type(k) == "userdata" and type(x) == "userdata" then reg[k] = 42 end
      end
      local t = uv.new_timer()
      t:start(0, 0, function() io.stdout:write("callback ", tostring(v:get()), "\n"); t:close() end)
      pcall(raw_run)
      pcall(uv.run)
    ]]
    assert.matches("callback 1\n", out, 1, true)
  end)
end)

describe("the library's metamethods and objects, given to other values", function()
  it("a scope guard's __close refuses another library's userdata with its metatable", function()
    local out = survives [[
      local ah = require("async_hooks").install()
      local r = ah.AsyncResource.new("G")
      local co = coroutine.create(function() r:runInAsyncScope(function() coroutine.yield() end) end)
      coroutine.resume(co)
      local mt -- the guards' metatable, among the internals
      for i = 1, debug.getinfo(coroutine.create, "u").nups do
        local _, aux = debug.getupvalue(coroutine.create, i)
        if type(aux) == "table" then
          for _, t in pairs(aux) do
            if type(t) == "table" and rawget(t, "__name") == "async_hooks.scope" then mt = t end
          end
        end
      end
      local f = io.tmpfile()
      debug.setmetatable(f, mt)
      io.stdout:write(tostring(pcall(mt.__close, f)), "\n")
      io.stdout:write(tostring(pcall(load("local x <close> = ...", "=close"), f)), "\n")
      coroutine.close(co)
      collectgarbage()
    ]]
    assert.equal("false\nfalse\ndone\n", out)
  end)

  it("the state's finalizer called on other values", function()
    local out = survives [[
      local ah = require("async_hooks").install()
      -- the state: a userdata with a finalizer and no name, among the
      -- upvalues of coroutine.create and their entries
      local st
      local function look(x)
        local mt = type(x) == "userdata" and debug.getmetatable(x)
        if mt and rawget(mt, "__gc") and not rawget(mt, "__name") then st = x end
      end
      for i = 1, debug.getinfo(coroutine.create, "u").nups do
        local _, x = debug.getupvalue(coroutine.create, i)
        look(x)
        if type(x) == "table" then for _, y in pairs(x) do look(y) end end
      end
      local gc = debug.getmetatable(st).__gc
      pcall(gc, io.stdout)
      pcall(gc, 42)
      io.stdout:write("written\n")
      assert(coroutine.resume(coroutine.create(function() end)))
    ]]
    assert.equal("written\ndone\n", out)
  end)

  it("an AsyncLocal's token given to luv's uv.close (no debug library needed)", function()
    local out = survives [[
      local uv = require("luv")
      local ah = require("async_hooks").install()
      local v = ah.AsyncLocal.new()
      io.stdout:write(tostring(pcall(uv.close, rawget(v, 1))), "\n")
    ]]
    assert.equal("false\ndone\n", out)
  end)
end)

-- spec/support/tamper.lua: every internal object it finds, damaged in turn
-- (replaced upvalues, cleared tables, changed entries, user values and
-- metatables, registry entries, calls with other values), then the whole
-- library used, restored, used again; in a process that runs many cases,
-- restarted after one that ends it
local function report(problems)
  local lines = {}
  for _, p in ipairs(problems) do
    lines[#lines + 1] = ("case %d (status %s): %s\n%s"):format(p.case, tostring(p.status), p.what, p.stderr)
  end
  return table.concat(lines, "\n")
end

describe("damaging each internal in turn", function()
  for _, mode in ipairs { "plain", "hooks" } do
    it(("crashes no process (a sample of the cases, %s)"):format(mode), function()
      local n, problems = sweep.sweep(H.lua_cmd(), mode, 1, nil, 13)
      assert.is_true(n > 1000, "too few cases: " .. tostring(n))
      assert.equal(0, #problems, report(problems))
    end)
  end
end)

describe("damaging each internal in turn #slow", function()
  for _, mode in ipairs { "plain", "hooks" } do
    it(("crashes no process (every case, %s)"):format(mode), function()
      local n, problems = sweep.sweep(H.lua_cmd(), mode)
      assert.is_true(n > 1000, "too few cases: " .. tostring(n))
      assert.equal(0, #problems, report(problems))
    end)
  end
end)
