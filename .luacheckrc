-- luacheck configuration: `make lint` checks lua/ spec/ bench/ examples/.
std = "lua54"
max_line_length = 140
-- callbacks keep their documented signature (err, id, type, ...) even when
-- they use only part of it
unused_args = false
-- to-be-closed variables (`local scope <close> = ...`) are used by their
-- `__close`; luacheck does not know that: name them with a leading `_`
ignore = { "211/_.*" }

files["lua/async_hooks/api.lua"] = {
  -- loads in LuaJIT too: only what Lua 5.1 and LuaJIT have, plus the
  -- guarded use of math.tointeger
  std = "luajit",
  read_globals = { math = { fields = { "tointeger" } } },
}
files["lua/async_hooks/init.lua"] = { std = "luajit" }
files["lua/async_hooks/errors.lua"] = { std = "luajit" }
-- the opentelemetry-lua integration: plain Lua for both backends
files["lua/async_hooks/otel.lua"] = { std = "luajit" }
files["lua/async_hooks/backend/lua54.lua"] = { globals = { "coroutine" } }
-- the pure-Lua backend and what it loads run on LuaJIT and Lua 5.1 to 5.3
-- too: only what they all have (guarded uses of the rest)
files["lua/async_hooks/backend/luv_lua.lua"] = { std = "luajit", globals = { "coroutine" },
  read_globals = { table = { fields = { "unpack" } }, package = { fields = { "searchers" } } } }
files["lua/async_hooks/luv_specs.lua"] = { std = "luajit" }
-- the portable specs (and the support files they load) run on every runtime
files["spec/25-portable_spec.lua"] = { std = "luajit+busted" }
files["spec/26-portable_luv_spec.lua"] = { std = "luajit+busted" }
files["spec/support/portable.lua"] = { std = "luajit" }
files["spec"] = { std = "+busted" }
files["tests/faults.lua"] = { globals = { "coroutine" } }
-- OpenResty: the ngx backend and the code that runs inside nginx (LuaJIT +
-- ngx_lua globals); the backend patches coroutine.create/wrap/yield
files["lua/async_hooks/backend/ngx.lua"] = { std = "ngx_lua", globals = { "coroutine" } }
files["lua/async_hooks/backend/ngx_hooks.lua"] = { std = "ngx_lua" }
files["lua/async_hooks/backend/ngx_private.lua"] = { std = "ngx_lua" }
files["spec/support/ah_ngx_app.lua"] = { std = "ngx_lua" }
files["spec/support/ah_ngx_same.lua"] = { std = "ngx_lua" }
files["spec/support/ah_ngx_internals.lua"] = { std = "ngx_lua" }
files["spec/support/ah_bad_input.lua"] = { std = "ngx_lua" }
files["spec/support/ah_otel_app.lua"] = { std = "ngx_lua" }
files["bench/openresty_app.lua"] = { std = "ngx_lua" }
files["bench/otel_app.lua"] = { std = "ngx_lua" }
-- the OpenResty example's app runs inside nginx (LuaJIT + ngx_lua globals)
files["examples/openresty"] = { std = "ngx_lua" }
