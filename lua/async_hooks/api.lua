--- Request context that follows coroutines and luv callbacks.
--
-- `local ah = require("async_hooks")`: Node's `async_hooks` and
-- `AsyncLocalStorage`, and TC39's `AsyncContext`, for Lua 5.4 and
-- OpenResty.  `AsyncLocal` values propagate from a coroutine's creator into
-- the coroutine and from a luv registration into its callback without being
-- passed by hand.  Every function checks its arguments and raises errors
-- positioned at the caller's line; wherever a function is expected, a
-- callable table is accepted.
-- @module async_hooks
-- @usage
-- local uv = require("luv")                    -- luv first, on the main thread
-- local ah = require("async_hooks").install()  -- patch coroutine + luv
-- print(ah._VERSION, ah.backend, ah.installed()) --> 0.1.0  lua54  true
-- local co = coroutine.create(function()
--   print(ah.executionAsyncId(), ah.triggerAsyncId()) -- the coroutine's, then 1
-- end)
-- coroutine.resume(co)
-- ah.uninstall()                               -- the original functions again

-- This file (`async_hooks.api`) is the public API over a backend.
-- Every class, argument check and error message of the library lives here,
-- once; the runtime-specific work is done by a *backend*
-- (`async_hooks.backend.lua54` over the C core, `async_hooks.backend.ngx`
-- in OpenResty).  `require("async_hooks")` picks the backend and calls this
-- module's function with it.  Written in Lua 5.1 syntax: it loads in Lua 5.4
-- and in LuaJIT.
--
-- Errors raised here carry the position of the user's call: checks are
-- written in the public function itself (`raise(msg)`, async_hooks.errors),
-- helpers only build messages.
local type, setmetatable, getmetatable, error, tostring, ipairs, pairs =
  type, setmetatable, getmetatable, error, tostring, ipairs, pairs
local floor, concat, sort = math.floor, table.concat, table.sort
local tointeger = math.tointeger or function(x) -- LuaJIT: exact integers of a double
  if x == floor(x) and x >= -2 ^ 53 and x <= 2 ^ 53 then return x end
  return nil
end
local errors = require("async_hooks.errors")
local raise, typename, LIBDIR = errors.raise, errors.typename, errors.LIBDIR


-- The backend `B` (frames, tokens and guards are opaque to this file):
-- every field it must have, with its type; checked when this module's
-- function is called, so that a missing one fails at require time under
-- its name.  Optional fields are marked.
local CONTRACT = {
  { "name", "string" }, -- "lua54" or "ngx"
  -- survives a re-`require` in the same state; this file keeps the module
  -- in persist.module
  { "persist", "table" },
  -- newtoken(): a fresh token; an AsyncLocal/AsyncLocalStorage keeps its
  -- token at obj[1], its default at obj.default
  { "newtoken", "function" },
  -- getter(method, class, message): the get function (v:get(),
  -- als:getStore()); on a bad self it raises message(self) at the caller's
  -- line (errors.raise; the C core builds the same message itself)
  { "getter", "function" },
  { "setter", "function" }, -- the same for set / enterWith
  -- run_with(obj, value, fn, ...): fn(...) with obj's value set, the whole
  -- context restored on return and on error (error value unchanged); obj
  -- and fn already checked; called as a tail call
  { "run_with", "function" },
  -- runner(message): the whole run(self, value, fn, ...) of the locals,
  -- checking self and fn itself; on bad input it raises the string
  -- message(self, value, fn) at run's caller.  Saves run a Lua call and two
  -- C calls of checks
  { "runner", "function", optional = true },
  { "current_frame", "function" },
  { "empty_frame", "function" },
  -- run_in_frame(frame, fn, ...): fn(...) in that frame, restored after
  { "run_in_frame", "function" },
  { "executionAsyncId", "function" },
  { "triggerAsyncId", "function" },
  { "executionAsyncResource", "function" },
  -- new_ids([trigger]): id, trigger of a new resource (trigger an integer
  -- >= -1, already checked; nil: the current id)
  { "new_ids", "function" },
  { "emit_init", "function" }, -- emit_init(id, type, trigger, resource)
  -- emit_destroy(id, resource, tok): tok, the resource's GC token or nil,
  -- is cancelled first (a destroy hook's error does not undo it)
  { "emit_destroy", "function" },
  -- flush(): deliver queued destroys now, unless a hook, finalizer,
  -- callback, resume or scope is running
  { "flush", "function" },
  -- gc_token(id): destroy(id) when the token is collected (emit_destroy
  -- cancels it)
  { "gc_token", "function" },
  -- hook_count(kind): enabled hook functions of kind "init", "before",
  -- "after" or "destroy"
  { "hook_count", "function" },
  -- hook_enable(h), hook_disable(h): h has fields init/before/after/destroy,
  -- each nil or callable; idempotent; return nothing
  { "hook_enable", "function" },
  { "hook_disable", "function" },
  -- run_in_scope(id, trigger, resource, frame, fn, ...): runInAsyncScope:
  -- before/after, ids, resource, frame; restored on return and error
  { "run_in_scope", "function" },
  { "coroutine", "table" }, -- the drop-in coroutine library
  { "install_options", "table" }, -- set of accepted install{} keys
  -- install(opts): opts nil or a table of accepted keys only; checks
  -- everything else before it patches anything; returns nothing when done,
  -- or a key of REFUSED and its arguments (nothing patched)
  { "install", "function" },
  -- set_debug(report): debug mode on, or off (nil).  The backend calls
  -- report(kind, where[, origin]) for what it finds: kind a key of
  -- DEBUG_FOUND, where "file:line", origin (coroutines) "file:line" of the
  -- coroutine's function or nil; as often as it likes (the api reports
  -- each site once).  A backend that finds nothing accepts it all the same
  { "set_debug", "function" },
  { "uninstall", "function" },
  { "installed", "function" },
  { "luv_covered", "table", optional = true }, -- sorted names of wrapped luv functions
  -- set_libdir(dir): the library's folder, for the positions of errors
  -- raised by the backend's C code (errors.LIBDIR)
  { "set_libdir", "function", optional = true },
}

