rockspec_format = "3.0"
package = "async-hooks"
version = "0.1.0-1"
source = {
  url = "git+https://github.com/async-hooks-lua/async_hooks.git",
  tag = "v0.1.0",
}
description = {
  summary = "Request context across coroutines and luv callbacks: Node's async_hooks and AsyncLocalStorage for Lua 5.4",
  detailed = [[
    A request id, a trace span or a tenant set at the start of a request
    reaches every function that runs on the request's behalf -- in the
    coroutines it starts and in the luv (libuv) callbacks it registers --
    without being passed by hand, while requests interleave on one event
    loop.

    AsyncLocal values and AsyncLocalStorage (run, enterWith, getStore),
    snapshots of the whole context (TC39 AsyncContext.Snapshot),
    createHook with init/before/after/destroy events, executionAsyncId,
    triggerAsyncId and AsyncResource with Node's semantics.  A drop-in
    coroutine library carries the context into coroutines; install()
    wraps luv's callback-taking functions too (install{luv = uv} for a
    luv module given by hand).  The hot paths are a C
    core (async_hooks.core); luv is optional.
  ]],
  homepage = "https://github.com/async-hooks-lua/async_hooks",
  license = "MIT",
  labels = { "async", "context", "luv", "libuv", "coroutine", "tracing" },
}
dependencies = {
  "lua >= 5.4, < 5.5",
}
test_dependencies = {
  "busted",
}
-- CMake builds the C module from every src/*.c and installs the whole
-- lua/async_hooks/ tree (subfolders included).  -Wpedantic -Werror are on
-- only with AH_STRICT=1 in the environment (`make`, CI).
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
