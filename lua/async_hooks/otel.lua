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
-- Plain Lua over the public API (`AsyncLocal`, `Snapshot`, `createHook`,
-- `executionAsyncId`, `executionAsyncResource`): the same on Lua 5.4 and
-- in OpenResty.  Values
-- propagate into coroutines, light threads and timers only after
-- `install()` (or through `async_hooks.coroutine`).
-- @module async_hooks.otel

local type, setmetatable, getmetatable, pairs, next, error, tostring, rawget =
  type, setmetatable, getmetatable, pairs, next, error, tostring, rawget
local ah = require("async_hooks")
local AsyncLocal, executionAsyncId, executionAsyncResource = ah.AsyncLocal, ah.executionAsyncId, ah.executionAsyncResource

---@class async_hooks.otel
local M = {}

-- A key's value is kept in an AsyncLocal of its own.  A table value (the
-- stack) is kept as a record {owner, table, seq}: `owner` the
-- executionAsyncId of the context that stored it, `seq` whether the table
-- was a sequence then.  opentelemetry-lua changes the table it reads in
-- place (`table.insert(storage[key], ctx)`), so a context must never be
-- handed a table that another context reads:
-- * the owner reads its own table as it is (the scopes it opens, which
--   copy its frame, share it);
-- * an init hook, which runs in the creator's context, keeps a copy of the
--   creator's table for the new resource (coroutine, light thread, timer,
--   luv callback, AsyncResource), under the resource table itself (weak
--   keys, so it goes with the resource);
-- * any other context -- the resource, when it runs -- reads that copy
--   (or, for a frame that reached it otherwise, a copy of the owner's
--   table as it is) and stores a copy of it as its own record; an empty
--   table inherited so reads as nil, as a fresh `ngx.ctx` does.
-- The hook is enabled when the first table is stored.

local all = setmetatable({}, { __mode = "k" }) -- AsyncLocal of every key of every storage -> its copies
local hook

-- a copy of t: element by element (pairs) unless `seq`, then t[1..#t],
-- without a loop for the short stacks of every day (a loop here would keep
-- LuaJIT from compiling the callers of the storage)
local function copy(t, seq)
  if seq then
    local n = #t
    if n == 0 then return {} end
    if n == 1 then return { t[1] } end
    if n == 2 then return { t[1], t[2] } end
    if n == 3 then return { t[1], t[2], t[3] } end
    if n == 4 then return { t[1], t[2], t[3], t[4] } end
    local c = {}
    for i = 1, n do c[i] = t[i] end
    return c
  end
  local c = {}
  for k, v in pairs(t) do c[k] = v end
  return c
end

-- whether t holds exactly the elements 1..#t (without a loop when it has
-- fewer than 5 keys)
local function is_seq(t)
  local n = #t
  if n < 5 then
    local k = next(t)
    if k == nil then return n == 0 end
    k = next(t, k)
    if k == nil then return n == 1 end
    k = next(t, k)
    if k == nil then return n == 2 end
    k = next(t, k)
    if k == nil then return n == 3 end
    k = next(t, k)
    if k == nil then return n == 4 end
    return false
  end
  local c = 0
  for _ in pairs(t) do c = c + 1 end
  return c == n
end

-- the table of the record `rec` as the running context sees it: its own,
-- or the copy made for it when it was created, or the owner's as it is;
-- whether it is its own; the running context's executionAsyncId
local function view(rec, copies)
  local id = executionAsyncId()
  if rec[1] == id then return rec[2], true, id end
  local c = copies[executionAsyncResource()]
  if c ~= nil and c[1] == rec then return c[2], false, id end
  return rec[2], false, id
end

-- the init hook: keep for the new resource a copy of every table its
-- creator sees now
local function capture(_, _, _, resource)
  for al, copies in pairs(all) do
    local rec = al:get()
    if type(rec) == "table" then
      local t = view(rec, copies)
      copies[resource] = { rec, copy(t, rec[3]) }
    end
  end
end

local function read(locals, key)
  local al = locals[key]
  if al == nil then return nil end
  local rec = al:get()
  if type(rec) ~= "table" then return rec end
  local t, own, id = view(rec, all[al])
  if own then return t end
  local seq = rec[3]
  if seq and #t == 0 or not seq and next(t) == nil then return nil end
  local c = copy(t, seq)
  al:set({ id, c, seq })
  return c
end

local function write(locals, key, value)
  local al = locals[key]
  if al == nil then
    if value == nil then return end
    al = AsyncLocal.new { name = "async_hooks.otel " .. tostring(key) }
    locals[key] = al
    all[al] = setmetatable({}, { __mode = "k" })
  end
  if type(value) == "table" then
    if hook == nil then hook = ah.createHook { init = capture } end
    hook:enable()
    al:set({ executionAsyncId(), value, is_seq(value) })
  else
    al:set(value)
  end
end

--- A context storage for opentelemetry-lua.
--
-- Pass it to `require("opentelemetry.global").set_context_storage`, once
-- per worker, after `install()`.  Reading and assigning its keys
-- (`s[key]`, `s[key] = v`) read and set a value of the running execution
-- context.  A coroutine, light thread, timer run, luv callback or
-- `runInAsyncScope` starts with the values its creator had when it was
-- created, and what it assigns, or changes in a table it read, stays its
-- own.  The handlers of one request share one context, and so do the
-- scopes opened inside one context (`AsyncLocal:run`, `Snapshot:run`), as
-- with `ngx.ctx` -- except that a context's first value stored inside such
-- a scope ends with the scope.  `Snapshot.empty():run(fn)` starts `fn`
-- with no values.
--
-- A table value is the context's own: its creator's is copied (shallow;
-- element by element, or as a sequence when it was stored as one) for it.
-- An empty table inherited from the creator reads as nil, as in a fresh
-- `ngx.ctx`.  `pairs` on the storage sees nothing and `rawget` reads
-- nothing: the values are not kept in the table itself.
--
-- The first table stored enables an `init` hook (`createHook`) for the
-- rest of the process: it keeps the copies for new resources.  With a
-- hook enabled, the library makes a resource for every registration,
-- also those nothing else observes.
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

-- the init hook, once made (for the specs, which disable it after a test)
function M._hook() return hook end

-- the methods of opentelemetry-lua's span processors that arm timers
-- (the batch processor's export timer) or export
local METHODS = { "on_end", "force_flush", "shutdown", "flush_all" }

local wrappers = setmetatable({}, { __mode = "k" }) -- functions made by isolate

-- Whether on_end of `p` arms no timer now: opentelemetry-lua's batch span
-- processor arms one from on_end only when its timer is not running or its
-- queue is full.  Such calls skip the empty scope (a scope costs a request
-- more than the rest of on_end); a processor without these fields always
-- gets the scope.
local function arms_no_timer(p)
  -- (anything but a table goes the scoped way: its errors stay on_end's)
  if type(p) ~= "table" or rawget(p, "is_timer_running") ~= true then return false end
  local max, size = rawget(p, "max_queue_size"), p.get_queue_size
  return type(max) == "number" and type(size) == "function" and size(p) < max
end

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
-- (The batch span processor's `on_end` calls that arm no timer -- its
-- timer already running, its queue not full -- run as they are.)
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
      local w
      if name == "on_end" then
        w = function(self, ...)
          if arms_no_timer(self) then return f(self, ...) end
          return empty:run(f, self, ...)
        end
      else
        w = function(...) return empty:run(f, ...) end
      end
      wrappers[w] = true
      processor[name] = w
    end
  end
  return processor
end

return M
