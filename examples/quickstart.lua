-- The README's first example.
local uv = require("luv")                       -- luv first, on the main thread
local ah = require("async_hooks").install()     -- patch coroutine + luv

local request_id = ah.AsyncLocal.new { name = "request_id", default = "-" }

local function log(msg)                          -- knows nothing about requests
  print(("[%s] %s"):format(request_id:get(), msg))
end

for i = 1, 3 do
  coroutine.wrap(function()                      -- one coroutine per request
    request_id:set("req-" .. i)
    local t = uv.new_timer()
    t:start(10 * (4 - i), 0, function()          -- a callback, later
      log("timer fired")                         -- prints its own request's id
      t:close()
    end)
  end)()
end
uv.run()
