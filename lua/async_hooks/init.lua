--- Request context that follows coroutines and luv callbacks.
--
-- Node's `async_hooks` + `AsyncLocalStorage` (and TC39 `AsyncContext`) for
-- Lua 5.4: `AsyncLocal` values propagate from a coroutine's creator into the
-- coroutine and from a luv registration into its callback, without being
-- passed by hand.  The C core (`async_hooks.core`) keeps the contexts; this
-- module is the public face.
-- @module async_hooks
local core = require("async_hooks.core")
local luvmod = require("async_hooks.luv")

-- One module per Lua state: busted (and others) may re-run this file in the
-- same state; the classes must stay the same objects.
local persist = core.persist()
if persist.module then return persist.module end

local type, select, setmetatable, getmetatable, error, tostring, ipairs, pairs =
  type, select, setmetatable, getmetatable, error, tostring, ipairs, pairs
local mtointeger = math.tointeger
local newtoken, enter, swap, current_frame = core.newtoken, core.enter, core.swap, core.current_frame
local enter_scope, new_ids, emit_init, emit_destroy = core.enter_scope, core.new_ids, core.emit_init, core.emit_destroy
local gc_token, gc_token_cancel, hook_counts = core.gc_token, core.gc_token_cancel, core.hook_counts
local stdco = coroutine

local M = {}

local function callable(f)
  if type(f) == "function" then return true end
  local mt = getmetatable(f)
  return type(mt) == "table" and type(mt.__call) == "function"
end

local function typename(v)
  local mt = getmetatable(v)
  if type(mt) == "table" and type(mt.__name) == "string" then return mt.__name end
  return type(v)
end

-- raise "bad argument #n to 'fname' (msg)" at the caller of the API function
local function argerror(n, fname, expected, got)
  error(("bad argument #%d to '%s' (%s expected, got %s)"):format(n, fname, expected, typename(got)), 3)
end

local function selferror(fname, class, got)
  error(("calling '%s' on bad self (%s expected, got %s)"):format(fname, class, typename(got)), 3)
end

local function check_opts(opts, fname)
  if opts ~= nil and type(opts) ~= "table" then argerror(1, fname, "table or nil", opts) end
  local name = opts and opts.name
  if name == nil then
    name = ""
  elseif type(name) ~= "string" then
    error(("bad argument #1 to '%s' (opts.name must be a string, got %s)"):format(fname, typename(name)), 3)
  end
  return name
end

---------------------------------------------------------------------------
-- AsyncLocal
---------------------------------------------------------------------------

--- A context value (TC39 `AsyncContext.Variable`, Python `ContextVar`).
-- @type AsyncLocal
local AsyncLocal = { __name = "AsyncLocal" }
AsyncLocal.__index = AsyncLocal

--- Create a context value.
-- @tparam[opt] table opts `{name = string, default = any}`
-- @treturn AsyncLocal with fields `name` (`""` when not given) and `default`
function AsyncLocal.new(opts)
  local name = check_opts(opts, "new")
  local v = setmetatable({ newtoken(), name = name, default = opts and opts.default }, AsyncLocal)
  v.get = core.get -- hot methods as own fields: one table lookup less per call
  return v
end

--- The value in the current context, else `default`.  An explicit nil
-- stored by `set(nil)`/`run(nil, ...)` shadows the default.
-- @function AsyncLocal:get
AsyncLocal.get = core.get

--- Set the value for the rest of the current execution context (the current
-- coroutine, callback or main chunk) and everything created from it later.
-- @function AsyncLocal:set
-- @param value any value, nil included
AsyncLocal.set = core.set

--- Call `fn(...)` with the value set; restore the whole context afterwards,
-- also when `fn` raises.  Returns all of `fn`'s results.
-- @param value
-- @tparam function fn
function AsyncLocal:run(value, fn, ...)
  local prev <close> = enter(self, value, fn) -- checks self and fn
  return fn(...)
end

