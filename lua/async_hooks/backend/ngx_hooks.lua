--- The OpenResty backend's hook events: the enabled hooks and their
-- init/before/after/destroy dispatch, the queued destroys and their flush,
-- and the GC tokens that destroy on collection.
--
-- `backend/ngx.lua` makes one instance at load with `new` and keeps the
-- hot functions (emit_before/emit_after, flush_pending) in locals.  It reads
-- the hook counts too: `new` is given a function that it calls with them
-- each time they change, so that `ngx.lua` keeps its own copies in
-- upvalues.
-- Plain Lua 5.1: the pure-Lua backend for luv (`luv_lua.lua`, on LuaJIT
-- and PUC Lua 5.1 to 5.3) uses it too.
-- @module async_hooks.backend.ngx_hooks

local ngx = ngx
local setmetatable, getmetatable, pairs, xpcall, tostring, type, error, select =
  setmetatable, getmetatable, pairs, xpcall, tostring, type, error, select
local debug = require("debug")
local newproxy = newproxy -- (Lua 5.1 and LuaJIT; tables take __gc from 5.2)

-- xpcall(f, handler, ...) passes the arguments on from Lua 5.2 and in
-- LuaJIT; PUC Lua 5.1's takes none
local XPCALL_ARGS = select(2, xpcall(function(x) return x end, function() end, true)) == true

local M = {}

local WEAKK = { __mode = "k" }
local KINDS = { "init", "before", "after", "destroy" }

-- The messages Lua and LuaJIT raise at a limit, not for a program's error.
local LIMITS = { ["C stack overflow"] = true, ["stack overflow"] = true,
  ["not enough memory"] = true, ["error in error handling"] = true }

--- Whether the error e is a limit's: a stack overflow ("C stack
-- overflow", "stack overflow", "stack overflow (...)"), a memory error
-- raised again as its message, "error in error handling", each maybe after
-- positions ("chunk:line: ").
function M.limit_message(e)
  if type(e) ~= "string" then return false end
  local s = e
  while true do
    if LIMITS[s] or (s:sub(1, 16) == "stack overflow (" and s:sub(-1) == ")") then return true end
    local p = s:find(": ", 1, true)
    if not p then return false end
    s = s:sub(p + 2)
  end
end

