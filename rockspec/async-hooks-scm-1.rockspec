rockspec_format = "3.0"
package = "async-hooks"
version = "scm-1"
source = {
  url = "git+https://example.invalid/async-hooks.git",
}
description = {
  summary = "Request context across coroutines and luv callbacks (Node's async_hooks for Lua 5.4)",
  detailed = [[
    AsyncLocal values that follow a request through every coroutine and luv
    (libuv) callback, createHook/executionAsyncId/AsyncResource with Node's
    semantics, AsyncLocalStorage and TC39 Snapshot faces.  C core.
  ]],
  license = "MIT",
  labels = { "async", "context", "luv", "coroutine" },
}
dependencies = {
  "lua >= 5.4",
}
build = {
  type = "cmake",
  variables = {
    CMAKE_BUILD_TYPE = "Release",
    LUA_INCDIR = "$(LUA_INCDIR)",
    LIBDIR = "$(LIBDIR)",
    LUADIR = "$(LUADIR)",
    CMAKE_C_FLAGS = "$(CFLAGS)",
    CMAKE_MODULE_LINKER_FLAGS = "$(LIBFLAG)",
  },
}
test = {
  type = "busted",
}