--- Forget every value stored for this variable, in every context: `get()`
-- returns the default everywhere and the values become collectable.  A later
-- `set`/`run` works again.
function AsyncLocal:disable()
  if getmetatable(self) ~= AsyncLocal then selferror("disable", "AsyncLocal", self) end
  self[1] = newtoken()
end

M.AsyncLocal = AsyncLocal

---------------------------------------------------------------------------
-- AsyncLocalStorage (Node's face)
---------------------------------------------------------------------------

--- Node's `AsyncLocalStorage` on the same machinery.
-- @type AsyncLocalStorage
local AsyncLocalStorage = { __name = "AsyncLocalStorage" }
AsyncLocalStorage.__index = AsyncLocalStorage

--- @tparam[opt] table opts `{name = string, defaultValue = any}`
function AsyncLocalStorage.new(opts)
  local name = check_opts(opts, "new")
  local dv = opts and opts.defaultValue
  local v = setmetatable({ newtoken(), name = name, default = dv, defaultValue = dv }, AsyncLocalStorage)
  v.getStore = core.get
  return v
end

--- The current store.
-- @function AsyncLocalStorage:getStore
AsyncLocalStorage.getStore = core.get

--- Run `fn(...)` with `store` as the store; restores on return and error.
function AsyncLocalStorage:run(store, fn, ...)
  local prev <close> = enter(self, store, fn) -- checks self and fn
  return fn(...)
end

--- Set the store for the rest of the current execution context.
-- @function AsyncLocalStorage:enterWith
AsyncLocalStorage.enterWith = core.set

--- Run `fn(...)` with an explicit nil store.
function AsyncLocalStorage:exit(fn, ...)
  if getmetatable(self) ~= AsyncLocalStorage then selferror("exit", "AsyncLocalStorage", self) end
  if not callable(fn) then argerror(1, "exit", "function", fn) end
  local prev <close> = enter(self, nil, fn)
  return fn(...)
end

--- Forget every store (see `AsyncLocal:disable`).
function AsyncLocalStorage:disable()
  if getmetatable(self) ~= AsyncLocalStorage then selferror("disable", "AsyncLocalStorage", self) end
  self[1] = newtoken()
end

M.AsyncLocalStorage = AsyncLocalStorage

---------------------------------------------------------------------------
-- Snapshot (TC39's face)
---------------------------------------------------------------------------

--- A captured context (TC39 `AsyncContext.Snapshot`).
-- @type Snapshot
local Snapshot = { __name = "Snapshot" }
Snapshot.__index = Snapshot

--- Capture the current context.
function Snapshot.new()
  return setmetatable({ frame = current_frame() }, Snapshot)
end

--- Run `fn(...)` in the captured context.  Variables that were not set when
-- the snapshot was taken (including those created later) read as their
-- defaults.
function Snapshot:run(fn, ...)
  if getmetatable(self) ~= Snapshot then selferror("run", "Snapshot", self) end
  if not callable(fn) then argerror(1, "run", "function", fn) end
  local prev <close> = swap(self.frame)
  return fn(...)
end

local function wrap_in(frame, fn)
  return function(...)
    local prev <close> = swap(frame)
    return fn(...)
  end
end

--- A function that runs `fn` in the context current now.
-- @tparam function fn
function Snapshot.wrap(fn)
  if not callable(fn) then argerror(1, "wrap", "function", fn) end
  return wrap_in(current_frame(), fn)
end

M.Snapshot = Snapshot

--- `AsyncLocalStorage.bind(fn)`: `fn` will run in the context current now.
function AsyncLocalStorage.bind(fn)
  if not callable(fn) then argerror(1, "bind", "function", fn) end
  return wrap_in(current_frame(), fn)
end

--- `AsyncLocalStorage.snapshot()`: a function `(fn, ...)` that runs `fn` in
-- the context current now.
function AsyncLocalStorage.snapshot()
  local frame = current_frame()
  return function(fn, ...)
    if not callable(fn) then argerror(1, "snapshot", "function", fn) end
    local prev <close> = swap(frame)
    return fn(...)
  end
end

---------------------------------------------------------------------------
-- ids, hooks
---------------------------------------------------------------------------

--- The asyncId of what is running now (1 at top level).
-- @function executionAsyncId
M.executionAsyncId = core.executionAsyncId

--- The asyncId of what created what is running now (0 at top level).
-- @function triggerAsyncId
M.triggerAsyncId = core.triggerAsyncId

--- The resource of what is running now: a coroutine's `{thread = co}`, an
-- `AsyncResource`, a luv callback's `{handle = h}`; one fixed table at top
-- level.
-- @function executionAsyncResource
M.executionAsyncResource = core.executionAsyncResource

local Hook = { __name = "AsyncHook" }
Hook.__index = Hook
local KINDS = { "init", "before", "after", "destroy" }

--- Create a (disabled) hook.
-- @tparam table callbacks any subset of `{init, before, after, destroy}`
-- @treturn AsyncHook with `enable()` and `disable()`
function M.createHook(callbacks)
  if type(callbacks) ~= "table" then argerror(1, "createHook", "table", callbacks) end
  local h = setmetatable({}, Hook)
  for _, k in ipairs(KINDS) do
    local f = callbacks[k]
    if f ~= nil then
      if type(f) ~= "function" then error("hook." .. k .. " must be a function", 2) end
      h[k] = f
    end
  end
  return h
end

--- Enable the hook (idempotent).  @return the hook
function Hook:enable()
  if getmetatable(self) ~= Hook then selferror("enable", "AsyncHook", self) end
  return core.hook_enable(self)
end

--- Disable the hook (idempotent).  @return the hook
function Hook:disable()
  if getmetatable(self) ~= Hook then selferror("disable", "AsyncHook", self) end
  return core.hook_disable(self)
end

---------------------------------------------------------------------------
-- AsyncResource
---------------------------------------------------------------------------

--- A user-defined async resource (Node's `AsyncResource`).
-- @type AsyncResource
local AsyncResource = { __name = "AsyncResource" }
AsyncResource.__index = AsyncResource

--- @tparam string type non-empty
-- @param[opt] opts a triggerAsyncId, or `{triggerAsyncId = integer >= -1,
--   requireManualDestroy = boolean}`
function AsyncResource.new(type_, opts)
  if type(type_) ~= "string" or type_ == "" then argerror(1, "new", "non-empty string", type_) end
  local trigger, manual
  if type(opts) == "number" then
    trigger = opts
  elseif type(opts) == "table" then
    trigger, manual = opts.triggerAsyncId, opts.requireManualDestroy
    if manual ~= nil and type(manual) ~= "boolean" then
      error("bad argument #2 to 'new' (requireManualDestroy must be a boolean, got " .. typename(manual) .. ")", 2)
    end
  elseif opts ~= nil then
    argerror(2, "new", "number, table or nil", opts)
  end
  if trigger ~= nil then
    local t = type(trigger) == "number" and mtointeger(trigger)
    if not t or t < -1 then
      error("bad argument #2 to 'new' (triggerAsyncId must be an integer >= -1, got " .. tostring(trigger) .. ")", 2)
    end
    trigger = t
  end
  local id, trig = new_ids(trigger)
  local self = setmetatable({ _id = id, _trigger = trig, _frame = current_frame() }, AsyncResource)
  if not manual and select(4, hook_counts()) > 0 then self._gctok = gc_token(id) end
  emit_init(id, type_, trig, self)
  return self
end

local function check_resource(self, fname)
  if getmetatable(self) ~= AsyncResource then selferror(fname, "AsyncResource", self) end
end

--- Run `fn(...)` in the resource's context: `before`/`after` around it,
-- `executionAsyncId()` the resource's, the frame captured at `new`.
-- May yield when called inside a coroutine.  Restores on error.
function AsyncResource:runInAsyncScope(fn, ...)
  check_resource(self, "runInAsyncScope")
  if not callable(fn) then argerror(1, "runInAsyncScope", "function", fn) end
  local g <close> = enter_scope(self._id, self._trigger, self, self._frame)
  return fn(...)
end

--- Emit `destroy` (once).  @return the resource
function AsyncResource:emitDestroy()
  check_resource(self, "emitDestroy")
  if not self._destroyed then
    self._destroyed = true
    if self._gctok then gc_token_cancel(self._gctok) end
    emit_destroy(self._id)
  end
  return self
end

--- @treturn integer
function AsyncResource:asyncId()
  check_resource(self, "asyncId")
  return self._id
end

--- @treturn integer
function AsyncResource:triggerAsyncId()
  check_resource(self, "triggerAsyncId")
  return self._trigger
end

--- `resource:bind(fn)` returns a function running `fn` in this resource's
-- scope; `AsyncResource.bind(fn[, type])` makes a new resource for it.
function AsyncResource.bind(a, b)
  if getmetatable(a) == AsyncResource then
    local self, fn = a, b
    if not callable(fn) then argerror(1, "bind", "function", fn) end
    return function(...) return self:runInAsyncScope(fn, ...) end
  end
  if not callable(a) then argerror(1, "bind", "function", a) end
  if b ~= nil and type(b) ~= "string" then argerror(2, "bind", "string or nil", b) end
  local r = AsyncResource.new(b or "bound-anonymous-fn")
  return AsyncResource.bind(r, a)
end

M.AsyncResource = AsyncResource

---------------------------------------------------------------------------
-- coroutine library and installation
---------------------------------------------------------------------------

local coro = core.coro

--- Drop-in `coroutine` library with propagation.
M.coroutine = {
  create = coro.create, wrap = coro.wrap, resume = coro.resume, close = coro.close,
  yield = stdco.yield, status = stdco.status, running = stdco.running,
  isyieldable = stdco.isyieldable,
}

local PATCHED = { "create", "wrap", "resume", "close" }

--- Patch the global `coroutine` library (and luv, when loaded or given as
-- `opts.luv`).  Idempotent.
-- @tparam[opt] table opts `{luv = module}`
-- @return the module
function M.install(opts)
  if opts ~= nil and type(opts) ~= "table" then argerror(1, "install", "table or nil", opts) end
  local uv = opts and opts.luv or package.loaded.luv
  if uv ~= nil and type(uv) ~= "table" then argerror(1, "install", "luv module in opts.luv", uv) end
  if not persist.coroutine then
    local saved = {}
    for _, k in ipairs(PATCHED) do saved[k] = stdco[k]; stdco[k] = coro[k] end
    persist.coroutine = saved
  end
  if uv ~= nil then
    luvmod.attach(uv, persist)
  elseif not persist.preload then
    -- luv required later: integrate it as it loads
    local function preload(name, ...)
      package.preload.luv = nil
      persist.preload = nil
      for i = 2, #package.searchers do
        local loader, extra = package.searchers[i](name)
        if type(loader) == "function" then
          local mod = loader(name, extra)
          if persist.coroutine then luvmod.attach(mod, persist) end
          return mod
        end
      end
      error("module '" .. name .. "' not found", 2)
    end
    persist.preload = preload
    package.preload.luv = preload
  end
  return M
end

--- Restore every patched function (the original values).
-- @return the module
function M.uninstall()
  local saved = persist.coroutine
  if saved then
    for k, f in pairs(saved) do stdco[k] = f end
    persist.coroutine = nil
  end
  if persist.preload and package.preload.luv == persist.preload then
    package.preload.luv = nil
  end
  persist.preload = nil
  luvmod.detach(persist)
  return M
end

--- Whether `install()` is in effect.
function M.installed()
  return persist.coroutine ~= nil
end

--- The luv functions whose callbacks are wrapped (sorted names).
M.luv_covered = luvmod.covered

M.core = core
persist.module = M
return M
