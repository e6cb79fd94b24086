--- The benchmark server.  Usage:
--   lua5.4 bench/http_server.lua <callbacks|coroutines> <ctx> [timer ms] [count]
-- coroutines (the measured shape): one coroutine per request, which sets
-- its id (one `set`), sleeps on a new timer, opens, reads (512 bytes) and
-- closes a file through luv's thread pool, reads its id back (one `get`)
-- and writes the answer.  callbacks: a timer and one read of an open file,
-- as nested callbacks.
-- ctx: none (the library not loaded) | asynclocal (an AsyncLocal) |
-- counting (the AsyncLocal and four hooks that count their events) | hooks
-- (four empty hooks) | pieces (no library: a pure-Lua stand-in for what no
-- implementation can avoid, a new weak frame per `set` kept for the
-- request's life and the two calls) | passthrough (the pieces and, under
-- them, bench/passthrough.c: what interposing on luv and coroutines costs
-- through the public C API, without any library) | resource (Node's async-resource
-- pattern) | destroy (Node's destroy pattern).
-- The timer is 1 ms unless given.  With a count, the server stops
-- listening after that many answers and returns once its clients have
-- gone (bench/http_client.lua sends an exact number).  Prints "PORT <n>";
-- at the end (SIGTERM or the count) "STATS served=<n> mismatches=<n>
-- events=<n>", where a mismatch is a response whose context was not its
-- own request's and events counts the counting hooks' calls.
package.path = "bench/?.lua;examples/?.lua;" .. package.path
local style, ctx = arg[1] or "callbacks", arg[2] or "none"
local ms = tonumber(arg[3]) or 1
local count = tonumber(arg[4])
local uv = require("luv")
local ah, getid, setid
local events = function() return 0 end
if ctx == "pieces" or ctx == "passthrough" then
  -- the physical pieces without the library: set makes a new weak-keyed
  -- frame and keeps it for the coroutine's life (a weak-keyed table by
  -- thread, so nothing has to clear it); get finds it again.  Finding the
  -- running thread's frame costs Lua a call and a lookup where C reads a
  -- pointer: a little above the pieces, never below.
  local WEAK = { __mode = "k" }
  local frames = setmetatable({}, WEAK)
  local running = coroutine.running
  local sv = {}
  function sv.set(self, value) frames[running()] = setmetatable({ [self] = value }, WEAK) end
  function sv.get(self)
    local f = frames[running()]
    return f and f[self]
  end
  setid = function(id) sv:set(id) end
  getid = function() return sv:get() end
  if ctx == "passthrough" then
    -- and under them, the least interposing costs through the public C API
    -- (bench/passthrough.c): every callback-taking luv function, and the
    -- same C function as a handle method, hands luv a closure over the
    -- callback and the current value; coroutine.create and wrap give the
    -- new coroutine the current value
    local pt = require("passthrough")
    local wrapped = {}
    for _, s in ipairs(require("async_hooks.luv_specs").SPECS) do
      local f = uv[s[1]]
      if f and s[4] ~= "work" then
        wrapped[f] = pt.wrap(f, s[2])
        uv[s[1]] = wrapped[f]
      end
    end
    for name, mt in pairs(debug.getregistry()) do
      if type(name) == "string" and name:match("^uv_") and type(mt) == "table" and type(mt.__index) == "table" then
        for k, f in pairs(mt.__index) do
          if wrapped[f] then mt.__index[k] = wrapped[f] end
        end
      end
    end
    -- (as install() does: the standard library's table is patched)
    coroutine.create = pt.wrapco(coroutine.create) -- luacheck: ignore 122
    coroutine.wrap = pt.wrapco(coroutine.wrap) -- luacheck: ignore 122
  end
elseif ctx ~= "none" then
  ah = require("async_hooks").install()
  if ctx == "asynclocal" or ctx == "counting" then
    local v = ah.AsyncLocal.new()
    setid = function(id) v:set(id) end
    getid = function() return v:get() end
    if ctx == "counting" then -- an APM's shape: hooks that do something
      local inits, befores, afters, destroys = 0, 0, 0, 0
      ah.createHook {
        init = function() inits = inits + 1 end,
        before = function() befores = befores + 1 end,
        after = function() afters = afters + 1 end,
        destroy = function() destroys = destroys + 1 end,
      }:enable()
      events = function() return inits + befores + afters + destroys end
    end
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

-- the file every request opens (removed at the end)
local path = os.tmpname()
do
  local f = assert(io.open(path, "w"))
  f:write(("x"):rep(512))
  f:close()
end
local fd = assert(uv.fs_open(path, "r", 420)) -- the callbacks style's

local n, served, mismatches = 0, 0, 0
local server, sig, reported
local function stats()
  if reported then return end
  reported = true
  os.remove(path)
  io.stdout:write(("STATS served=%d mismatches=%d events=%d\n"):format(served, mismatches, events()))
  io.stdout:flush()
end
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
  if served == count then -- the loop ends once the clients have closed
    server:close()
    sig:close()
  end
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
  local await = app.await
  handler = function(_, respond)
    n = n + 1
    local id = n
    coroutine.wrap(function()
      if setid then setid(id) end
      app.sleep(ms)
      local _, f = await(function(k) uv.fs_open(path, "r", 420, k) end)
      local _, data = await(function(k) uv.fs_read(f, 512, 0, k) end)
      await(function(k) uv.fs_close(f, k) end)
      answer(respond, id, data)
    end)()
  end
else
  error("unknown style " .. style)
end

server = app.http_server(handler)
io.stdout:write("PORT ", server:getsockname().port, "\n")
io.stdout:flush()
sig = uv.new_signal()
sig:start("sigterm", function()
  sig:close()
  server:close()
  stats()
  uv.stop()
end)
uv.run()
stats()
