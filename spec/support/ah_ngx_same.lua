-- The OpenResty specs' handlers that check the library is invisible: the
-- same errors, positions and log lines as ngx_lua alone, the same messages
-- as on Lua 5.4, errors of a hook's dispatch.  Added to ah_ngx_app's table.
local ah = require("async_hooks")
local Snapshot = ah.Snapshot
local concat, tostring = table.concat, tostring

local function say(t) ngx.say(concat(t, " ")) end
local function s(v) return tostring(v) end

return function(A)
  local rid = A.rid

  --- what ngx_lua's coroutine.create/wrap, ngx.thread.spawn and
  --- ngx.timer.at/every refuse (C functions, bad delays, non-functions)
  --- raises the same error at the same position with the library as
  --- without; what they accept returns the same (each case calls at one
  --- line, not in tail position, so that the error's position is that line)
  local function noop_lua() end
  local callable = setmetatable({}, { __call = noop_lua })
  local same_cases = {
    { "at(bad delay)", function(L) local a, b = L.at("soon", noop_lua); return a, b end },
    { "at(nil delay)", function(L) local a, b = L.at(nil, noop_lua); return a, b end },
    { "at(-1)", function(L) local a, b = L.at(-1, noop_lua); return a, b end },
    { "at('0.001')", function(L) local a, b = L.at("0.001", noop_lua); return a, b end },
    { "at(C function)", function(L) local a, b = L.at(0, print); return a, b end },
    { "at(0)", function(L) local a, b = L.at(0); return a, b end },
    { "at(0, nil)", function(L) local a, b = L.at(0, nil); return a, b end },
    { "at()", function(L) local a, b = L.at(); return a, b end },
    { "at(callable)", function(L) local a, b = L.at(0, callable); return a, b end },
    { "every(0)", function(L) local a, b = L.every(0, noop_lua); return a, b end },
    -- (ngx_lua counts in ms: under 1 ms is zero for it)
    { "every(0.0001)", function(L) local a, b = L.every(0.0001, noop_lua); return a, b end },
    { "every(NaN)", function(L) local a, b = L.every(0 / 0, noop_lua); return a, b end },
    { "every(-1)", function(L) local a, b = L.every(-1, noop_lua); return a, b end },
    { "every(bad delay)", function(L) local a, b = L.every({}, noop_lua); return a, b end },
    { "every(C function)", function(L) local a, b = L.every(1, print); return a, b end },
    { "spawn(C function)", function(L) local a, b = L.spawn(print); return a, b end },
    { "spawn(42)", function(L) local a, b = L.spawn(42); return a, b end },
    { "spawn()", function(L) local a, b = L.spawn(); return a, b end },
    { "spawn(nil)", function(L) local a, b = L.spawn(nil); return a, b end },
    { "spawn(callable)", function(L) local a, b = L.spawn(callable); return a, b end },
    { "create(C function)", function(L) local a, b = L.create(print); return a, b end },
    { "create()", function(L) local a, b = L.create(); return a, b end },
    { "create(nil)", function(L) local a, b = L.create(nil); return a, b end },
    { "wrap()", function(L) local a, b = L.wrap(); return a, b end },
    { "wrap(C function)", function(L) local a, b = L.wrap(print); return a, b end },
    { "wrap(callable)", function(L) local a, b = L.wrap(callable); return a, b end },
    { "kill()", function(L) local a, b = L.kill(); return a, b end },
    { "kill(42)", function(L) local a, b = L.kill(42); return a, b end },
    { "kill(a coroutine)", function(L) local a, b = L.kill(coroutine.create(noop_lua)); return a, b end },
    -- (how many values kill returns, in the message: show() prints types)
    { "kill(a thread)", function(L)
      error("results: " .. select("#", L.kill(L.spawn(function() ngx.sleep(1) end))), 0)
    end },
    { "kill(a dead thread)", function(L)
      local th = L.spawn(noop_lua)
      ngx.thread.wait(th)
      error("results: " .. select("#", L.kill(th)), 0)
    end },
  }
  function A.same_errors()
    local o = rawget(_G, "ORIGINALS") -- set by the spec's init_by_lua, before install()
    local orig = { create = o[1], wrap = o[2], spawn = o[4], kill = o[5], at = o[6], every = o[7] }
    local patched = { create = coroutine.create, wrap = coroutine.wrap, spawn = ngx.thread.spawn,
      kill = ngx.thread.kill, at = ngx.timer.at, every = ngx.timer.every }
    rid:set("non-empty frame") -- so that the wrappers do their work
    local hook = ah.createHook { init = noop_lua }:enable()
    local function show(ok, a, b)
      if ok then return "ok " .. type(a) .. " " .. type(b) end
      return "error " .. tostring(a)
    end
    local out = {}
    for _, c in ipairs(same_cases) do
      local without = show(pcall(c[2], orig))
      local with = show(pcall(c[2], patched))
      out[#out + 1] = (without == with and "same " or "DIFFERENT ") .. c[1] .. ": " .. without .. " | " .. with
    end
    hook:disable()
    ngx.say(concat(out, "\n"))
  end

  --- ngx.log from functions run by each carrier, once through ngx_lua's own
  --- functions (saved before install()) and once through the library's:
  --- ngx_lua prints the name that Lua's debug info gives the function that
  --- logs, when it has one ("f(): "), so the lines must be the same.  The
  --- library's own wrappers (run, bind, ...) are compared with pcall.  The
  --- spec reads the lines ("ah-name <carrier> <without|with>") in the log.
  function A.log_names()
    local o = rawget(_G, "ORIGINALS") -- set by the spec's init_by_lua, before install()
    local orig = { create = o[1], wrap = o[2], spawn = o[4], at = o[6], every = o[7] }
    local patched = { create = coroutine.create, wrap = coroutine.wrap, spawn = ngx.thread.spawn,
      at = ngx.timer.at, every = ngx.timer.every }
    local d = ngx.shared.ah
    d:set("log_names", 0)
    local function logger(tag)
      local once = false
      return function()
        if once then return end
        once = true
        ngx.log(ngx.ERR, "ah-name ", tag)
        d:incr("log_names", 1)
      end
    end
    rid:set("non-empty frame") -- so that the wrappers do their work
    local als = ah.AsyncLocalStorage.new()
    local res = ah.AsyncResource.new("log_names")
    local carriers = {
      { "timer.at", function(L, f) assert(L.at(0, f)) end },
      { "timer.at+args", function(L, f) assert(L.at(0, f, "x", "y")) end },
      { "timer.every", function(L, f) assert(L.every(0.05, f)) end },
      { "timer.every+args", function(L, f) assert(L.every(0.05, f, "x")) end },
      { "thread.spawn", function(L, f) ngx.thread.wait(L.spawn(f)) end },
      { "thread.spawn+args", function(L, f) ngx.thread.wait(L.spawn(f, "x")) end },
      { "coroutine.create", function(L, f) coroutine.resume(L.create(f), "x") end },
      { "coroutine.wrap", function(L, f) L.wrap(f)("x") end },
    }
    local wrappers = {
      { "AsyncLocal:run", function(f) rid:run(1, f, "x") end },
      { "AsyncLocalStorage:run", function(f) als:run({}, f) end },
      { "AsyncLocalStorage:exit", function(f) als:exit(f) end },
      { "AsyncLocalStorage.bind", function(f) ah.AsyncLocalStorage.bind(f)() end },
      { "AsyncLocalStorage.snapshot", function(f) ah.AsyncLocalStorage.snapshot()(f) end },
      { "Snapshot:run", function(f) Snapshot.new():run(f) end },
      { "Snapshot.wrap", function(f) Snapshot.wrap(f)() end },
      { "AsyncResource:runInAsyncScope", function(f) res:runInAsyncScope(f) end },
      { "AsyncResource:bind", function(f) res:bind(f)() end },
      { "AsyncResource.bind", function(f) ah.AsyncResource.bind(f)() end },
    }
    local n = 0
    for _, c in ipairs(carriers) do
      c[2](orig, logger(c[1] .. " without"))
      c[2](patched, logger(c[1] .. " with"))
      n = n + 2
    end
    for _, c in ipairs(wrappers) do
      pcall(logger(c[1] .. " without"))
      c[2](logger(c[1] .. " with"))
      n = n + 2
    end
    for _ = 1, 500 do
      if d:get("log_names") == n then break end
      ngx.sleep(0.002)
    end
    res:emitDestroy()
    say { s(d:get("log_names")), s(n) }
  end

  --- the bad-input cases, run inside nginx
  function A.bad_input()
    local cases = require("ah_bad_input")(ah)
    for _, c in ipairs(cases) do ngx.say(c) end
  end

  --- errors in a hook's dispatch that are not the hook's own (here: raised
  -- by a debug hook when the hook is called) surface from the operation, the
  -- worker goes on, the context is as it was
  function A.hook_errors()
    local v = ah.AsyncLocal.new { default = "d" }
    v:set("req")
    local req_id = ah.executionAsyncId()
    local calls = {}
    local hooks = {}
    for _, k in ipairs { "init", "before", "after", "destroy" } do
      hooks[k] = function() calls[#calls + 1] = k end
    end
    local hook = ah.createHook(hooks):enable()
    local function trap(fn)
      local armed = true
      debug.sethook(function()
        if armed and debug.getinfo(2, "f").func == fn then
          armed = false
          error("trapped", 0)
        end
      end, "c")
    end
    local out = {}
    local function try(f, ...)
      local ok, e = pcall(f, ...)
      out[#out + 1] = s(ok) .. ":" .. s(e)
      debug.sethook()
    end
    local r = ah.AsyncResource.new("R", { requireManualDestroy = true })
    local ran = false
    trap(hooks.before)
    try(r.runInAsyncScope, r, function() ran = true end)
    out[#out + 1] = s(ran) .. " " .. v:get() .. " " .. s(ah.executionAsyncId() == req_id)
    trap(hooks.init)
    try(coroutine.create, function() end)
    trap(hooks.init)
    try(ah.AsyncResource.new, "X")
    -- later work: the events in order
    calls = {}
    local co = coroutine.create(function() coroutine.yield(); return v:get() end)
    coroutine.resume(co)
    local _, got = coroutine.resume(co)
    r:runInAsyncScope(function() end)
    r:emitDestroy()
    hook:disable()
    out[#out + 1] = got .. " " .. table.concat(calls, ",")
    out[#out + 1] = s(ngx.worker.pid())
    say(out)
  end

end
