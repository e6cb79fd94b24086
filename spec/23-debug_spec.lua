-- Debug mode (install{debug = ...}, ASYNC_HOOKS_DEBUG): silent context loss
-- reported once per site, with the user's file:line and its likely cause,
-- to stderr or to a function; nothing without it, nothing for correct
-- programs.  Each program runs in a child process of its own (the mode is
-- per Lua state, and a value set anywhere counts).
local ah = require("async_hooks")
local H = require("helpers")

-- the two messages' texts after "async_hooks debug: file:line: "
local COROUTINE = "context read in a coroutine (its function: %s) that async_hooks neither created nor resumed: " ..
  "every AsyncLocal reads its default there (likely cause: a coroutine.wrap or " ..
  "coroutine.resume saved before install(), or a coroutine made or resumed by C code)"
local LUV = "luv callback runs in the empty context: every AsyncLocal reads its default " ..
  "there (likely cause: it was registered through a luv function saved in a local " ..
  "before install(), or before install() itself)"

-- Run the program (a list of lines, joined) in a child, with env (shell
-- assignments) and without the caller's ASYNC_HOOKS_DEBUG; returns its
-- exit status, stdout and stderr, the file's path replaced by "F" in both.
local function child(lines, env)
  local path = H.tmpfile(table.concat(lines, "\n") .. "\n")
  local out, err = path .. ".out", path .. ".err"
  local cmd = ("env -u ASYNC_HOOKS_DEBUG ASAN_OPTIONS=detect_leaks=0 %s %s %s >%s 2>%s"):format(
    env or "", H.lua_cmd(), path, out, err)
  local _, how, status = os.execute(cmd)
  local function slurp(p)
    local h = assert(io.open(p))
    local s = h:read("a")
    h:close()
    os.remove(p)
    return (s:gsub(path:gsub("%p", "%%%0"), "F"))
  end
  os.remove(path)
  return how == "exit" and status or -1, slurp(out), slurp(err)
end

-- the line of lines that holds mark
local function line_of(lines, mark)
  for i, l in ipairs(lines) do
    if l:find(mark, 1, true) then return i end
  end
  error("no line with " .. mark)
end

-- the report line for a site: "async_hooks debug: F:<line of mark>: text",
-- with "F:<line of body>" in text (a coroutine's function; default: the
-- line of mark)
local function report(lines, mark, text, body)
  text = text:gsub("%%s", "F:" .. line_of(lines, body or mark))
  return ("async_hooks debug: F:%d: %s"):format(line_of(lines, mark), text)
end

-- A program that loses its context both ways, each site twice (and one
-- callback registered twice): a coroutine.wrap and a coroutine.resume
-- saved before install(), a luv function saved in a local.  `INSTALL` is
-- replaced by the install call; the messages a debug function hears are
-- printed at the end (when it is `collect`).
local function losing(install)
  local lines = {
    "local uv = require('luv')",
    "local wrap, resume, create = coroutine.wrap, coroutine.resume, coroutine.create",
    "local timer_start = uv.timer_start",
    "local ah = require('async_hooks')",
    "local heard = {}",
    "local function collect(msg) heard[#heard + 1] = msg end",
    "ah." .. install,
    "local v = ah.AsyncLocal.new()",
    "v:set('request-1')",
    "for _ = 1, 2 do",
    "  print(wrap(function() -- @body1",
    "    return v:get() -- @wrap",
    "  end)())",
    "  local co = create(function() -- @body2",
    "    return ah.executionAsyncId() -- @resume",
    "  end)",
    "  print(select(2, resume(co)) ~= ah.executionAsyncId())",
    "end",
    "for _ = 1, 2 do",
    "  local t = uv.new_timer()",
    "  timer_start(t, 0, 0, function() -- @callback",
    "    print('callback', v:get())",
    "    t:close()",
    "  end)",
    "end",
    "local t = uv.new_timer()",
    "t:start(0, 0, function() print('tracked', v:get()); t:close() end)",
    "uv.run()",
    "for _, msg in ipairs(heard) do print(msg) end",
  }
  return lines
end

-- what `losing` prints itself
local LOSING_OUT = { "nil", "true", "nil", "true", "callback\tnil", "callback\tnil", "tracked\trequest-1" }

