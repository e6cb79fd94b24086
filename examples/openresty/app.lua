-- The request id is set once, in the access phase; the timer, the light
-- thread and the log phase read it without being given it.
local ah = require("async_hooks")

local request_id = ah.AsyncLocal.new { name = "request_id", default = "-" }

local M = {}

function M.access()
  -- the client's id when it sends one, else nginx's
  request_id:set(ngx.var.http_x_request_id or ngx.var.request_id)
end

local function audit(premature)
  if premature then return end
  ngx.log(ngx.NOTICE, "timer request_id=", request_id:get())
end

function M.content()
  assert(ngx.timer.at(0, audit)) -- runs after the request: the id goes along
  local th = ngx.thread.spawn(function()
    ngx.sleep(0.01)
    ngx.log(ngx.NOTICE, "thread request_id=", request_id:get())
    return request_id:get()
  end)
  local _, from_thread = ngx.thread.wait(th)
  ngx.say("hello ", request_id:get(), " (light thread saw ", from_thread, ")")
end

function M.log()
  ngx.log(ngx.NOTICE, "done request_id=", request_id:get())
end

return M
