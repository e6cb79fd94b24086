--- The OpenResty backend's hook events: the enabled hooks and their
-- init/before/after/destroy dispatch, the queued destroys and their flush,
-- and the GC tokens that destroy on collection.
--
-- Split out of `backend/ngx.lua`, which makes one instance at load with
-- `new` and keeps the hot functions (emit_before/emit_after, flush_pending)
-- in locals.  The hook counts are read in
-- `ngx.lua` too: `new` is given a function that it calls with them each
-- time they change, so that `ngx.lua` keeps its own copies in upvalues.
-- Plain Lua for LuaJIT, like `ngx.lua`.
-- @module async_hooks.backend.ngx_hooks

local ngx = ngx
local setmetatable, getmetatable, pairs, xpcall, tostring = setmetatable, getmetatable, pairs, xpcall, tostring
local debug = require("debug")
local newproxy = newproxy

local M = {}

local WEAKK = { __mode = "k" }
local KINDS = { "init", "before", "after", "destroy" }

local function fatal_handler(e)
  return debug.traceback(tostring(e), 2)
end

local function fatal(kind, msg)
  local text = ("async_hooks: error in %s hook (fatal): %s\n"):format(kind, msg)
  io.stderr:write(text)
  if ngx.log then ngx.log(ngx.ALERT, text) end
  os.exit(1)
end

--- A new instance of the hook-event state.
-- @param persist the backend's `persist` table (the enabled hooks survive
--   a re-`require` in it, as `persist.order`)
-- @param on_counts called as `on_counts(n_init, n_before, n_after,
--   n_destroy)` now and each time the hook lists change
-- @return a table of the functions (see the end of this function)
function M.new(persist, on_counts)
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
  local gqueue = {}

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
    on_counts(n_init, n_before, n_after, n_destroy)
  end
  rebuild()

  local flush

  local function dispatch(kind, list, a, b, c, d)
    dispatching = dispatching + 1
    for i = 1, #list do
      local ok, e = xpcall(list[i], fatal_handler, a, b, c, d)
      if not ok then fatal(kind, e) end
    end
    dispatching = dispatching - 1
    if dispatching == 0 then
      if dirty then rebuild() end
      if dq_n > 0 or gqueue[1] ~= nil then flush() end
    end
  end

  function flush()
    if dispatching > 0 then return end
    while true do
      if dq_n > 0 then
        local q, n = dqueue, dq_n
        dqueue, dq_n = {}, 0
        for i = 1, n do
          if n_destroy > 0 then dispatch("destroy", lists.destroy, q[i]) end
        end
      elseif gqueue[1] ~= nil then
        local fresh = {}
        local q = gqueue
        gqueue = fresh
        local i, id = 1, q[1]
        while id ~= nil do
          if n_destroy > 0 then dispatch("destroy", lists.destroy, id) end
          i = i + 1
          id = q[i]
        end
      else
        return
      end
    end
  end

  local function queue_destroy(id)
    if n_destroy > 0 then
      dq_n = dq_n + 1
      dqueue[dq_n] = id
    end
  end

  local function emit_init(id, type_, trigger, resource)
    if n_init > 0 then dispatch("init", lists.init, id, type_, trigger, resource) end
  end

  local function emit_before(id)
    if n_before > 0 then dispatch("before", lists.before, id) end
  end

  local function emit_after(id)
    if n_after > 0 then dispatch("after", lists.after, id) end
  end

  local function emit_destroy(id)
    if n_destroy > 0 then
      queue_destroy(id)
      flush()
    end
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
  local tok_id = setmetatable({}, WEAKK)
  local TOKPROXY = newproxy(true)
  getmetatable(TOKPROXY).__gc = function(p)
    local id = tok_id[p]
    if id and n_destroy > 0 then
      local q = gqueue
      q[#q + 1] = id
    end
  end

  local function gc_token(id)
    local p = newproxy(TOKPROXY)
    tok_id[p] = id
    return p
  end

  local function gc_token_cancel(tok)
    tok_id[tok] = nil
  end

  -- destroys queued and not delivered yet: delivered now unless a hook is
  -- running (then when it returns)
  local function flush_pending()
    if dq_n > 0 or gqueue[1] ~= nil then flush() end
  end

  return {
    emit_init = emit_init, emit_before = emit_before, emit_after = emit_after,
    emit_destroy = emit_destroy, flush = flush, flush_pending = flush_pending,
    hook_count = hook_count, hook_enable = hook_enable, hook_disable = hook_disable,
    gc_token = gc_token, gc_token_cancel = gc_token_cancel, tok_id = tok_id,
  }
end

return M
