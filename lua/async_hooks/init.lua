-- Request context that follows coroutines and luv callbacks.
--
-- Node's `async_hooks` + `AsyncLocalStorage` (and TC39 `AsyncContext`) for
-- Lua 5.4 and OpenResty: `AsyncLocal` values propagate from a coroutine's
-- creator into the coroutine and from a luv registration into its callback,
-- without being passed by hand.
--
-- This file only picks the backend: `async_hooks.backend.ngx` inside
-- OpenResty (a global `ngx` table with `ngx.config.ngx_lua_version`),
-- `async_hooks.backend.lua54` (the C core) on Lua 5.4, else
-- `async_hooks.backend.luv_lua` (pure Lua: LuaJIT, Lua 5.1 to 5.3).  The
-- public API is `async_hooks.api`, the same over all (its reference:
-- `make docs`).
local ngx = rawget(_G, "ngx")
local backend
if type(ngx) == "table" and type(ngx.config) == "table" and ngx.config.ngx_lua_version then
  backend = require("async_hooks.backend.ngx")
elseif _VERSION == "Lua 5.4" and rawget(_G, "jit") == nil then
  backend = require("async_hooks.backend.lua54")
else
  backend = require("async_hooks.backend.luv_lua")
end

---@type async_hooks
local M = require("async_hooks.api")(backend)
return M