--- Whether the error being handled was raised while a debug hook ran: in a
-- message handler (called where the error was raised), some function
-- between the raise and the first function of `stop` (the hooks being
-- dispatched; nil: the whole stack) was called by a debug hook (namewhat
-- "hook"; LuaJIT does not say so for a hook called at a C function's
-- call: then the thread's hook function itself).
-- `level`: the raising function's level as the caller of this sees it.
function M.in_debug_hook(level, stop)
  local hookf = debug.gethook()
  level = level + 1
  while true do
    local info = debug.getinfo(level, "nf")
    if info == nil then return false end
    if info.namewhat == "hook" or (hookf ~= nil and info.func == hookf) then return true end
    if stop then
      for i = 1, #stop do
        if info.func == stop[i] then return false end
      end
    end
    level = level + 1
  end
end

--- Whether the hook function f can read a fourth argument (the resource of
-- init): four parameters or more, `...`, a C function, or anything the
-- runtime cannot tell (a callable table; Lua 5.1's debug.getinfo has no
-- parameter count).
function M.sees_fourth(f)
  if type(f) ~= "function" then return true end
  local info = debug.getinfo(f, "Su")
  if info.what == "C" or info.nparams == nil then return true end
  return info.isvararg or info.nparams >= 4
end

local function fatal(kind, msg)
  local text = ("async_hooks: error in %s hook (fatal): %s\n"):format(kind, msg)
  io.stderr:write(text)
  if ngx and ngx.log then ngx.log(ngx.ALERT, text) end
  os.exit(1)
end

-- the hooks being dispatched now and their kind (see dispatch), and the
-- error a library operation that a hook called raised again (raise)
local d_list, d_kind, reraised

-- The message handler of every hook call: an error that is not the hook's
-- own (a limit's, one raised while a debug hook ran, or one raised again
-- by an operation the hook called) is returned as it is; anything else is
-- the hook's own: fatal.
local function handler(e)
  if M.limit_message(e) or (reraised ~= nil and e == reraised) or M.in_debug_hook(2, d_list) then
    return e
  end
  fatal(d_kind, debug.traceback(tostring(e), 2))
end

-- xpcall(f, handler, a, b, c, d) where xpcall passes no arguments (PUC
-- Lua 5.1): through a closure, made in a function of its own (a closure
-- in the dispatch loop's body would close its upvalues at the end of each
-- iteration, which keeps LuaJIT from compiling the loop, whichever
-- branch runs)
local function xpcall_closure(f, a, b, c, d)
  return xpcall(function() return f(a, b, c, d) end, handler)
end

--- Raise e, an error that a dispatch returned, once the operation that
-- dispatched is done; inside a hook, the dispatch that called it sees it
-- as not the hook's own.
function M.raise(e, dispatching)
  if dispatching then reraised = e end
  error(e, 0)
end

--- A new instance of the hook-event state.
-- @param persist the backend's `persist` table (the enabled hooks survive
--   a re-`require` in it, as `persist.order`)
-- @param on_counts called as `on_counts(n_init, n_before, n_after,
--   n_destroy)` now and each time the hook lists change
-- @param deferred when true, the end of a dispatch does not deliver the
--   queued destroys: the backend's own flush points do (`flush_pending`)
-- @param on_queued optional, called with no argument each time a destroy
--   is queued (`mark.queued` set; a finalizer calls it too), for a backend
--   that keeps the mark in an upvalue of its own
-- @return a table of the functions (see the end of this function)
function M.new(persist, on_counts, deferred, on_queued)
  local order = persist.order or {} -- enabled hooks, in enabling order
  persist.order = order
  local lists = { init = {}, before = {}, after = {}, destroy = {} }
  local n_init, n_before, n_after, n_destroy = 0, 0, 0, 0
  local dispatching, dirty = 0, false
  -- Queued destroys, in two queues, because a finalizer (__gc) may run
  -- between any two steps of main-line code (under the JIT, also between
  -- `n = n + 1` and `q[n] = id`):
  -- * `dqueue`/`dq_n`: destroys queued by main-line code; finalizers never
  --   touch them.
  -- * `gqueue`: destroys queued by the GC tokens' finalizer, which appends
  --   to the table that `gqueue` names when it runs (finalizers do not nest).
  --   Main-line code never writes into it: flush makes the replacement first,
  --   then swaps (one assignment), then reads the old table up to its first
  --   nil, including what a finalizer appended just before the swap.
  local dqueue, dq_n = {}, 0
  local dspare = {} -- an empty queue table for the next flush (flush_all)
  local gqueue = {}
  -- mark.queued: whether either queue may hold a destroy (set by whatever
  -- queues one, cleared when a flush found both empty), for a backend to
  -- test with a field read instead of a call to has_pending
  local mark = { queued = false }

  local function rebuild()
    local nl = {}
    for _, k in pairs(KINDS) do
      local l = {}
      for i = 1, #order do
        local f = order[i][k]
        if f ~= nil then l[#l + 1] = f end
      end
      nl[k] = l
    end
    lists = nl
    n_init, n_before, n_after, n_destroy = #nl.init, #nl.before, #nl.after, #nl.destroy
    dirty = false
    local sees = false
    for i = 1, n_init do
      if M.sees_fourth(nl.init[i]) then sees = true; break end
    end
    on_counts(n_init, n_before, n_after, n_destroy, sees)
  end
  rebuild()

  local flush_all

  -- Call every hook of the list.  A hook's own error ends the process
  -- (handler); any other error is the first returned (failed, e) once the
  -- event reached every hook of the list: the caller finishes what it does
  -- and then raises it (raise).
  local function dispatch(kind, list, a, b, c, d)
    local failed, first = false, nil
    local pl, pk = d_list, d_kind
    dispatching = dispatching + 1
    d_list, d_kind = list, kind
    for i = 1, #list do
      local ok, e
      if XPCALL_ARGS then
        ok, e = xpcall(list[i], handler, a, b, c, d)
      else
        ok, e = xpcall_closure(list[i], a, b, c, d)
      end
      if not ok and not failed then failed, first = true, e end
    end
    d_list, d_kind = pl, pk
    dispatching = dispatching - 1
    if dispatching == 0 then
      reraised = nil
      if dirty then rebuild() end
      if not deferred and (dq_n > 0 or gqueue[1] ~= nil) then
        local f, e = flush_all()
        if f and not failed then failed, first = f, e end
      end
    end
    return failed, first
  end

  local function raise(e) M.raise(e, dispatching > 0) end

  -- deliver the queued destroys; returns the first error of their
  -- dispatches (all are delivered all the same)
  function flush_all()
    local failed, first = false, nil
    if dispatching > 0 then return failed, first end
    while true do
      if dq_n > 0 then
        -- (the queue taken is emptied as it is delivered and kept for the
        -- next flush: no table per flush; a flush nested in a dispatch here
        -- takes the other one, or a new one)
        local q, n = dqueue, dq_n
        dqueue, dq_n = dspare or {}, 0
        dspare = nil
        for i = 1, n do
          local id = q[i]
          q[i] = nil
          if n_destroy > 0 then
            local f, e = dispatch("destroy", lists.destroy, id)
            if f and not failed then failed, first = f, e end
          end
        end
        dspare = q
      elseif gqueue[1] ~= nil then
        local fresh = {}
        local q = gqueue
        gqueue = fresh
        local i, id = 1, q[1]
        while id ~= nil do
          if n_destroy > 0 then
            local f, e = dispatch("destroy", lists.destroy, id)
            if f and not failed then failed, first = f, e end
          end
          i = i + 1
          id = q[i]
        end
      else
        mark.queued = false -- (no allocation since the test: no finalizer ran)
        return failed, first
      end
    end
  end

  local function flush()
    local f, e = flush_all()
    if f then raise(e) end
  end

  local function queue_destroy(id)
    if n_destroy > 0 then
      dq_n = dq_n + 1
      dqueue[dq_n] = id
      mark.queued = true
      if on_queued then on_queued() end
    end
  end

  -- init raises an error of its dispatch (the resource exists all the
  -- same); before, after and destroy_now return it (failed, e) for the
  -- caller to raise once done
  local function emit_init(id, type_, trigger, resource)
    if n_init > 0 then
      local f, e = dispatch("init", lists.init, id, type_, trigger, resource)
      if f then raise(e) end
    end
  end

  local function emit_before(id)
    if n_before > 0 then return dispatch("before", lists.before, id) end
    return false
  end

  local function emit_after(id)
    if n_after > 0 then return dispatch("after", lists.after, id) end
    return false
  end

  local function destroy_now(id)
    if n_destroy > 0 then
      queue_destroy(id)
      return flush_all()
    end
    return false
  end

  -- (the resource's GC token, if given, is cancelled first: when a destroy
  -- hook's dispatch raises, the destroy was delivered all the same)
  local tok_id
  local function emit_destroy(id, _, tok)
    if tok ~= nil then tok_id[tok] = nil end
    local f, e = destroy_now(id)
    if f then raise(e) end
  end

  local function hook_count(kind)
    if kind == "init" then return n_init
    elseif kind == "before" then return n_before
    elseif kind == "after" then return n_after
    elseif kind == "destroy" then return n_destroy end
    return 0
  end

  local function changed()
    if dispatching > 0 then dirty = true else rebuild() end
  end

  local function hook_enable(h)
    for i = 1, #order do if order[i] == h then return end end
    order[#order + 1] = h
    changed()
  end

  local function hook_disable(h)
    for i = 1, #order do
      if order[i] == h then
        table.remove(order, i)
        changed()
        return
      end
    end
  end

  -- destroy on collection: a proxy whose finalizer queues the destroy (it is
  -- delivered at the next library call that dispatches, never inside __gc)
  -- (a weak key stays readable in the key's finalizer)
  tok_id = setmetatable({}, WEAKK)
  local function on_gc(p)
    local id = tok_id[p]
    if id and n_destroy > 0 then
      local q = gqueue
      q[#q + 1] = id
      mark.queued = true
      if on_queued then on_queued() end
    end
  end
  local gc_token
  if newproxy then
    local TOKPROXY = newproxy(true)
    getmetatable(TOKPROXY).__gc = on_gc
    gc_token = function(id)
      local p = newproxy(TOKPROXY)
      tok_id[p] = id
      return p
    end
  else -- Lua 5.2 and 5.3: an empty table with a finalizer
    local TOKMT = { __gc = on_gc }
    gc_token = function(id)
      local p = setmetatable({}, TOKMT)
      tok_id[p] = id
      return p
    end
  end

  local function gc_token_cancel(tok)
    tok_id[tok] = nil
  end

  -- whether destroys are queued
  local function has_pending()
    return dq_n > 0 or gqueue[1] ~= nil
  end

  -- destroys queued and not delivered yet: delivered now unless a hook is
  -- running (then when it returns); returns the first error (failed, e)
  local function flush_pending()
    if dq_n > 0 or gqueue[1] ~= nil then return flush_all() end
    return false
  end

  return {
    emit_init = emit_init, emit_before = emit_before, emit_after = emit_after,
    emit_destroy = emit_destroy, destroy_now = destroy_now, raise = raise,
    flush = flush, flush_pending = flush_pending, queue_destroy = queue_destroy, has_pending = has_pending,
    mark = mark,
    hook_count = hook_count, hook_enable = hook_enable, hook_disable = hook_disable,
    gc_token = gc_token, gc_token_cancel = gc_token_cancel, tok_id = tok_id,
  }
end

return M
