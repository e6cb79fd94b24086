rockspec_format = "3.0"
package = "lua-resty-async-hooks"
version = "scm-1"
source = {
  url = "git+https://example.invalid/async-hooks.git",
}
description = {
  summary = "Request context across ngx_lua coroutines, light threads and timers (async_hooks for OpenResty)",
  detailed = [[
    The OpenResty edition of async-hooks: the same require("async_hooks")
    (AsyncLocal, AsyncLocalStorage, Snapshot, createHook, AsyncResource),
    in plain Lua for lua-nginx-module on LuaJIT.  Values follow a request
    through its phases, coroutines, ngx.thread.spawn light threads and
    ngx.timer.at/every callbacks.  No C code.
  ]],
  license = "MIT",
  labels = { "openresty", "nginx", "async", "context" },
}
dependencies = {
  "lua >= 5.1, < 5.2", -- LuaJIT 2.1 inside OpenResty / lua-nginx-module
}
build = {
  type = "builtin",
  modules = {
    ["async_hooks"] = "lua/async_hooks/init.lua",
    ["async_hooks.api"] = "lua/async_hooks/api.lua",
    ["async_hooks.errors"] = "lua/async_hooks/errors.lua",
    ["async_hooks.otel"] = "lua/async_hooks/otel.lua",
    ["async_hooks.backend.ngx"] = "lua/async_hooks/backend/ngx.lua",
    ["async_hooks.backend.ngx_hooks"] = "lua/async_hooks/backend/ngx_hooks.lua",
    ["async_hooks.backend.ngx_private"] = "lua/async_hooks/backend/ngx_private.lua",
  },
}