-- Why B.install refused its options: it returns one of these keys and
-- their arguments.
local REFUSED = {
  -- (where: "opts.luv" or "package.loaded.luv")
  not_luv = function(where, v) return ("luv module in %s expected, got %s"):format(where, typename(v)) end,
  luv_lacks = function(where, k)
    return ("luv module in %s expected, got a table without '%s'"):format(where, k)
  end,
  missing = function(what) return what .. " are missing" end,
  unpatchable = function(k, v) return ("cannot patch %s (a %s)"):format(k, type(v)) end,
}

-- What debug mode reports (B.set_debug): what happened at `where` and its
-- likely cause, one line each (%s: the origin, or nothing).
local DEBUG_FOUND = {
  -- where: the user's code that called the library
  coroutine = "context read in a coroutine%s that async_hooks neither created nor resumed: " ..
    "every AsyncLocal reads its default there (likely cause: a coroutine.wrap or " ..
    "coroutine.resume saved before install(), or a coroutine made or resumed by C code)",
  -- where: the callback's definition
  luv = "luv callback runs in the empty context: every AsyncLocal reads its default " ..
    "there (likely cause: it was registered through a luv function saved in a local " ..
    "before install(), or before install() itself)",
}
-- how an origin is shown
local DEBUG_ORIGIN = { coroutine = " (its function: %s)" }

-- The message for what B.install returned, or nil when it was done.
local function refused(why, ...)
  if why == nil then return nil end
  return REFUSED[why](...)
end

-- Raise, at the api's caller, the first field of B that breaks CONTRACT.
local function check_backend(B)
  if type(B) ~= "table" then
    error("async_hooks.api: backend table expected, got " .. type(B), 3)
  end
  for _, c in ipairs(CONTRACT) do
    local name, kind = c[1], c[2]
    local v = B[name]
    if type(v) ~= kind and not (v == nil and c.optional) then
      error(("async_hooks.api: backend field '%s' (%s expected, got %s)"):format(name, kind, type(v)), 3)
    end
  end
end

-- the release this code is (its rockspec: rockspec/async-hooks-<version>-1)
local VERSION = "0.1.0"

