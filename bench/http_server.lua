--- The benchmark server: per request a timer, one file read, and the
-- answer.  Usage:
--   lua5.4 bench/http_server.lua <callbacks|coroutines> <ctx> [timer ms]
-- ctx: none | asynclocal (a value set per request) | hooks (four empty hooks)
-- | resource (Node's async-resource pattern) | destroy (Node's destroy
-- pattern) | floor (the AsyncLocal row's measured floor: bench/floor.c, the
-- cheapest code that carries the value the same way, in place of the
-- library; see bench/README.md) | floor_light (the same, callbacks called
-- from the floor's closure: cheaper than correct, for the record).  The
-- timer is 1 ms unless given.  Prints "PORT <n>", then serves; on SIGTERM
-- prints "STATS served=<n> mismatches=<n>", where a mismatch is a response
-- whose context was not its own request's.
package.path = "bench/?.lua;examples/?.lua;" .. package.path
local style, ctx = arg[1] or "callbacks", arg[2] or "none"
local ms = tonumber(arg[3]) or 1
local uv = require("luv")
local ah, getid, setid
local stats_extra = function() return "" end
if ctx == "floor" or ctx == "floor_light" then
  -- not the library: the floor's set/get on a local made as AsyncLocal.new
  -- makes one, its coroutine.wrap and resume (a slot per coroutine, ids,
  -- the creator's frame), its cb_pcall, and its wrapper on every
  -- callback-taking luv function the server uses (a frame set: the
  -- callback becomes a closure over it; else luv's function at once)
  local U = require("util")
  local F = assert(package.loadlib(assert(U.build_floor()), "luaopen_floor"))().new()
  local fv = setmetatable({ F.token(), name = "", default = nil }, { __name = "floor local" })
  fv.get, fv.set = F.get, F.lset
  local reg = debug.getregistry()
  for _, w in ipairs {
    { "timer_start", 4, uv_timer = "start" }, { "signal_start", 3, uv_signal = "start" },
    { "fs_read", 4 }, { "write", 3, uv_tcp = "write" }, { "read_start", 2, uv_tcp = "read_start" },
    { "listen", 3, uv_tcp = "listen" },
    { "close", 2, uv_tcp = "close", uv_timer = "close", uv_signal = "close" } } do
    local name, pos = w[1], w[2]
    local f = F.track(uv[name], pos)
    for mt, method in pairs(w) do
      if type(mt) == "string" then
        local index = reg[mt].__index
        assert(index[method] == uv[name], method)
        index[method] = f
      end
    end
    uv[name] = f
  end
  coroutine.wrap, coroutine.resume = F.wrapco, F.resume
  -- "floor": callbacks run as the library must run them (luv calls the
  -- user's function itself, inside the floor's uv.run); "floor_light": luv
  -- calls the floor's closure, which calls the callback (see bench/README.md)
  F.luv_attach(ctx == "floor")
  if ctx == "floor" then uv.run = F.wrap_run(uv.run) end
  setid = function(id) fv:set(id) end
  getid = function() return fv:get() end
  -- the STATS line says how many registrations the floor tracked
  stats_extra = function()
    local _, _, slow, tracked, entered, direct = F.counts()
    return (" floor_tracked=%d floor_entered=%d floor_direct=%d floor_slow=%d"):format(tracked, entered,
      direct, slow)
  end
elseif ctx ~= "none" then
  ah = require("async_hooks").install()
  if ctx == "asynclocal" then
    local v = ah.AsyncLocal.new()
    setid = function(id) v:set(id) end
    getid = function() return v:get() end
  elseif ctx == "hooks" then
    ah.createHook { init = function() end, before = function() end,
      after = function() end, destroy = function() end }:enable()
  elseif ctx == "resource" then -- Node's async-resource pattern
    local KEY = {}
    ah.createHook { init = function(_, _, _, r) r[KEY] = ah.executionAsyncResource()[KEY] end }:enable()
    setid = function(id) ah.executionAsyncResource()[KEY] = id end
    getid = function() return ah.executionAsyncResource()[KEY] end
  elseif ctx == "destroy" then -- Node's destroy pattern: a map keyed by asyncId
    local map = {}
    ah.createHook {
      init = function(id, _, trigger) map[id] = map[trigger] end,
      destroy = function(id) map[id] = nil end,
    }:enable()
    setid = function(id) map[ah.executionAsyncId()] = id end
    getid = function() return map[ah.executionAsyncId()] end
  else
    error("unknown context kind " .. ctx)
  end
end
local app = require("app")

local fd = app.data_fd(512)

local n, served, mismatches = 0, 0, 0
-- every configuration sends the same answer: the request's id (read from
-- the context where there is one, else the one the handler passed by hand),
-- so that the ratios measure the tracking and nothing else
local function answer(respond, id, data)
  local got = id
  if getid then
    got = getid()
    if got ~= id then mismatches = mismatches + 1 end
  end
  served = served + 1
  respond(("%s %d\n"):format(tostring(got), #data))
end
local handler
if style == "callbacks" then
  -- callbacks style: the request's context is entered with run() (or set by
  -- the hook patterns on the current resource) and follows the callbacks
  handler = function(_, respond)
    n = n + 1
    local id = n
    local function go()
      if setid then setid(id) end
      local t = uv.new_timer()
      t:start(ms, 0, function()
        t:close()
        uv.fs_read(fd, 512, 0, function(_, data) answer(respond, id, data) end)
      end)
    end
    if ctx == "resource" or ctx == "destroy" then
      ah.AsyncResource.new("REQUEST"):runInAsyncScope(go)
    else
      go()
    end
  end
elseif style == "coroutines" then
  handler = function(_, respond)
    n = n + 1
    local id = n
    coroutine.wrap(function()
      if setid then setid(id) end
      app.sleep(ms)
      local _, data = app.await(function(k) uv.fs_read(fd, 512, 0, k) end)
      answer(respond, id, data)
    end)()
  end
else
  error("unknown style " .. style)
end

local server, port = app.http_server(handler)
io.stdout:write("PORT ", port, "\n")
io.stdout:flush()
local sig = uv.new_signal()
sig:start("sigterm", function()
  sig:close()
  server:close()
  io.stdout:write(("STATS served=%d mismatches=%d%s\n"):format(served, mismatches, stats_extra()))
  io.stdout:flush()
  uv.stop()
end)
uv.run()
