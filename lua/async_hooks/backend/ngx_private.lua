--- The OpenResty backend's one dependency on what lua-resty-core and
-- ngx_lua do not document: the request, its `ngx.ctx` without making it,
-- and the raw phase.  Everything else the backend uses is public.  Each
-- internal read here has a fallback on public API, and the OpenResty specs
-- check that the internal path is the one in use (`M.internal`), so that a
-- change in lua-resty-core fails them instead of slowing requests down.
-- Plain Lua for LuaJIT.
-- @module async_hooks.backend.ngx_private

local ngx = ngx
local type, rawget = type, rawget
local debug = require("debug")

local M = {}

--- The running request (a cdata), nil outside requests: lua-resty-core's
-- `resty.core.base.get_request`, which its own modules use throughout.
M.get_request = require("resty.core.base").get_request

-- The ctx tables: lua-resty-core keeps every request's ngx.ctx in a
-- registry table indexed by the ctx reference that ngx_lua stores in the
-- request (ngx_http_lua_ffi_get_ctx_ref, declared by resty.core.ctx;
-- lua-resty-core's own setter passes it no out-parameters too).
local ctxs, get_ctx_ref
do
  require("resty.core.ctx")
  local t = debug.getregistry().ngx_lua_ctx_tables
  local ok, ffi = pcall(require, "ffi")
  if type(t) == "table" and ok then
    local found, f = pcall(function() return ffi.C.ngx_http_lua_ffi_get_ctx_ref end)
    if found then ctxs, get_ctx_ref = t, f end
  end
end

--- Whether the internal reads below are in use (else their public
-- fallbacks).
M.internal = { ctx = ctxs ~= nil, phase = rawget(ngx, "get_raw_phase") ~= nil }

--- The request r's ngx.ctx if it has one, else nil; makes nothing.
-- (Fallback: ngx.ctx, which makes it.)
function M.peek_ctx(r)
  local ref = get_ctx_ref(r, nil, nil)
  if ref < 0 then return nil end
  return ctxs[ref]
end
if not ctxs then
  M.peek_ctx = function() return ngx.ctx end
end

--- The phase running in request r: ngx_lua's number (`ngx.get_raw_phase`,
-- what lua-resty-core's coroutine module reads), else ngx.get_phase()'s
-- name.
local get_raw_phase = rawget(ngx, "get_raw_phase")
function M.phase(r)
  if get_raw_phase ~= nil then return get_raw_phase(r) end
  return ngx.get_phase()
end

--- The phases that run nested inside a handler (inside ngx.say, ngx.flush,
-- a proxied subrequest): header and body filters, the balancer; by number
-- and by name.
M.NESTED = {
  [0x0020] = true, [0x0040] = true, [0x0200] = true,
  header_filter = true, body_filter = true, balancer = true,
}

return M
