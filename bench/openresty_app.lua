-- Handlers of bench/openresty.lua (loaded inside nginx): a request that
-- yields once (ngx.sleep(0)), hands work to a timer and writes two log lines
-- that carry the request id -- passed by hand, or read from an AsyncLocal.
local log, ERR, sleep, say = ngx.log, ngx.ERR, ngx.sleep, ngx.say
local M = {}
local n = 0

local function hand_timer(premature, id)
  log(ERR, "timer rid=", id)
end

--- the id passed by hand
function M.hand()
  n = n + 1
  local id = n
  sleep(0)
  ngx.timer.at(0, hand_timer, id)
  log(ERR, "handler rid=", id)
  say("ok")
end

local rid
local function lib_timer()
  log(ERR, "timer rid=", rid:get())
end

--- the id in an AsyncLocal (needs async_hooks installed)
function M.lib()
  rid = rid or require("async_hooks").AsyncLocal.new { name = "rid" }
  n = n + 1
  rid:set(n)
  sleep(0)
  ngx.timer.at(0, lib_timer)
  log(ERR, "handler rid=", rid:get())
  say("ok")
end

-- floors (bench/openresty.lua's extra configurations): what the library's
-- unavoidable parts cost on their own, with the id passed by hand
local K = {}

--- the request's ngx.ctx made (what the library's first set does)
function M.floor_ctx()
  rawset(ngx.ctx, K, true)
  M.hand()
end

--- ngx.ctx and one table in it per request
function M.floor_ctx_tab()
  rawset(ngx.ctx, K, { frame = K, trigger = 1, n = 0 })
  M.hand()
end

return M
