rockspec_format = "3.0"
package = "async-hooks-purelua"
version = "scm-1"
source = {
  url = "git+https://example.invalid/async-hooks.git",
}
description = {
  summary = "Request context across coroutines and luv callbacks (async_hooks) for LuaJIT and Lua 5.1 to 5.3",
  detailed = [[
    The edition of async-hooks for the runtimes where its C core does not
    build: the same require("async_hooks") (AsyncLocal,
    AsyncLocalStorage, Snapshot, createHook, AsyncResource, install()),
    written in Lua, for LuaJIT 2.1 (luvit, Neovim) and PUC Lua 5.1, 5.2
    and 5.3 with luv.  A small C helper (async_hooks.luvcb) keeps the
    traceback of an error raised in a luv callback as it is without the
    library; the Lua code runs without it.
  ]],
  homepage = "https://example.invalid/async-hooks",
  license = "MIT",
  labels = { "async", "context", "luv", "libuv", "coroutine", "luajit" },
}
-- One rock for the four runtimes: LuaRocks builds the helper for the Lua
-- it installs for (LuaJIT takes the 5.1 build).  luv is a runtime
-- dependency left to the user (the library waits for it to be required).
dependencies = {
  "lua >= 5.1, < 5.4",
}
build = {
  type = "builtin",
  modules = {
    ["async_hooks"] = "lua/async_hooks/init.lua",
    ["async_hooks.api"] = "lua/async_hooks/api.lua",
    ["async_hooks.errors"] = "lua/async_hooks/errors.lua",
    ["async_hooks.luv_specs"] = "lua/async_hooks/luv_specs.lua",
    ["async_hooks.otel"] = "lua/async_hooks/otel.lua",
    ["async_hooks.backend.luv_lua"] = "lua/async_hooks/backend/luv_lua.lua",
    ["async_hooks.backend.ngx_hooks"] = "lua/async_hooks/backend/ngx_hooks.lua",
    ["async_hooks.luvcb"] = {
      sources = { "src/purelua/cbpcall.c" },
    },
  },
}
