--- The benchmark server: per request one 1 ms timer, one file read, and the
-- answer.  Usage: lua5.4 bench/http_server.lua <callbacks|coroutines>
-- <none|asynclocal|resource|destroy>.  Prints "PORT <n>", then serves.
package.path = "bench/?.lua;examples/?.lua;" .. package.path
local style, ctx = arg[1] or "callbacks", arg[2] or "none"
local uv = require("luv")
local ah, getid, setid
if ctx ~= "none" then
  ah = require("async_hooks").install()
  if ctx == "asynclocal" then
    local v = ah.AsyncLocal.new()
    setid = function(id) v:set(id) end
    getid = function() return v:get() end
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
  end
end
local app = require("app")

local fd = app.data_fd(512)

local n = 0
local handler
if style == "callbacks" then
  -- callbacks style: the request's context is entered with run() (or set by
  -- the hook patterns on the current resource) and follows the callbacks
  handler = function(req, respond)
    n = n + 1
    local function go()
      if setid then setid(n) end
      local t = uv.new_timer()
      t:start(1, 0, function()
        t:close()
        uv.fs_read(fd, 512, 0, function(err, data)
          respond(("%s %d\n"):format(getid and tostring(getid()) or "-", #data))
        end)
      end)
    end
    if ctx == "resource" or ctx == "destroy" then
      ah.AsyncResource.new("REQUEST"):runInAsyncScope(go)
    else
      go()
    end
  end
else
  handler = function(req, respond)
    n = n + 1
    local id = n
    coroutine.wrap(function()
      if setid then setid(id) end
      app.sleep(1)
      local _, data = app.await(function(k) uv.fs_read(fd, 512, 0, k) end)
      respond(("%s %d\n"):format(getid and tostring(getid()) or "-", #data))
    end)()
  end
end

local server, port = app.http_server(handler)
io.stdout:write("PORT ", port, "\n")
io.stdout:flush()
local sig = uv.new_signal()
sig:start("sigterm", function() sig:close(); server:close(); uv.stop() end)
uv.run()
