--- opentelemetry-lua integration: a current span for every execution context.
--
-- opentelemetry-lua keeps its stack of current contexts in a table it gets
-- from `require("opentelemetry.global").get_context_storage()` (`ngx.ctx`
-- unless replaced) and changes that stack in place (`attach` pushes,
-- `detach` pops).  With `ngx.ctx`, the light threads and coroutines of a
-- request share one stack, and a timer starts with none.  `storage()`
-- returns a table to pass to `set_context_storage` in which each execution
-- context (a request, a light thread, a timer run, a coroutine, a luv
-- callback) has its own stack, starting as its creator's was when it was
-- created; attach/detach in one never disturb another.  The phases of one
-- request (rewrite, access, content, log) share theirs.
--
--    local ah = require("async_hooks").install()
--    local otel = require("async_hooks.otel")
--    require("opentelemetry.global").set_context_storage(otel.storage())
--    local processor = otel.isolate(batch_span_processor.new(exporter))
--
-- Plain Lua over the public API (`AsyncLocal`, `Snapshot`,
-- `executionAsyncId`): the same on Lua 5.4 and in OpenResty.  Values
-- propagate into coroutines, light threads and timers only after
-- `install()` (or through `async_hooks.coroutine`).
-- @module async_hooks.otel

local type, setmetatable, getmetatable, pairs, next, error, tostring, rawget =
  type, setmetatable, getmetatable, pairs, next, error, tostring, rawget
local ah = require("async_hooks")
local AsyncLocal, executionAsyncId = ah.AsyncLocal, ah.executionAsyncId

---@class async_hooks.otel
local M = {}

-- A key's value is kept in an AsyncLocal of its own.  A table value (the
-- stack) is kept as a record {owner, table}: `owner` the executionAsyncId
-- of the context that stored it.  Every read of a table returns a fresh
-- copy, stored as the context's own record before it is returned: the
-- caller changes that copy in place (table.insert/remove), and a context
-- created in the meantime holds the previous record, whose table nobody
-- changes any more, so it starts from the stack as it was when it was
-- created.  (opentelemetry-lua reads the stack through the storage before
-- each change: `table.insert(storage[key], ctx)`.)  A table inherited from
-- another context that is empty reads as nil, as a fresh `ngx.ctx` does.

local function copy(t)
  local c = {}
  for k, v in pairs(t) do c[k] = v end
  return c
end

local function read(locals, key)
  local al = locals[key]
  if al == nil then return nil end
  local rec = al:get()
  if type(rec) ~= "table" then return rec end
  local t = rec[2]
  local id = executionAsyncId()
  if rec[1] ~= id and next(t) == nil then return nil end
  local c = copy(t)
  al:set({ id, c })
  return c
end

local function write(locals, key, value)
  local al = locals[key]
  if al == nil then
    if value == nil then return end
    al = AsyncLocal.new { name = "async_hooks.otel " .. tostring(key) }
    locals[key] = al
  end
  if type(value) == "table" then
    al:set({ executionAsyncId(), value })
  else
    al:set(value)
  end
end

--- A context storage for opentelemetry-lua.
--
-- Pass it to `require("opentelemetry.global").set_context_storage`, once
-- per worker, after `install()`.  Reading and assigning its keys
-- (`s[key]`, `s[key] = v`) read and set a value of the running execution
-- context: a coroutine, light thread, timer run or luv callback starts
-- with the values of the context that created it (as they were at
-- creation) and its assignments stay its own; the handlers of one request
-- share one context.  A table value is copied (shallow) at every read: the
-- reader may change the copy in place, and the change stays with the
-- reader's context.  An empty table inherited from the creator reads as
-- nil.  `pairs` on the storage sees nothing, and `rawget` reads nothing:
-- the values are not kept in the table itself.
--
-- Each call returns a new storage with values of its own.
-- @treturn table the storage
---@return table storage
function M.storage()
  local locals = {} -- key -> AsyncLocal
  return setmetatable({}, {
    __index = function(_, key) return read(locals, key) end,
    __newindex = function(_, key, value)
      if key == nil then error("table index is nil", 2) end
      if key ~= key then error("table index is NaN", 2) end
      write(locals, key, value)
    end,
    __metatable = "async_hooks.otel storage",
  })
end

-- the methods of opentelemetry-lua's span processors that arm timers
-- (the batch processor's export timer) or export
local METHODS = { "on_end", "force_flush", "shutdown", "flush_all" }

local wrappers = setmetatable({}, { __mode = "k" }) -- functions made by isolate

local function callable(f)
  if type(f) == "function" then return true end
  local mt = type(f) == "table" and getmetatable(f)
  return type(mt) == "table" and rawget(mt, "__call") ~= nil
end

--- Make a span processor's work start in the empty context.
--
-- opentelemetry-lua's batch span processor arms its export timer from
-- `on_end`, inside whichever request ends a span: after `install()`, that
-- timer (and the export it runs, and the timers it arms again) would run
-- in that request's context.  `isolate` replaces the processor's methods
-- `on_end`, `force_flush`, `shutdown` and `flush_all` (those it has), or
-- the ones named in `methods`, by fields of the processor itself that call
-- the original in `Snapshot.empty()`: every timer they arm, and every
-- export, starts with every value at its default and no current span.
-- Idempotent.
-- @tparam table processor a span processor (`batch_span_processor.new(...)`)
-- @tparam[opt] {string,...} methods the names of the methods to isolate
-- @treturn table the processor
---@generic P: table
---@param processor P
---@param methods? string[]
---@return P processor
function M.isolate(processor, methods)
  if type(processor) ~= "table" then
    error(("bad argument #1 to 'isolate' (table expected, got %s)"):format(type(processor)), 2)
  end
  if methods == nil then
    methods = METHODS
  elseif type(methods) ~= "table" then
    error(("bad argument #2 to 'isolate' (table expected, got %s)"):format(type(methods)), 2)
  else
    for i = 1, #methods do
      if type(methods[i]) ~= "string" then
        error(("bad argument #2 to 'isolate' (method names expected, got %s at %d)"):format(type(methods[i]), i), 2)
      end
    end
  end
  local empty = ah.Snapshot.empty()
  for i = 1, #methods do
    local name = methods[i]
    local f = processor[name]
    if callable(f) and not wrappers[f] then
      local w = function(...) return empty:run(f, ...) end
      wrappers[w] = true
      processor[name] = w
    end
  end
  return processor
end

return M