return function(B)
  check_backend(B)
  if B.persist.module then return B.persist.module end
  if LIBDIR and B.set_libdir then B.set_libdir(LIBDIR) end

  local newtoken, current_frame, empty_frame = B.newtoken, B.current_frame, B.empty_frame
  local run_with, run_in_frame, run_in_scope = B.run_with, B.run_in_frame, B.run_in_scope
  local new_ids, emit_init, emit_destroy = B.new_ids, B.emit_init, B.emit_destroy
  local gc_token, hook_count = B.gc_token, B.hook_count

  ---@class async_hooks
  local M = { _VERSION = VERSION }

  -- classes and the module itself, by the name used in messages (a class
  -- given where an object or options were expected: `X:new()` for `X.new()`)
  local CLASSES = { [M] = "the async_hooks module" }

  -- ------------------------------------------------------------
  -- checks (message builders; the public function raises)
  -- ------------------------------------------------------------

  local callable = errors.callable

  --- What a message says it got: a class or the module given where an
  -- object or options were expected, else the type name.
  local function shown(v)
    local c = CLASSES[v]
    if c then return c .. " (call with '.', not ':')" end
    return typename(v)
  end

  local function badarg(n, fname, expected, got)
    return ("bad argument #%d to '%s' (%s expected, got %s)"):format(n, fname, expected, shown(got))
  end

  local function badself(fname, class, got)
    return ("calling '%s' on bad self (%s expected, got %s)"):format(fname, class, shown(got))
  end

  --- A backend's get/set function for `method` of `class` (B.getter or
  -- B.setter), given its bad-self message: the type name alone, as the C
  -- core builds it.
  local function accessor(make, method, class)
    return make(method, class, function(self)
      return ("calling '%s' on bad self (%s expected, got %s)"):format(method, class, typename(self))
    end)
  end

  local function keyname(k)
    if type(k) == "string" then return "'" .. k .. "'" end
    return tostring(k)
  end

  --- A set of option keys with its message form.
  local function keys(list)
    local set = { [0] = #list > 0 and concat(list, ", ") or "none" }
    for _, k in ipairs(list) do set[k] = true end
    return set
  end

  --- nil when opts (a table) has only accepted keys, else the message.
  local function unknown_key(opts, accepted, n, fname)
    for k in pairs(opts) do
      if type(k) ~= "string" or not accepted[k] then
        return ("bad argument #%d to '%s' (unknown option %s; accepted: %s)"):format(
          n, fname, keyname(k), accepted[0])
      end
    end
  end

  --- nil when opts is nil or a table of accepted keys, else the message.
  local function check_opts(opts, accepted, n, fname)
    if opts == nil then return nil end
    if type(opts) ~= "table" or CLASSES[opts] then return badarg(n, fname, "table or nil", opts) end
    return unknown_key(opts, accepted, n, fname)
  end

  --- nil when opts.name is nil or a string, else the message.
  local function check_name(opts, fname)
    local name = opts and opts.name
    if name ~= nil and type(name) ~= "string" then
      return ("bad argument #1 to '%s' (opts.name must be a string, got %s)"):format(fname, shown(name))
    end
  end

  -- ------------------------------------------------------------
  -- AsyncLocal and AsyncLocalStorage
  -- ------------------------------------------------------------

  --- A context value (TC39 `AsyncContext.Variable`, Python `ContextVar`).
  -- @type AsyncLocal
  -- @usage
  -- local request_id = ah.AsyncLocal.new { name = "request_id", default = "-" }
  -- request_id:run("req-1", function()
  --   ah.coroutine.wrap(function()
  --     print(request_id:get())            --> req-1 (the creator's value)
  --   end)()
  -- end)
  -- print(request_id:get())                --> - (restored)

  ---@class AsyncLocal
  ---@field name string the name given to `new` (`""` when none)
  ---@field default any the value `get` returns where none was set
  local AsyncLocal = { __name = "AsyncLocal" }
  AsyncLocal.__index = AsyncLocal
  CLASSES[AsyncLocal] = "class AsyncLocal"

  ---@class AsyncLocalStorage
  ---@field name string the name given to `new` (`""` when none)
  ---@field defaultValue any the store `getStore` returns where none was set
  local AsyncLocalStorage = { __name = "AsyncLocalStorage" }
  AsyncLocalStorage.__index = AsyncLocalStorage
  CLASSES[AsyncLocalStorage] = "class AsyncLocalStorage"

  -- either class: they share run/disable and the C token layout
  local LOCALS = { [AsyncLocal] = true, [AsyncLocalStorage] = true }

  local function make_run(class)
    if B.runner then
      return B.runner(function(self, _, fn)
        if LOCALS[getmetatable(self)] and not callable(fn) then return badarg(2, "run", "function", fn) end
        return badself("run", class, self)
      end)
    end
    return function(self, value, fn, ...)
      if not LOCALS[getmetatable(self)] then raise(badself("run", class, self)) end
      if type(fn) ~= "function" and not callable(fn) then raise(badarg(2, "run", "function", fn)) end
      return run_with(self, value, fn, ...)
    end
  end

  local function make_disable(class)
    return function(self)
      if not LOCALS[getmetatable(self)] then raise(badself("disable", class, self)) end
      self[1] = newtoken()
    end
  end

  local AL_KEYS = keys { "name", "default" }
  local get, set = accessor(B.getter, "get", "AsyncLocal"), accessor(B.setter, "set", "AsyncLocal")

  --- Create a context value.
  -- @tparam[opt] table opts `{name = string, default = any}`
  -- @treturn AsyncLocal with fields `name` (`""` when not given) and `default`
  ---@param opts {name: string?, default: any}|nil
  ---@return AsyncLocal
  ---@overload fun(): AsyncLocal
  function AsyncLocal.new(opts)
    local msg = check_opts(opts, AL_KEYS, 1, "new") or check_name(opts, "new")
    if msg then raise(msg) end
    -- the hot methods as own fields: one table lookup less per call
    return setmetatable({ newtoken(), name = opts and opts.name or "", default = opts and opts.default,
      get = get, set = set }, AsyncLocal)
  end

  --- The value in the current context, else `default`.  An explicit nil
  -- stored by `set(nil)`/`run(nil, ...)` shadows the default.
  -- @function AsyncLocal:get
  ---@type fun(self: AsyncLocal): any
  AsyncLocal.get = get

  --- Set the value for the rest of the current execution context (the
  -- current coroutine, callback or main chunk) and everything created from
  -- it later.
  -- @function AsyncLocal:set
  -- @param value any value, nil included
  ---@type fun(self: AsyncLocal, value: any)
  AsyncLocal.set = set

  --- Call `fn(...)` with the value set; restore the whole context afterwards,
  -- also when `fn` raises (same error value).  Returns all of `fn`'s results.
  -- May yield inside a coroutine.
  -- @function AsyncLocal:run
  -- @param value the value
  -- @tparam function fn a function or callable
  -- @param ... arguments of `fn`
  -- @return the results of `fn`
  ---@type fun(self: AsyncLocal, value: any, fn: function, ...: any): ...
  AsyncLocal.run = make_run("AsyncLocal")

  --- Forget every value stored for this variable, in every context: `get()`
  -- returns the default everywhere and the values become collectable.  A
  -- later `set`/`run` works again.
  -- @function AsyncLocal:disable
  ---@type fun(self: AsyncLocal)
  AsyncLocal.disable = make_disable("AsyncLocal")

  M.AsyncLocal = AsyncLocal

  --- Node's `AsyncLocalStorage` on the same machinery.
  -- @type AsyncLocalStorage
  -- @usage
  -- local als = ah.AsyncLocalStorage.new()
  -- als:run({ user = "ada" }, function()
  --   print(als:getStore().user)           --> ada
  --   print(als:exit(als.getStore, als))   --> nil
  -- end)

  local ALS_KEYS = keys { "name", "defaultValue" }
  local get_store = accessor(B.getter, "getStore", "AsyncLocalStorage")

  --- Create a storage.
  -- @tparam[opt] table opts `{name = string, defaultValue = any}`
  -- @treturn AsyncLocalStorage
  ---@param opts {name: string?, defaultValue: any}|nil
  ---@return AsyncLocalStorage
  ---@overload fun(): AsyncLocalStorage
  function AsyncLocalStorage.new(opts)
    local msg = check_opts(opts, ALS_KEYS, 1, "new") or check_name(opts, "new")
    if msg then raise(msg) end
    local dv = opts and opts.defaultValue
    local v = setmetatable({ newtoken(), name = opts and opts.name or "", default = dv, defaultValue = dv },
      AsyncLocalStorage)
    v.getStore = get_store
    return v
  end

  --- The current store, else `defaultValue`.
  -- @function AsyncLocalStorage:getStore
  ---@type fun(self: AsyncLocalStorage): any
  AsyncLocalStorage.getStore = get_store

  --- Run `fn(...)` with `store` as the store; restores on return and error.
  -- @function AsyncLocalStorage:run
  -- @param store the store
  -- @tparam function fn a function or callable
  -- @param ... arguments of `fn`
  -- @return the results of `fn`
  ---@type fun(self: AsyncLocalStorage, store: any, fn: function, ...: any): ...
  AsyncLocalStorage.run = make_run("AsyncLocalStorage")

  --- Set the store for the rest of the current execution context.
  -- @function AsyncLocalStorage:enterWith
  -- @param store the store
  ---@type fun(self: AsyncLocalStorage, store: any)
  AsyncLocalStorage.enterWith = accessor(B.setter, "enterWith", "AsyncLocalStorage")

  --- Run `fn(...)` with an explicit nil store (not the default).
  -- @tparam function fn a function or callable
  -- @param ... arguments of `fn`
  -- @return the results of `fn`
  ---@param fn function
  ---@return ...
  function AsyncLocalStorage:exit(fn, ...)
    if not LOCALS[getmetatable(self)] then raise(badself("exit", "AsyncLocalStorage", self)) end
    if type(fn) ~= "function" and not callable(fn) then raise(badarg(1, "exit", "function", fn)) end
    return run_with(self, nil, fn, ...)
  end

  --- Forget every store (see `AsyncLocal:disable`).
  -- @function AsyncLocalStorage:disable
  ---@type fun(self: AsyncLocalStorage)
  AsyncLocalStorage.disable = make_disable("AsyncLocalStorage")

  --- `fn` will run in the context current now.
  -- @tparam function fn a function or callable
  -- @treturn function
  ---@param fn function
  ---@return function
  function AsyncLocalStorage.bind(fn)
    if type(fn) ~= "function" and not callable(fn) then raise(badarg(1, "bind", "function", fn)) end
    local frame = current_frame()
    return function(...) return run_in_frame(frame, fn, ...) end
  end

  --- A function `(fn, ...)` that runs `fn(...)` in the context current now.
  -- @treturn function
  ---@return fun(fn: function, ...: any): ...
  function AsyncLocalStorage.snapshot()
    local frame = current_frame()
    return function(fn, ...)
      if type(fn) ~= "function" and not callable(fn) then raise(badarg(1, "snapshot", "function", fn)) end
      return run_in_frame(frame, fn, ...)
    end
  end

  M.AsyncLocalStorage = AsyncLocalStorage

  -- ------------------------------------------------------------
  -- Snapshot (TC39's face)
  -- ------------------------------------------------------------

  --- A captured context (TC39 `AsyncContext.Snapshot`).
  -- @type Snapshot
  -- @usage
  -- local v = ah.AsyncLocal.new()
  -- local snap = v:run("inside", ah.Snapshot.new)
  -- print(snap:run(v.get, v))                --> inside
  -- print(ah.Snapshot.empty():run(v.get, v)) --> nil (every value at its default)

  ---@class Snapshot
  local Snapshot = { __name = "Snapshot" }
  Snapshot.__index = Snapshot
  CLASSES[Snapshot] = "class Snapshot"

  --- Capture the current context.
  -- @treturn Snapshot
  ---@return Snapshot
  function Snapshot.new()
    return setmetatable({ frame = current_frame() }, Snapshot)
  end

  --- The empty context: every value at its default.  For work that must
  -- not inherit the current request (a pooled connection's reader).
  -- @treturn Snapshot
  ---@return Snapshot
  function Snapshot.empty()
    return setmetatable({ frame = empty_frame() }, Snapshot)
  end

  --- Run `fn(...)` in the captured context.  Values not in the snapshot
  -- (including of `AsyncLocal`s made later) read as their defaults.
  -- Restores on return and error.
  -- @tparam function fn a function or callable
  -- @param ... arguments of `fn`
  -- @return the results of `fn`
  ---@param fn function
  ---@return ...
  function Snapshot:run(fn, ...)
    if getmetatable(self) ~= Snapshot then raise(badself("run", "Snapshot", self)) end
    if type(fn) ~= "function" and not callable(fn) then raise(badarg(1, "run", "function", fn)) end
    return run_in_frame(self.frame, fn, ...)
  end

  --- A function that runs `fn` in the context current now.
  -- @tparam function fn a function or callable
  -- @treturn function
  ---@param fn function
  ---@return function
  function Snapshot.wrap(fn)
    if type(fn) ~= "function" and not callable(fn) then raise(badarg(1, "wrap", "function", fn)) end
    local frame = current_frame()
    return function(...) return run_in_frame(frame, fn, ...) end
  end

  M.Snapshot = Snapshot

  -- ------------------------------------------------------------
  -- ids and hooks
  -- ------------------------------------------------------------

  --- Ids and hooks.
  -- @section ids

  --- The asyncId of what is running now (1 at top level).
  -- @function executionAsyncId
  -- @treturn integer
  ---@type fun(): integer
  M.executionAsyncId = B.executionAsyncId

  --- The asyncId of what created what is running now (0 at top level).
  -- @function triggerAsyncId
  -- @treturn integer
  ---@type fun(): integer
  M.triggerAsyncId = B.triggerAsyncId

  --- The resource of what is running now: a coroutine's `{thread = co}`, an
  -- `AsyncResource`, a luv callback's `{handle = h, op = name, ...}`; one
  -- fixed table at top level.
  -- @function executionAsyncResource
  -- @treturn table
  ---@type fun(): table
  M.executionAsyncResource = B.executionAsyncResource

  --- The resource of a coroutine or a luv registration: the table `init`
  -- receives and `executionAsyncResource()` returns inside it (an
  -- `AsyncResource` is its own resource).  A luv resource says what the
  -- work is, with the call's arguments as given (see @{hooks.md}).
  -- @table resource
  -- @field thread the coroutine (coroutine resources only)
  -- @field op the luv function that took the callback, by its module name:
  --   `"timer_start"`, `"tcp_connect"`, `"fs_open"`, ... (every luv resource)
  -- @field handle the handle (or `uv_dir`) the call was made on; for
  --   `new_async` and `spawn`, the handle they return
  -- @field path the path argument (fs calls that take a path)
  -- @field new_path the second path (`fs_rename`, `fs_link`, `fs_symlink`,
  --   `fs_copyfile`)
  -- @field host the address or name as given (`tcp_connect`, `udp_send`,
  --   `getaddrinfo`)
  -- @field port the port as given (`tcp_connect`, `udp_send`)
  -- @field service the service as given, absent when nil (`getaddrinfo`)

  --- Deliver the queued `destroy` hooks now, for event loops the library
  -- does not integrate.  Does nothing inside a hook or a finalizer, nor
  -- while a callback, resume or scope is running (they deliver them when
  -- the outermost one returns).
  -- @function flush
  ---@type fun()
  M.flush = function() B.flush() end

  ---@class AsyncHook
  ---@field init fun(asyncId: integer, type: string, triggerAsyncId: integer, resource: table)|nil
  ---@field before fun(asyncId: integer)|nil
  ---@field after fun(asyncId: integer)|nil
  ---@field destroy fun(asyncId: integer)|nil
  local AsyncHook = { __name = "AsyncHook" }
  AsyncHook.__index = AsyncHook
  CLASSES[AsyncHook] = "class AsyncHook"
  local KINDS = { "init", "before", "after", "destroy" }
  local HOOK_KEYS = keys(KINDS)

  --- Create a (disabled) hook.
  -- @tparam table callbacks any subset of `{init, before, after, destroy}`,
  --   each a function or callable
  -- @treturn AsyncHook with `enable()` and `disable()`
  ---@param callbacks {init: function?, before: function?, after: function?, destroy: function?}
  ---@return AsyncHook
  function M.createHook(callbacks)
    if type(callbacks) ~= "table" or CLASSES[callbacks] then raise(badarg(1, "createHook", "table", callbacks)) end
    local msg = unknown_key(callbacks, HOOK_KEYS, 1, "createHook")
    if msg then raise(msg) end
    local h = setmetatable({}, AsyncHook)
    for _, k in ipairs(KINDS) do
      local f = callbacks[k]
      if f ~= nil then
        if not callable(f) then
          raise(("bad argument #1 to 'createHook' (hook.%s must be a function, got %s)"):format(k, shown(f)))
        end
        h[k] = f
      end
    end
    return h
  end

  --- A set of hook callbacks, made by `createHook`: the functions given
  -- to it, as its fields `init`, `before`, `after` and `destroy`, are
  -- called with these arguments.  See @{hooks.md} for the order of
  -- the events and the resources.
  -- @type AsyncHook
  -- @usage
  -- local types = {}
  -- local hook = ah.createHook {
  --   init = function(asyncId, type, triggerAsyncId, resource)
  --     types[asyncId] = type                -- "coroutine", "uv_timer", ...
  --   end,
  --   destroy = function(asyncId) types[asyncId] = nil end,
  -- }:enable()
  -- local co = ah.coroutine.create(function() end)
  -- hook:disable()

  --- Called when a resource is created: a coroutine, an `AsyncResource`,
  -- a luv registration.
  -- @function AsyncHook.init
  -- @tparam integer asyncId the new resource's id
  -- @tparam string type `"coroutine"`, the `AsyncResource`'s type, `"uv_timer"`, ...
  -- @tparam integer triggerAsyncId the id of what created it
  -- @tparam table resource the `resource` table; nil when the function
  --   cannot read a fourth argument (fewer parameters, no `...`)

  --- Called before the resource's code runs (a resume slice, a callback,
  -- a scope).
  -- @function AsyncHook.before
  -- @tparam integer asyncId the resource's id

  --- Called after the resource's code has run (also when it raised).
  -- @function AsyncHook.after
  -- @tparam integer asyncId the resource's id

  --- Called once the resource is gone (returned, closed, destroyed or
  -- collected); never inside a finalizer or another hook.
  -- @function AsyncHook.destroy
  -- @tparam integer asyncId the resource's id


  --- Enable the hook (idempotent).
  -- @treturn AsyncHook the hook
  ---@return AsyncHook
  function AsyncHook:enable()
    if getmetatable(self) ~= AsyncHook then raise(badself("enable", "AsyncHook", self)) end
    B.hook_enable(self)
    return self
  end

  --- Disable the hook (idempotent).
  -- @treturn AsyncHook the hook
  ---@return AsyncHook
  function AsyncHook:disable()
    if getmetatable(self) ~= AsyncHook then raise(badself("disable", "AsyncHook", self)) end
    B.hook_disable(self)
    return self
  end


  -- ------------------------------------------------------------
  -- AsyncResource
  -- ------------------------------------------------------------

  --- A user-defined async resource (Node's `AsyncResource`).
  -- @type AsyncResource
  -- @usage
  -- local DbQuery = {}                       -- a pooled client's request
  -- function DbQuery.start(sql, callback)
  --   local res = ah.AsyncResource.new("DbQuery")  -- captures the context now
  --   pool:send(sql, function(rows)          -- later, outside that context
  --     res:runInAsyncScope(callback, rows)  -- back in it, with before/after
  --     res:emitDestroy()
  --   end)
  -- end

  ---@class AsyncResource
  local AsyncResource = { __name = "AsyncResource" }
  AsyncResource.__index = AsyncResource
  CLASSES[AsyncResource] = "class AsyncResource"
  local AR_KEYS = keys { "triggerAsyncId", "requireManualDestroy" }

  local function make_resource(type_, trigger, manual)
    local id, trig = new_ids(trigger)
    local self = setmetatable({ _id = id, _trigger = trig, _frame = current_frame() }, AsyncResource)
    if not manual and hook_count("destroy") > 0 then self._gctok = gc_token(id) end
    emit_init(id, type_, trig, self)
    return self
  end

  --- nil, trigger, manual; or the message
  local function check_resource_opts(opts)
    local trigger, manual
    if type(opts) == "number" then
      trigger = opts
    elseif type(opts) == "table" and not CLASSES[opts] then
      local msg = unknown_key(opts, AR_KEYS, 2, "new")
      if msg then return msg end
      trigger, manual = opts.triggerAsyncId, opts.requireManualDestroy
      if manual ~= nil and type(manual) ~= "boolean" then
        return "bad argument #2 to 'new' (requireManualDestroy must be a boolean, got " .. shown(manual) .. ")"
      end
    elseif opts ~= nil then
      return badarg(2, "new", "number, table or nil", opts)
    end
    if trigger ~= nil then
      local t = type(trigger) == "number" and tointeger(trigger)
      if not t or t < -1 then
        return "bad argument #2 to 'new' (triggerAsyncId must be an integer >= -1, got " ..
          (type(trigger) == "number" and tostring(trigger) or shown(trigger)) .. ")"
      end
      trigger = t
    end
    return nil, trigger, manual
  end

  --- Create a resource; emits `init` with the resource itself.
  -- @tparam string type_name non-empty
  -- @param[opt] opts a triggerAsyncId, or `{triggerAsyncId = integer >= -1,
  --   requireManualDestroy = boolean}`
  -- @treturn AsyncResource
  ---@param type_name string
  ---@param opts integer|{triggerAsyncId: integer?, requireManualDestroy: boolean?}|nil
  ---@return AsyncResource
  ---@overload fun(type_name: string): AsyncResource
  function AsyncResource.new(type_name, opts)
    if type(type_name) ~= "string" or type_name == "" then
      raise(badarg(1, "new", "non-empty string", type_name))
    end
    local trigger, manual
    if opts ~= nil then
      local msg
      msg, trigger, manual = check_resource_opts(opts)
      if msg then raise(msg) end
    end
    return make_resource(type_name, trigger, manual)
  end

  --- Run `fn(...)` in the resource's context: `before`/`after` around it,
  -- `executionAsyncId()` the resource's, `executionAsyncResource()` the
  -- resource, the frame captured at `new`.  May yield inside a coroutine.
  -- Restores on return and error.
  -- @tparam function fn a function or callable
  -- @param ... arguments of `fn`
  -- @return the results of `fn`
  ---@param fn function
  ---@return ...
  function AsyncResource:runInAsyncScope(fn, ...)
    if getmetatable(self) ~= AsyncResource then raise(badself("runInAsyncScope", "AsyncResource", self)) end
    if type(fn) ~= "function" and not callable(fn) then raise(badarg(1, "runInAsyncScope", "function", fn)) end
    return run_in_scope(self._id, self._trigger, self, self._frame, fn, ...)
  end

  --- Emit `destroy` (once).
  -- @treturn AsyncResource the resource
  ---@return AsyncResource
  function AsyncResource:emitDestroy()
    if getmetatable(self) ~= AsyncResource then raise(badself("emitDestroy", "AsyncResource", self)) end
    if not self._destroyed then
      -- once only; the backend cancels the GC token and marks the
      -- resource destroyed (a scope of it open in a suspended coroutine
      -- stays out, with no more before/after)
      self._destroyed = true
      emit_destroy(self._id, self, self._gctok)
    end
    return self
  end

  --- The resource's asyncId.
  -- @treturn integer
  ---@return integer
  function AsyncResource:asyncId()
    if getmetatable(self) ~= AsyncResource then raise(badself("asyncId", "AsyncResource", self)) end
    return self._id
  end

  --- The resource's triggerAsyncId.
  -- @treturn integer
  ---@return integer
  function AsyncResource:triggerAsyncId()
    if getmetatable(self) ~= AsyncResource then raise(badself("triggerAsyncId", "AsyncResource", self)) end
    return self._trigger
  end

  --- A function that runs `fn(...)` in the scope of a new resource, made
  -- now (as by `AsyncResource.new(type)`).
  -- @function AsyncResource.bind
  -- @tparam function fn a function or callable
  -- @tparam[opt="bound-anonymous-fn"] string type the resource's type
  -- @treturn function

  --- A function that runs `fn(...)` in this resource's scope, as
  -- `runInAsyncScope` does.
  -- @function AsyncResource:bind
  -- @tparam function fn a function or callable
  -- @treturn function
  ---@param fn function
  ---@return function
  ---@overload fun(fn: function, type: string?): function
  function AsyncResource.bind(a, b)
    local self, fn
    if getmetatable(a) == AsyncResource then
      if type(b) ~= "function" and not callable(b) then raise(badarg(1, "bind", "function", b)) end
      self, fn = a, b
    else
      if type(a) ~= "function" and not callable(a) then raise(badarg(1, "bind", "function", a)) end
      if b ~= nil and (type(b) ~= "string" or b == "") then raise(badarg(2, "bind", "non-empty string or nil", b)) end
      self, fn = make_resource(b or "bound-anonymous-fn"), a
    end
    local id, trig, frame = self._id, self._trigger, self._frame
    return function(...) return run_in_scope(id, trig, self, frame, fn, ...) end
  end

  M.AsyncResource = AsyncResource

  -- ------------------------------------------------------------
  -- coroutine library and installation
  -- ------------------------------------------------------------

  --- Integration.
  -- @section integration

  --- Drop-in `coroutine` library with propagation, for code that does not
  -- want global patching.
  -- @table coroutine
  ---@type coroutinelib
  M.coroutine = B.coroutine

  local INSTALL_KEYS
  do
    local list = {}
    for k in pairs(B.install_options) do list[#list + 1] = k end
    sort(list)
    INSTALL_KEYS = keys(list)
  end

  -- debug mode: each site is reported once per program run
  local reported = {}

  local function to_stderr(msg)
    io.stderr:write(msg, "\n")
  end

  --- The report function of debug mode for B.set_debug: each finding
  -- once per site, as one line, to sink.
  local function reporter(sink)
    return function(kind, where, origin)
      local key = kind .. " " .. where
      if reported[key] then return end
      reported[key] = true
      local o = origin and DEBUG_ORIGIN[kind] and DEBUG_ORIGIN[kind]:format(origin) or ""
      sink(("async_hooks debug: %s: " .. DEBUG_FOUND[kind]):format(where, o))
    end
  end

  --- nil when opts.debug is nil, a boolean or a function, else the message.
  local function check_debug(opts)
    local d = opts and opts.debug
    if d ~= nil and type(d) ~= "boolean" and not callable(d) then
      return "bad argument #1 to 'install' (opts.debug must be a boolean or function, got " .. shown(d) .. ")"
    end
  end

  --- Patch what carries context, so that existing code propagates it.  On
  -- Lua 5.4: the global `coroutine` library's `create`, `wrap`, `resume` and
  -- `close`, and luv (loaded, given as `opts.luv`, or required later: until
  -- then a metatable on `package.loaded` waits for it): its callback-taking
  -- functions (@{luv_covered}), the `__index` of its metatables and `uv.run`;
  -- cqueues (loaded or required later): its controller methods `wrap` and
  -- `step`.  Inside OpenResty: `coroutine.create`, `wrap` and `yield`, `ngx.thread`
  -- and `ngx.timer`.  Below Lua 5.4 (the pure-Lua backend): coroutines and
  -- luv the same way, and in Neovim `vim.schedule` (which `vim.defer_fn`
  -- calls).  `uninstall()` puts every original back.  Idempotent.
  -- Checks everything before it patches anything.
  -- `opts.debug` turns on debug mode, which reports where context is lost
  -- silently (a coroutine the library did not create reads a value, a luv
  -- callback registered behind its back runs): `true` writes one line per
  -- site to stderr, a function is called with that line instead (where the
  -- loss was found: it should only log), `false`
  -- turns it off; nil leaves it as it is, unless the environment variable
  -- `ASYNC_HOOKS_DEBUG` is set (and not `0`): then it is `true`.
  -- @tparam[opt] table opts `{luv = module, debug = boolean|function}`
  -- @return the module
  ---@param opts {luv: table?, debug: boolean|fun(msg: string)|nil}|nil
  ---@return async_hooks
  function M.install(opts)
    local msg = check_opts(opts, INSTALL_KEYS, 1, "install") or check_debug(opts)
    if msg then raise(msg) end
    local why = refused(B.install(opts))
    if why then raise("bad argument #1 to 'install' (" .. why .. ")") end
    local d = opts and opts.debug
    if d == nil then
      local env = os.getenv("ASYNC_HOOKS_DEBUG")
      if env ~= nil and env ~= "" and env ~= "0" then d = true end
    end
    if d == true then
      B.set_debug(reporter(to_stderr))
    elseif d == false then
      B.set_debug(nil)
    elseif d ~= nil then
      B.set_debug(reporter(function(line) d(line) end))
    end
    return M
  end

  --- Restore every patched function (the original values), remove what
  -- waits for luv to be required and end debug mode.  Runs no user code.
  -- @return the module
  ---@return async_hooks
  function M.uninstall()
    B.uninstall()
    B.set_debug(nil)
    return M
  end

  --- Whether `install()` is in effect.
  -- @treturn boolean
  ---@return boolean
  function M.installed()
    return B.installed()
  end

  --- The luv functions whose callbacks are wrapped (sorted names; Lua 5.4):
  -- once luv is loaded, only those that it has.
  -- @table luv_covered
  ---@type string[]|nil
  M.luv_covered = B.luv_covered

  --- The release this code is: `"0.1.0"`.
  -- @field _VERSION

  --- The backend in use: `"lua54"` (the C core), `"ngx"` (OpenResty) or
  -- `"luv_lua"` (plain Lua: LuaJIT, Lua 5.1 to 5.3).
  ---@type string
  M.backend = B.name

  B.persist.module = M
  return M
end