local function concat(a, b)
  local t = {}
  for _, x in ipairs(a) do t[#t + 1] = x end
  for _, x in ipairs(b) do t[#t + 1] = x end
  return t
end

local function reports(lines)
  return {
    report(lines, "@wrap", COROUTINE, "@body1"),
    report(lines, "@resume", COROUTINE, "@body2"),
    report(lines, "@callback", LUV),
  }
end

describe("debug mode #debug", function()
  describe("the option", function()
    it("is one of install's options", function()
      local e = H.raised_here(function() ah.install { debgu = true } end)
      assert.equal("bad argument #1 to 'install' (unknown option 'debgu'; accepted: debug, luv)", e)
    end)

    it("must be a boolean or a function: else a bad argument, and nothing is installed", function()
      ah.uninstall()
      for _, case in ipairs {
        { 1, "number" }, { "yes", "string" }, { {}, "table" }, { ah.AsyncLocal, "class AsyncLocal (call with '.', not ':')" },
      } do
        local e = H.raised_here(function() ah.install { debug = case[1] } end)
        assert.equal("bad argument #1 to 'install' (opts.debug must be a boolean or function, got " .. case[2] .. ")", e)
        assert.is_false(ah.installed())
      end
    end)

    it("takes a callable table as a function", function()
      local lines = losing("install { debug = setmetatable({}, { __call = function(_, m) collect(m) end }) }")
      H.child_ok(concat(LOSING_OUT, reports(lines)), child(lines))
    end)
  end)

  describe("reports each site once, with the user's file:line and the likely cause", function()
    it("to a function", function()
      local lines = losing("install { debug = collect }")
      H.child_ok(concat(LOSING_OUT, reports(lines)), child(lines))
    end)

    it("still after an install() without the option", function()
      local lines = losing("install { debug = collect }; ah.install()")
      H.child_ok(concat(LOSING_OUT, reports(lines)), child(lines))
    end)

    it("to stderr (debug = true), one line each", function()
      local lines = losing("install { debug = true }")
      local status, out, err = child(lines)
      assert.equal(0, status, err)
      assert.equal(table.concat(LOSING_OUT, "\n") .. "\n", out)
      assert.equal(table.concat(reports(lines), "\n") .. "\n", err)
    end)

    it("with ASYNC_HOOKS_DEBUG=1 at install() (as debug = true)", function()
      local lines = losing("install()")
      local status, out, err = child(lines, "ASYNC_HOOKS_DEBUG=1")
      assert.equal(0, status, err)
      assert.equal(table.concat(LOSING_OUT, "\n") .. "\n", out)
      assert.equal(table.concat(reports(lines), "\n") .. "\n", err)
    end)

    it("each site of a coroutine: get, executionAsyncId, executionAsyncResource, Snapshot", function()
      local lines = {
        "local wrap = coroutine.wrap",
        "local ah = require('async_hooks').install { debug = print }",
        "local v = ah.AsyncLocal.new()",
        "v:run('x', function()",
        "  wrap(function() local _ = ah.executionAsyncResource() end)() -- @res",
        "  wrap(function() local _ = ah.AsyncLocal.new():set(1) end)() -- @set",
        "  wrap(function() local _ = ah.Snapshot.new() end)() -- @snapshot",
        "  wrap(function() return ah.AsyncLocalStorage.new():getStore() end)() -- @store",
        "end)",
      }
      H.child_ok({
        report(lines, "@res", COROUTINE), report(lines, "@set", COROUTINE),
        report(lines, "@snapshot", COROUTINE), report(lines, "@store", COROUTINE),
      }, child(lines))
    end)

    it("also when the host owns LUA_EXTRASPACE (registry field async_hooks.host_extraspace)", function()
      local lines = losing("install { debug = collect }")
      table.insert(lines, 1, "debug.getregistry()['async_hooks.host_extraspace'] = true")
      table.insert(lines, #lines, "assert(require('async_hooks.core').stats().extraspace == false)")
      H.child_ok(concat(LOSING_OUT, reports(lines)), child(lines))
    end)

    it("a callback given to a luv function patched nowhere (a callable table: its __call)", function()
      local lines = {
        "local uv = require('luv')",
        "local fs_stat = uv.fs_stat",
        "local ah = require('async_hooks').install { debug = print }",
        "ah.AsyncLocal.new():set(1)",
        "local cb = setmetatable({}, { __call = function() end }) -- @call",
        "fs_stat('.', cb)",
        "uv.run()",
      }
      H.child_ok({ report(lines, "@call", LUV) }, child(lines))
    end)
  end)

  describe("reports nothing", function()
    it("without debug mode", function()
      local lines = losing("install()")
      H.child_ok(LOSING_OUT, child(lines))
    end)

    it("with debug = false, ASYNC_HOOKS_DEBUG=1 or not, or ASYNC_HOOKS_DEBUG=0", function()
      local lines = losing("install { debug = false }")
      H.child_ok(LOSING_OUT, child(lines, "ASYNC_HOOKS_DEBUG=1"))
      H.child_ok(LOSING_OUT, child(losing("install()"), "ASYNC_HOOKS_DEBUG=0"))
    end)

    it("once uninstall() ended it", function()
      local lines = losing("install { debug = collect }; ah.uninstall(); ah.install()")
      H.child_ok(LOSING_OUT, child(lines))
    end)

    it("before a value was set anywhere", function()
      local lines = {
        "local uv = require('luv')",
        "local wrap, timer_start = coroutine.wrap, uv.timer_start",
        "local ah = require('async_hooks').install { debug = print }",
        "local v = ah.AsyncLocal.new { default = 'd' }",
        "print(wrap(function() return v:get() end)())",
        "timer_start(uv.new_timer(), 0, 0, function() print(v:get()) end)",
        "uv.run()",
      }
      H.child_ok({ "d", "d" }, child(lines))
    end)

    it("for a correct program: coroutines and callbacks of the library, adopted coroutines, bound callbacks", function()
      local lines = {
        "local uv = require('luv')",
        "local create, timer_start = coroutine.create, uv.timer_start",
        "local ah = require('async_hooks').install { debug = print }",
        "local v = ah.AsyncLocal.new { default = 'd' }",
        "local t0 = uv.new_timer()",
        "t0:start(0, 0, function() print(v:get()); t0:close() end) -- no value yet: untracked",
        "v:set('x')",
        "print(coroutine.wrap(function() return v:get() end)())",
        "print(select(2, coroutine.resume(create(function() return v:get() end))))",
        "local t = uv.new_timer()",
        "uv.timer_start(t, 0, 0, function() print(v:get()) end)",
        "timer_start(uv.new_timer(), 0, 0, ah.Snapshot.wrap(function() print(v:get()) end))",
        "uv.run()",
        "t:close()",
        "uv.walk(function(h) if not h:is_closing() then h:close() end end)",
        "uv.run()",
      }
      H.child_ok({ "x", "x", "d", "x", "x" }, child(lines))
    end)

    it("for the demo (ASYNC_HOOKS_DEBUG=1)", function()
      local status, out, err = child({ 'arg = {[0] = "examples/demo.lua", "4"}', 'dofile("examples/demo.lua")' },
        "ASYNC_HOOKS_DEBUG=1")
      H.child_ok(nil, status, out, err)
      assert.matches("4 requests, %d+ log lines: every line carries its own request's id", out)
    end)
  end)

  it("survives its registry entry damaged by the debug library: nothing reported", function()
    local find = "for k, t in pairs(debug.getregistry()) do " ..
      "if type(k) == 'userdata' and type(t) == 'table' and type(t[1]) == 'function' and type(t[2]) == 'table' then "
    for _, damage in ipairs { "t[1], t[2] = 42, 42", "t[1] = {}", "debug.getregistry()[k] = 42" } do
      local lines = losing("install { debug = collect }; " .. find .. damage .. " end end")
      local status, out, err = child(lines)
      H.child_ok(LOSING_OUT, status, out, err, damage)
    end
  end)

  it("drops the errors of the debug function: the program goes on", function()
    local lines = losing("install { debug = function(m) collect(m); error('oops') end }")
    H.child_ok(concat(LOSING_OUT, reports(lines)), child(lines))
  end)
end)
