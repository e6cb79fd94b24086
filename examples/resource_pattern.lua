-- Two ways to carry a request id: the AsyncLocal way, and Node's
-- "async-resource" pattern built from createHook + executionAsyncResource().
package.path = "examples/?.lua;" .. package.path
local uv = require("luv")
local ah = require("async_hooks").install()
local app = require("app")

-- 1. AsyncLocal: set once per request, read anywhere below it.
local request_id = ah.AsyncLocal.new { name = "request_id" }
local function log_al(msg) print(("[AsyncLocal   %s] %s"):format(request_id:get(), msg)) end

-- 2. async-resource pattern: every new resource inherits the field from the
-- resource that is running when it is created.
local REQ = setmetatable({}, { __name = "REQ" }) -- a private key
ah.createHook {
  init = function(_, _, _, resource)
    local current = ah.executionAsyncResource()
    resource[REQ] = current[REQ]
  end,
}:enable()
local function log_res(msg) print(("[resource fld %s] %s"):format(ah.executionAsyncResource()[REQ], msg)) end

for i = 1, 3 do
  coroutine.wrap(function()
    local id = "r" .. i
    request_id:set(id)                        -- way 1
    ah.executionAsyncResource()[REQ] = id     -- way 2: on this coroutine's resource
    app.sleep(10 * (4 - i))
    log_al("after sleep")
    log_res("after sleep")
    local t = uv.new_timer()
    t:start(1, 0, function()                  -- a plain callback, no coroutine
      log_al("in a timer callback")
      log_res("in a timer callback")
      t:close()
    end)
  end)()
end
uv.run()
