--- The pure-Lua backend: coroutines and luv on LuaJIT 2.1 and PUC Lua 5.1,
-- 5.2 and 5.3, where the C core does not build.  `require("async_hooks")`
-- picks it below Lua 5.4 outside OpenResty; `async_hooks.api` builds the
-- public classes on top of it (see the contract there), so names, checks
-- and messages are those of every other backend.
--
-- Where the context lives: `cur` is the record of what runs now: the main
-- thread's (`TOP`), a library coroutine's, or a luv callback's.  Every
-- place where the running code changes goes through this file (the
-- library's `resume` and wrapped functions, the luv callback wrappers,
-- Neovim's `vim.schedule`), and
-- each sets `cur` on entry and puts the previous record back on exit, so a
-- `get` is one table read, with no `coroutine.running()` (which LuaJIT does
-- not compile).  A record: `f` its frame, `id` and `trig` its ids, `res`
-- its resource (made when first asked for; an open scope's in a
-- coroutine); a coroutine's also `own`, `otrig` and `ores`, its own ids
-- and resource (`id` is a scope's while a `runInAsyncScope` runs in it),
-- and `sc`, the scopes open in it; a luv registration's also `s` (its
-- entry of async_hooks.luv_specs), `h` (the handle), `cb`, `f0` (the frame
-- each call starts in).
--
-- A frame is an immutable table {token -> value} with weak keys, so that
-- `disable()` makes values collectable; `NILV` stands for an explicit nil.
-- Scopes restore with `pcall`: a scope may stay open across a yield where
-- `pcall` can yield (LuaJIT, Lua 5.2 and 5.3), not on PUC Lua 5.1.  An
-- error goes through unchanged (same value); its traceback starts at the
-- library's rethrow (docs/purelua.md).
--
-- The hook events (hook lists, dispatch, destroy queues, GC tokens) are
-- `ngx_hooks.lua`'s, shared with the OpenResty backend.
-- @module async_hooks.backend.luv_lua

local type, select, setmetatable, getmetatable, rawget, pairs, ipairs, pcall, error =
  type, select, setmetatable, getmetatable, rawget, pairs, ipairs, pcall, error
local unpack = rawget(_G, "unpack") or table.unpack
local dgetmetatable = debug.getmetatable
local stdco = coroutine
local raw_create, raw_wrap, raw_resume, raw_status, raw_running =
  stdco.create, stdco.wrap, stdco.resume, stdco.status, stdco.running
local errors = require("async_hooks.errors")
local raise_at_caller = errors.raise
local specs = require("async_hooks.luv_specs")

-- The C helper (async_hooks.luvcb, src/purelua/cbpcall.c), when it is
-- built for this runtime: luv's own cb_pcall then calls the user's
-- callbacks, so that an uncaught error's traceback is the one without the
-- library.  ASYNC_HOOKS_LUVCB=0 in the environment: not used; =1: required
-- (an error when it does not load).
local luvcb = nil
do
  local want = os.getenv("ASYNC_HOOKS_LUVCB")
  if want == "1" then
    luvcb = require("async_hooks.luvcb")
  elseif want ~= "0" then
    local ok, m = pcall(require, "async_hooks.luvcb")
    if ok and type(m) == "table" then luvcb = m end
  end
end

local registry = debug.getregistry()
local PKEY = "async_hooks.backend.luv_lua"
local persist = registry[PKEY]
if persist and persist.backend then return persist.backend end
persist = persist or {}
registry[PKEY] = persist

local B = { name = "luv_lua", persist = persist, luvcb = luvcb }

---------------------------------------------------------------------------
-- frames and records
---------------------------------------------------------------------------

local NILV = {} -- an explicit nil in a frame
local WEAKK = { __mode = "k" }
local WEAKV = { __mode = "v" }
-- (a table whose values refer to their keys, as a registration's record
-- refers to its handle: on Lua 5.1 and LuaJIT, which have no ephemerons,
-- a weak key alone would keep both for ever)
local WEAKKV = { __mode = "kv" }
local EMPTY = setmetatable({}, WEAKK)
local TOKMT = { __name = "async_hooks.token" }

-- a copy of a frame (its own function: LuaJIT compiles the common case,
-- the first value of an empty frame, without the loop)
local function copy(frame)
  local nf = {}
  for k, v in pairs(frame) do nf[k] = v end
  return nf
end

--- a frame like `frame` with `tok` set to `value`
local function with(frame, tok, value)
  if value == nil then value = NILV end
  if frame == EMPTY then return setmetatable({ [tok] = value }, WEAKK) end
  local nf = copy(frame)
  nf[tok] = value
  return setmetatable(nf, WEAKK)
end

function B.newtoken() return setmetatable({}, TOKMT) end
function B.empty_frame() return EMPTY end

local TOPRES = {}
local TOP = { f = EMPTY, id = 1, trig = 0, res = TOPRES }
local cur = TOP
-- scopes open on TOP: the outermost's exit is a flush point
local top_nsc = 0
local next_id = 2

-- Library coroutines' records, by thread (weak keys).  A record never
-- refers to its thread: Lua 5.1 and LuaJIT have no ephemerons, and a value
-- that reaches its own key keeps it alive.  The `{thread = co}` resource
-- holds it weakly for the same reason.
local recs = persist.recs or setmetatable({}, WEAKK)
persist.recs = recs

local function fresh_id()
  local id = next_id
  next_id = id + 1
  return id
end

function B.current_frame() return cur.f end
function B.executionAsyncId() return cur.id end
function B.triggerAsyncId() return cur.trig end

-- builds a luv record's resource (below)
local luv_resource

-- the coroutine whose own before/after is being emitted (by its resumer,
-- on the resumer's thread) and its record, for its resource
local hook_co, hook_rec = nil, nil

-- whether executionAsyncResource() was ever called: until then a luv
-- registration that nothing observes is not tracked (make_wrapper)
local res_asked = false

function B.executionAsyncResource()
  res_asked = true
  local rec = cur
  local own = rec.own
  if own ~= nil and rec.id == own then
    -- a coroutine's own resource (`ores`; `res` is an open scope's)
    local res = rec.ores
    if res == nil then
      res = setmetatable({ thread = hook_rec == rec and hook_co or raw_running() }, WEAKV)
      rec.ores = res
    end
    return res
  end
  local res = rec.res
  if res == nil then
    if rec.s == nil then
      res = {}
    elseif rec.id == rec.rid then
      -- the registration's own, made once for all its calls (a call nested
      -- in another may have made it: nest_enter)
      res = rec.rres
      if res == nil then
        res = luv_resource(rec)
        rec.rres = res
      end
    else
      res = luv_resource(rec)
    end
    rec.res = res
  end
  return res
end

function B.new_ids(trigger)
  if trigger == nil then trigger = cur.id end
  return fresh_id(), trigger
end

---------------------------------------------------------------------------
-- hooks (ngx_hooks.lua); the counts in upvalues of this file too
---------------------------------------------------------------------------

-- (init_sees: an enabled init hook can read its fourth argument, the
-- resource: made for init only then, as the C core does)
-- (n_ba: n_before + n_after, read by each resume)
local n_init, n_before, n_after, n_destroy, init_sees, n_ba = 0, 0, 0, 0, false, 0
-- queued: destroys may be queued; set with H's mark.queued (H calls back,
-- a finalizer too), cleared only by flush_queued, from mark.queued
local queued = false
local H = require("async_hooks.backend.ngx_hooks").new(persist, function(i, b, a, d, sees)
  n_init, n_before, n_after, n_destroy, init_sees, n_ba = i, b, a, d, sees, b + a
end, true, function() queued = true end)
-- emit_before, emit_after, flush_pending and destroy_now return an error of
-- the dispatch that is not the hook's own (failed, e): the caller finishes
-- what it does, then raises it
local emit_before, emit_after = H.emit_before, H.emit_after
local flush_pending, destroy_now, queue_destroy, raise = H.flush_pending, H.destroy_now, H.queue_destroy, H.raise
local emit_init, gc_token, tok_id = H.emit_init, H.gc_token, H.tok_id
local mark = H.mark

-- where `queued` is set: the queued destroys delivered, unless H found
-- none queued (mark.queued false: a flush emptied the queues); returns
-- (failed, e) as flush_pending
local function flush_queued()
  queued = mark.queued
  if queued then return flush_pending() end
  return false
end
B.emit_init = emit_init
B.hook_count, B.hook_enable, B.hook_disable = H.hook_count, H.hook_enable, H.hook_disable
B.gc_token, B.gc_token_cancel = H.gc_token, H.gc_token_cancel

-- Outside every scope, callback and resume: a destroy is delivered at once;
-- inside one it is queued for the flush point where that ends (the
-- outermost scope on the main thread, the callback, the resume).
local function idle() return cur == TOP and top_nsc == 0 end

local function end_now(id)
  if idle() then
    local f, e = destroy_now(id)
    if f then raise(e) end
  else
    queue_destroy(id)
  end
end

function B.emit_destroy(id, _, tok)
  if tok ~= nil then tok_id[tok] = nil end
  end_now(id)
end

function B.flush()
  if not idle() then return end
  local f, e = flush_pending()
  if f then raise(e) end
end

---------------------------------------------------------------------------
-- values and scopes
---------------------------------------------------------------------------

-- get/set raise the api's message(self) on a bad self, at their caller
local getter = function(message)
  return function(self)
    local tok = type(self) == "table" and rawget(self, 1)
    if getmetatable(tok) ~= TOKMT then raise_at_caller(message(self)) end
    local v = cur.f[tok]
    if v == nil then return rawget(self, "default") end -- (an own field, or none: nil)
    if v == NILV then return nil end
    return v
  end
end

-- On PUC Lua, where type, rawget and getmetatable are C calls, get checks
-- self once: `known` maps a checked object to its token (weak keys and
-- values: disable() drops the old token, which must not stay alive here),
-- and a known object whose token is still in place needs no other check.
if not rawget(_G, "jit") then
  local known = setmetatable({}, { __mode = "kv" })
  getter = function(message)
    return function(self)
      local tok = known[self]
      if tok == nil or tok ~= self[1] then
        tok = type(self) == "table" and rawget(self, 1)
        if getmetatable(tok) ~= TOKMT then raise_at_caller(message(self)) end
        known[self] = tok
      end
      local v = cur.f[tok]
      if v == nil then return self.default end
      if v == NILV then return nil end
      return v
    end
  end
end

function B.getter(_, _, message) return getter(message) end

function B.setter(_, _, message)
  return function(self, value)
    local tok = type(self) == "table" and rawget(self, 1)
    if getmetatable(tok) ~= TOKMT then raise_at_caller(message(self)) end
    local rec = cur
    rec.f = with(rec.f, tok, value)
  end
end

local function restore(rec, saved, ok, ...)
  rec.f = saved
  if rec == TOP then
    top_nsc = top_nsc - 1
    if top_nsc == 0 and queued then
      local f, e = flush_queued()
      if f and ok then raise(e) end
    end
  end
  if ok then return ... end
  error((...), 0)
end

function B.run_with(obj, value, fn, ...)
  local rec = cur
  local saved = rec.f
  if rec == TOP then top_nsc = top_nsc + 1 end
  rec.f = with(saved, obj[1], value)
  value = nil -- luacheck: ignore 311 (the frame holds it: see lua54.lua)
  return restore(rec, saved, pcall(fn, ...))
end

function B.run_in_frame(frame, fn, ...)
  local rec = cur
  local saved = rec.f
  if rec == TOP then top_nsc = top_nsc + 1 end
  rec.f = frame
  return restore(rec, saved, pcall(fn, ...))
end

-- (scope: in a coroutine, the entry of its `sc` list, else false)
local function leave_scope(rec, id, scope, sid, strig, sres, sframe, ok, ...)
  local failed, first = false, nil
  if not (scope and scope.out) then failed, first = emit_after(id) end
  if scope then
    local sc = rec.sc
    for i = #sc, 1, -1 do
      if sc[i] == scope then table.remove(sc, i); break end
    end
    if sc[1] == nil then -- (none open: resumes take the quick path again)
      rec.sc = nil
      rec.q = rec.tok == nil
    end
  end
  rec.id, rec.trig, rec.res, rec.f = sid, strig, sres, sframe
  if rec == TOP then
    top_nsc = top_nsc - 1
    if top_nsc == 0 then
      local f, e = flush_pending()
      if f and not failed then failed, first = f, e end
    end
  end
  if failed then raise(first) end
  if ok then return ... end
  error((...), 0)
end

function B.run_in_scope(id, trigger, resource, frame, fn, ...)
  local rec = cur
  local sid, strig, sres, sframe = rec.id, rec.trig, rec.res, rec.f
  rec.id, rec.trig, rec.res, rec.f = id, trigger, resource, frame
  local scope = false
  if rec.own then -- in a coroutine: the scope is open in it (see co_resume)
    scope = { id = id, res = resource, out = false }
    local sc = rec.sc
    if sc == nil then
      sc = {}
      rec.sc = sc
      rec.q = false
    end
    sc[#sc + 1] = scope
  elseif rec == TOP then
    top_nsc = top_nsc + 1
  end
  local failed, e = emit_before(id)
  if failed then -- fn does not run; the scope is left (its after), then e
    leave_scope(rec, id, scope, sid, strig, sres, sframe, true)
    raise(e)
  end
  return leave_scope(rec, id, scope, sid, strig, sres, sframe, pcall(fn, ...))
end

---------------------------------------------------------------------------
-- coroutines
---------------------------------------------------------------------------

-- the record of a new library coroutine, made from the current context
local function adopt(co)
  local parent = cur
  local id = next_id
  next_id = id + 1
  -- q: no scope open in it and no destroy due (sc and tok nil), read by
  -- each resume as one field that is always there
  local rec = { f = parent.f, id = id, trig = parent.id, own = id, otrig = parent.id, q = true }
  recs[co] = rec
  if n_init + n_destroy > 0 then
    if n_destroy > 0 then
      rec.tok = gc_token(id)
      rec.q = false
    end
    if n_init > 0 then
      local res = nil
      if init_sees then
        res = setmetatable({ thread = co }, WEAKV)
        rec.ores = res
      end
      emit_init(id, "coroutine", parent.id, res)
    end
  end
  return rec
end

-- The runtime's argument error of `fn(...)` as the user's call of `name`
-- would raise it: its message, with that name (the runtime's function,
-- called from here, has another or none), at the user's line.
local function argerror(name, fn, ...)
  local _, e = pcall(fn, ...)
  if type(e) == "string" then
    e = e:gsub("^bad argument #(%d+) to '[^']*'", "bad argument #%1 to '" .. name .. "'")
  end
  raise_at_caller(e)
end

-- Whether the runtime's create takes only Lua functions (Lua 5.1 and
-- LuaJIT: C functions are refused too, which a type check cannot see)
local LUA_ONLY = not pcall(raw_create, print)

-- a new coroutine of f, or the runtime's argument error for `name`
local function new_thread(f, name)
  if LUA_ONLY then
    local ok, co = pcall(raw_create, f)
    if ok then return co end
  elseif type(f) == "function" then
    return raw_create(f)
  end
  argerror(name, raw_create, f)
end

local function make_coroutine(f, name)
  local co = new_thread(f, name)
  adopt(co)
  return co
end

-- (not a tail call: Lua 5.1 would leave a "(tail call)" level where the
-- position of an argument error is taken)
local function co_create(f)
  local co = make_coroutine(f, "create")
  return co
end

-- emit(rec.own), the coroutine's own before or after, in its own context
-- (its ids and resource, also while a scope is open in it: the scope's
-- events are emitted apart)
local function emit_own(emit, rec, co)
  local id, trig = rec.id, rec.trig
  rec.id, rec.trig = rec.own, rec.otrig
  local pco, prec = hook_co, hook_rec
  hook_co, hook_rec = co, rec
  local failed, e = emit(rec.own)
  hook_co, hook_rec = pco, prec
  rec.id, rec.trig = id, trig
  return failed, e
end

-- set by the library's yield on LuaJIT (see co_yield)
local yielded = false

-- the end of a resume slice: the open scopes' after (innermost first, each
-- marked out: with hooks or without, so that a hook enabled later gets no
-- after without its before), the coroutine's after, the resumer's record
-- back, destroy when the coroutine is dead, queued destroys delivered;
-- returns the first error of the dispatches (failed, e)
local function resume_end(co, rec, prev)
  local failed, first = false, nil
  local sc = rec.sc
  if sc ~= nil then
    for i = #sc, 1, -1 do
      local s = sc[i]
      if not s.out then
        s.out = true
        local f, e = emit_after(s.id)
        if f and not failed then failed, first = f, e end
      end
    end
  end
  if n_after > 0 then
    local f, e = emit_own(emit_after, rec, co)
    if f and not failed then failed, first = f, e end
  end
  cur = prev
  yielded = false
  if raw_status(co) == "dead" then
    recs[co] = nil
    local tok = rec.tok
    if tok ~= nil then
      tok_id[tok] = nil
      local f, e = destroy_now(rec.own)
      if f and not failed then failed, first = f, e end
    end
  end
  local f, e = flush_pending()
  if f and not failed then failed, first = f, e end
  return failed, first
end

local function slice_end(co, rec, prev, ...)
  local failed, e = resume_end(co, rec, prev)
  if failed then raise(e) end
  return ...
end

-- the start of a slice: the coroutine's before, then the scopes' that are
-- out, outermost first (a destroyed resource's stay out)
local function resume_start(rec, co)
  local failed, first = false, nil
  if n_before > 0 then failed, first = emit_own(emit_before, rec, co) end
  local sc = rec.sc
  if sc ~= nil and n_before + n_after > 0 then
    for i = 1, #sc do
      local s = sc[i]
      if s.out and not (type(s.res) == "table" and s.res._destroyed) then
        s.out = false
        local f, e = emit_before(s.id)
        if f and not failed then failed, first = f, e end
      end
    end
  end
  return failed, first
end

-- On LuaJIT the library's yield sets `yielded`, which the resume it
-- returns to reads and clears: a coroutine that yielded through it is alive
-- without asking coroutine.status (a yield made otherwise is found by
-- asking).  On PUC Lua the status costs less than a Lua call: the
-- runtime's yield is kept.  (Left set by a yield that a resume from C
-- returned to, it only keeps a dead coroutine's entry in `recs` until the
-- coroutine is collected.)
local raw_yield = stdco.yield
local co_yield = raw_yield
if rawget(_G, "jit") then
  co_yield = function(...)
    yielded = true
    return raw_yield(...)
  end
end

-- a resume begun with nothing to emit before the slice: the resumer's
-- record back, unless the slice needs more (a hook enabled in it, a scope
-- it opened, its destroy: when it ran, as nothing else enables hooks)
local function quick_end(co, rec, prev, ...)
  if n_after ~= 0 or not rec.q then
    local failed, e = resume_end(co, rec, prev)
    if failed then raise(e) end
  else
    cur = prev
    -- (a dead one's entry goes now: a weak table full of dead threads costs
    -- every collection cycle)
    if yielded then
      yielded = false
    elseif raw_status(co) == "dead" then
      recs[co] = nil
    end
    if queued then
      local failed, e = flush_queued()
      if failed then raise(e) end
    end
  end
  return ...
end

local function co_resume(co, ...)
  local rec = recs[co]
  if rec == nil then
    -- not a library coroutine (made before install(), or by C code): one
    -- from its first resume here on, created by the resumer (as the C core
    -- does)
    if type(co) ~= "thread" then argerror("resume", raw_resume, co, ...) end
    if raw_status(co) ~= "suspended" then return raw_resume(co, ...) end
    rec = adopt(co)
  end
  local prev = cur
  if n_ba == 0 and rec.sc == nil then
    -- (a coroutine that is not suspended: Lua's own answer, nothing ran)
    cur = rec
    return quick_end(co, rec, prev, raw_resume(co, ...))
  end
  if raw_status(co) ~= "suspended" then return raw_resume(co, ...) end
  cur = rec
  local failed, e = resume_start(rec, co)
  if failed then -- the coroutine does not run: the after half, then e
    if n_after > 0 then emit_own(emit_after, rec, co) end
    cur = prev
    raise(e)
  end
  return slice_end(co, rec, prev, raw_resume(co, ...))
end

-- whether the runtime's own wrap prefixes a string error with the
-- position of the wrapped function's caller (PUC Lua does, LuaJIT not)
local WRAP_WHERE
do
  local w = raw_wrap(function() error("x", 0) end)
  local _, e = pcall(function() local r = w(); return r end)
  WRAP_WHERE = e ~= "x"
end

local function wrap_end(ok, ...)
  if ok then return ... end
  local e = ...
  if WRAP_WHERE and (type(e) == "string" or type(e) == "number") then raise_at_caller(e) end
  error(e, 0)
end

local function co_wrap(f)
  local co = make_coroutine(f, "wrap")
  return function(...)
    return wrap_end(co_resume(co, ...))
  end
end

-- with the C helper, the function wrap returns is a C function that
-- raises the error as the runtime's own does (no frame of the library's
-- in its traceback)
if luvcb then
  local cwrap = luvcb.wrap
  co_wrap = function(f)
    local co = make_coroutine(f, "wrap")
    return cwrap(co, co_resume, WRAP_WHERE)
  end
end

--- The drop-in `coroutine` library (`close` only where the runtime has it:
-- not before Lua 5.4).
B.coroutine = {
  create = co_create, wrap = co_wrap, resume = co_resume,
  yield = co_yield, status = stdco.status, running = stdco.running,
  isyieldable = stdco.isyieldable,
}

---------------------------------------------------------------------------
-- luv
---------------------------------------------------------------------------

local SPECS = specs.SPECS
local K_HANDLE, K_CREATE, K_CLOSE, K_WORK = specs.K_HANDLE, specs.K_CREATE, specs.K_CLOSE, specs.K_WORK
local SPEC_OF = {}
for _, s in ipairs(SPECS) do SPEC_OF[s[1]] = s end

-- luv metatable -> its registry name ("uv_timer", ...): PUC Lua 5.1, 5.2
-- and LuaJIT give them no __name
local mtname = setmetatable({}, WEAKK)
-- handle -> {slot -> record}: its live handle registrations; each record
-- in it refers to the table (`regs`), so that the entry lives as long as
-- luv holds one of them (a handle closed by a close saved before install()
-- goes all the same)
local hregs = persist.hregs or setmetatable({}, WEAKKV)
persist.hregs = hregs

local callable = errors.callable

local function type_of(rec)
  local t = rec.s[5]
  if t then return t end
  local h = rec.h
  local mt = h ~= nil and dgetmetatable(h)
  return mt and (mtname[mt] or rawget(mt, "__name")) or "uv_handle"
end

function luv_resource(rec)
  local s = rec.s
  local res = { op = s[1] }
  local h = rec.h
  if type(h) == "userdata" then res.handle = h end
  local fields = s[6]
  if fields then
    res[fields[1]] = rec.x1
    if fields[3] then res[fields[3]] = rec.x2 end
  end
  return res
end

-- the metatable of registration records (__call: below)
local REGMT = {}

-- a registration's record, made in the current context
local function new_reg(s, h, x1, x2)
  local parent = cur
  local id = fresh_id()
  -- (the fields every record gets are made here: one added later may
  -- resize the table; x1, x2, tok, res, rres and nest only some get)
  local f = parent.f
  local rec = setmetatable({ f = f, f0 = f, id = id, trig = parent.id, s = s, h = h,
    cb = false, once = false, run = 0, rid = id, rtrig = parent.id, regs = false }, REGMT)
  if x1 ~= nil then rec.x1 = x1 end
  if x2 ~= nil then rec.x2 = x2 end
  if n_destroy > 0 and s[4] ~= K_WORK then rec.tok = gc_token(id) end
  return rec
end

-- the registration can no longer run: its destroy, queued (delivered at
-- the end of the callback, resume or scope, or when uv.run starts)
local function end_reg(rec)
  local tok = rec.tok
  if tok ~= nil then -- (once: the token goes with it)
    rec.tok = nil
    tok_id[tok] = nil
    queue_destroy(rec.rid) -- (rec.id is a scope's while one is open in a call)
  end
end

-- handle -> its last untracked registration's record, taken again by the
-- next one of the same callback (nothing tells them apart: id 0, the
-- empty frame, no resource); the entry goes when the handle is closed, at
-- uninstall(), or with the record once luv let go of it
local ureg = setmetatable({}, WEAKKV)
-- handle -> the tracked record its last registration replaced (reuse_reg),
-- until the next collection: nothing else holds it (its frame and
-- callback are collected as without reuse)
local spare = setmetatable({}, WEAKKV)
local reuse_reg

-- a handle registration in its slot (the one it replaces ends)
local function hold(h, slot, rec)
  if h == nil then return end
  local regs = hregs[h]
  if regs == nil then
    regs = {}
    hregs[h] = regs
  end
  local old = regs[slot]
  regs[slot] = rec
  if rec ~= nil then rec.regs = regs end
  if old ~= nil then
    if old.tok ~= nil then end_reg(old) end
    if old.res == nil and old.x1 == nil and old.x2 == nil then spare[h] = old end
  end
end

-- A new registration of handle h, in the current context, in the record
-- of h's last replaced one when nothing can tell them apart: luv let go of
-- it, no call of its callback is running (not even under a coroutine it
-- resumed), no resource was made for it and its destroy, if any, is
-- queued already (the id is the record's no longer).
reuse_reg = function(s, h)
  local rec = spare[h]
  spare[h] = nil
  -- (nil: collected since the caller found it, by a collection in between)
  if rec == nil or rec.run ~= 0 or rec.s ~= s or rec.res ~= nil or rec.rres ~= nil or rec.tok ~= nil then
    return new_reg(s, h)
  end
  local parent = cur
  local f, id, trig = parent.f, next_id, parent.id
  next_id = id + 1
  rec.f, rec.f0, rec.id, rec.trig, rec.cb, rec.once = f, f, id, trig, false, false
  rec.rid, rec.rtrig = id, trig
  if n_destroy > 0 and s[4] ~= K_WORK then rec.tok = gc_token(id) end
  return rec
end

-- the handle is closed: every registration of it ends
local function release(h)
  if h ~= nil then
    ureg[h] = nil
    spare[h] = nil
  end
  local regs = h ~= nil and hregs[h]
  if not regs then return end
  hregs[h] = nil
  for _, rec in pairs(regs) do end_reg(rec) end
end

-- luv took the registration (the call did not raise): it is in its slot,
-- and its init
local function registered(rec)
  local s = rec.s
  if s[4] == K_HANDLE then hold(rec.h, s.slot, rec) end
  if n_init > 0 then
    local res = nil
    if init_sees then
      res = luv_resource(rec)
      rec.res, rec.rres = res, res
    end
    emit_init(rec.id, type_of(rec), rec.trig, res)
  end
end

-- luv refused the call: the registration never existed (no init was
-- emitted; its token goes without a destroy)
local function unregistered(rec)
  local tok = rec.tok
  if tok ~= nil then
    rec.tok = nil
    tok_id[tok] = nil
  end
end

-- A call of a record whose callback is running already (uv.run called
-- inside it: Neovim's vim.wait, say) runs in the registration's own frame,
-- ids and resource (rid, rtrig, rres: what a scope open in the outer call
-- does not change); the outer call's are saved in `nest` and back when the
-- inner one ends.
local function nest_enter(rec)
  local saved = rec.nest
  if not saved then
    saved = {}
    rec.nest = saved
  end
  local n = #saved
  saved[n + 1], saved[n + 2], saved[n + 3], saved[n + 4] = rec.f, rec.id, rec.trig, rec.res or false
  rec.f, rec.id, rec.trig, rec.res = rec.f0, rec.rid, rec.rtrig, rec.rres
end

local function nest_leave(rec)
  local saved = rec.nest
  local n = #saved
  local res = saved[n]
  rec.f, rec.id, rec.trig, rec.res = saved[n - 3], saved[n - 2], saved[n - 1], res or nil
  saved[n], saved[n - 1], saved[n - 2], saved[n - 3] = nil, nil, nil, nil
end

local function invoke_end(rec, prev, once, ok, ...)
  local failed, first = false, nil
  if n_after > 0 and rec.id ~= 0 then failed, first = emit_after(rec.id) end
  cur = prev
  local depth = rec.run - 1
  rec.run = depth
  if depth ~= 0 then nest_leave(rec) end
  if once then end_reg(rec) end
  if queued then
    local f, e = flush_queued()
    if f and not failed then failed, first = f, e end
  end
  if not ok then error((...), 0) end
  if failed then raise(first) end
  return ...
end

-- What luv gets in place of cb is the registration's record itself, made
-- callable (luv takes a callable table wherever it does not need a
-- function, `fn` in async_hooks.luv_specs): one table per registration,
-- and no closure, which LuaJIT does not compile.  Each call runs in the
-- registration's frame (a set inside one call is gone at the next).
local function call_reg(rec, ...)
  local prev = cur
  local depth = rec.run
  if depth == 0 then rec.f = rec.f0 else nest_enter(rec) end
  rec.run = depth + 1
  cur = rec
  if n_before > 0 and rec.id ~= 0 then -- (0: untracked, see make_wrapper)
    local failed, e = emit_before(rec.id)
    if failed then -- the callback does not run
      invoke_end(rec, prev, rec.once, true)
      raise(e)
    end
  end
  return invoke_end(rec, prev, rec.once, pcall(rec.cb, ...))
end
REGMT.__call = call_reg

-- With the C helper, luv's cb_pcall calls cb_enter(rec) in front of a
-- record (or of a function of fnrec, below), then the user's callback
-- itself, then cb_leave(rec, prev, ok) whether it returned or raised: the
-- work of call_reg around luv's own call.  cb_enter returns the record,
-- the record to restore and the callback.  The callback's error is luv's
-- (reported, and the process ends unless luv's flags say not to): an error
-- of the after dispatch is raised only when the callback returned.
local function cb_enter(rec)
  local prev = cur
  local depth = rec.run
  if depth == 0 then rec.f = rec.f0 else nest_enter(rec) end
  rec.run = depth + 1
  cur = rec
  if n_before > 0 and rec.id ~= 0 then
    local failed, e = emit_before(rec.id)
    if failed then -- the callback does not run
      invoke_end(rec, prev, rec.once, true)
      raise(e)
    end
  end
  return rec, prev, rec.cb
end

local function cb_leave(rec, prev, ok)
  local failed, first = false, nil
  if n_after > 0 and rec.id ~= 0 then failed, first = emit_after(rec.id) end
  cur = prev
  local depth = rec.run - 1
  rec.run = depth
  if depth ~= 0 then nest_leave(rec) end
  if rec.once then end_reg(rec) end
  if queued then
    local f, e = flush_queued()
    if f and not failed then failed, first = f, e end
  end
  if failed and ok then raise(first) end
end

-- the function luv gets where it takes only a function -> its record
-- (for the helper)
local fnrec = persist.fnrec or setmetatable({}, WEAKK)
persist.fnrec = fnrec

-- the callback luv gets for rec: the record, or a function where luv
-- takes only a function
local function callback(rec, cb, once, fn)
  rec.cb, rec.once = cb, once
  if fn then
    local w = function(...) return call_reg(rec, ...) end
    if luvcb then fnrec[w] = rec end
    return w
  end
  return rec
end

-- pcall(orig, ...) with its last argument (of p) replaced by w, for p = 1
-- to 5: the common call, the callback last, without a table
local CALL_WITH = {
  function(orig, w) return pcall(orig, w) end,
  function(orig, w, a) return pcall(orig, a, w) end,
  function(orig, w, a, b) return pcall(orig, a, b, w) end,
  function(orig, w, a, b, c) return pcall(orig, a, b, c, w) end,
  function(orig, w, a, b, c, d) return pcall(orig, a, b, c, d, w) end,
}

-- Raise e, an error of luv's function called by a wrapper through pcall,
-- as the user's own call would have raised it: at the user's line, with
-- the name the user called (`method`: called as a method, where Lua says
-- "calling 'start' on bad self" for the first argument and counts the
-- others from the second).
local function luv_error(name, method, e)
  if type(e) ~= "string" then error(e, 0) end
  local n, rest = e:match("^bad argument #(%d+) to '[^']*' (.*)$")
  if n then
    n = tonumber(n)
    if method then n = n - 1 end
    if n == 0 then
      e = ("calling '%s' on bad self %s"):format(name, rest)
    else
      e = ("bad argument #%d to '%s' %s"):format(n, name, rest)
    end
  end
  raise_at_caller(e)
end

-- the results of pcall(orig, ...), or its error raised as the user's (a
-- registration made for the call ends: luv did not take it)
local function checked(name, method, rec, ok, ...)
  if ok then
    if rec then registered(rec) end
    return ...
  end
  if rec then unregistered(rec) end
  luv_error(name, method, (...))
end

-- (...) with argument `pos` replaced by w, `n` arguments in all
local function replace(pos, n, w, ...)
  local t = { ... }
  t[pos] = w
  return unpack(t, 1, n)
end

local function pack(...) return { n = select("#", ...), ... } end

local function named(fields, ...)
  if not fields then return nil, nil end
  local x1 = (select(fields[2], ...))
  local x2 = fields[4] and (select(fields[4], ...)) or nil
  return x1, x2
end

-- The wrapper of one luv function, a module function or a method (the
-- same positions, self first) called `name` (`method`: in a metatable's
-- __index).  The original is called through pcall, so that its own errors
-- come out as the user's call would raise them (luv_error).
local function make_wrapper(orig, s, name, method)
  local pos, alt, kind, fields, slot = s[2], s[3], s[4], s[6], s.slot
  if kind == K_CLOSE then
    return function(...)
      local h = ...
      local n = select("#", ...)
      local cb
      if n >= pos then cb = select(pos, ...) end
      if type(h) == "userdata" then release(h) end
      if cb == nil or not callable(cb) then return checked(name, method, nil, pcall(orig, ...)) end
      local rec = new_reg(s, h)
      return checked(name, method, rec, pcall(orig, replace(pos, n, callback(rec, cb, true, s.fn), ...)))
    end
  end
  return function(...)
    local n = select("#", ...)
    local p = pos
    -- the argument at pos (else at alt), read without select(p, ...),
    -- which LuaJIT compiles only for an index that is a constant of the
    -- trace (the positions are 1 to 5, `alt` 0 to 3)
    local a1, a2, a3, a4, a5 = ...
    local cb
    if p == 2 then cb = a2 elseif p == 3 then cb = a3 elseif p == 4 then cb = a4
    elseif p == 5 then cb = a5 else cb = a1 end
    if cb == nil and alt ~= 0 then
      p = alt
      if p == 2 then cb = a2 elseif p == 3 then cb = a3 else cb = a1 end
    end
    if type(cb) ~= "function" and not callable(cb) then return checked(name, method, nil, pcall(orig, ...)) end
    local h = ...
    if type(h) ~= "userdata" then h = nil end
    if not res_asked and kind ~= K_CREATE and not s.fn and cur.f == EMPTY
      and n_init + n_before + n_after + n_destroy == 0 then
      -- Nothing can observe this registration (no hook, no value, no
      -- resource ever asked for): no asyncId, no events, ever (its
      -- callback runs with ids 0, as on the C core), in a record of its own
      -- all the same, so that a set inside ends with the callback.
      local u
      if kind == K_HANDLE and h ~= nil and not fields then
        u = ureg[h]
        if u == nil or u.cb ~= cb or u.s ~= s then
          u = setmetatable({ f = EMPTY, f0 = EMPTY, id = 0, trig = 0, s = s, h = h,
            cb = cb, once = false, run = 0, rid = 0, rtrig = 0 }, REGMT)
          ureg[h] = u
        end
      else
        u = setmetatable({ f = EMPTY, f0 = EMPTY, id = 0, trig = 0, s = s, h = h,
          cb = cb, once = false, run = 0, rid = 0, rtrig = 0 }, REGMT)
        if fields then u.x1, u.x2 = named(fields, ...) end
      end
      if kind == K_HANDLE then
        local regs = h ~= nil and hregs[h]
        if regs and regs[slot] then hold(h, slot, nil) end -- it replaces a tracked one
      end
      if n == p then return checked(name, method, nil, CALL_WITH[p](orig, u, ...)) end
      return checked(name, method, nil, pcall(orig, replace(p, n, u, ...)))
    end
    local rec
    if fields then
      rec = new_reg(s, h, named(fields, ...))
    elseif kind == K_HANDLE and h ~= nil and spare[h] ~= nil then
      rec = reuse_reg(s, h)
    else
      rec = new_reg(s, h)
    end
    if kind == K_CREATE then
      local w = callback(rec, cb, false, s.fn)
      local r = pack(pcall(orig, replace(p, n, w, ...)))
      if not r[1] then
        unregistered(rec)
        luv_error(name, method, r[2])
      end
      local nh = r[2]
      if type(nh) == "userdata" then
        rec.h = nh
        hold(nh, slot, rec)
      end
      registered(rec)
      return unpack(r, 2, r.n)
    end
    local w = rec
    rec.cb = cb
    if kind ~= K_HANDLE then rec.once = kind ~= K_WORK end
    if s.fn then w = callback(rec, cb, rec.once, true) end
    if n == p then return checked(name, method, rec, CALL_WITH[p](orig, w, ...)) end
    return checked(name, method, rec, pcall(orig, replace(p, n, w, ...)))
  end
end

-- the module function of a method `name` of the metatable `mt_name`
-- ("uv_timer" start -> timer_start, uv_tcp write -> write, uv_dir readdir
-- -> fs_readdir): matched by name, as LuaJIT's luv methods are functions
-- of their own, not the module's
local function spec_of_method(mt_name, name)
  local prefix = mt_name:sub(4)
  return SPEC_OF[prefix .. "_" .. name] or SPEC_OF[name] or SPEC_OF["fs_" .. name]
end

B.luv_covered = specs.names()

-- what uv.run does first (the helper's uv.run calls it)
local function run_flush()
  local f, e = flush_pending()
  if f then raise(e) end
end

local function attach(uv)
  local state = persist.luv
  if state and state.uvs[uv] then return end
  state = state or { uvs = {}, patches = {} }
  local wrappers = persist.luv_wrappers or {} -- original -> wrapper
  persist.luv_wrappers = wrappers
  -- every wrapper made: a second luv table (luvit's `uv` next to `luv`, or
  -- Neovim's) shares the registry's handle metatables, whose methods are
  -- wrappers by then and are not wrapped again
  local made = persist.luv_made or setmetatable({}, WEAKK)
  persist.luv_made = made
  -- (one wrapper per function and name it is called by)
  local function patch(tbl, k, orig, s, method)
    if made[orig] then return end
    local key = (method and ":" or ".") .. k
    local by_name = wrappers[orig]
    if not by_name then
      by_name = {}
      wrappers[orig] = by_name
    end
    local w = by_name[key]
    if not w then
      w = make_wrapper(orig, s, k, method)
      by_name[key] = w
      made[w] = true
    end
    state.patches[#state.patches + 1] = { tbl, k, orig }
    tbl[k] = w
  end
  for _, s in ipairs(SPECS) do
    local orig = rawget(uv, s[1])
    if type(orig) == "function" then
      patch(uv, s[1], orig, s)
    end
  end
  -- uv.run delivers the queued destroys when it starts
  local run = rawget(uv, "run")
  if type(run) == "function" and not made[run] then
    local w = wrappers[run]
    if not w then
      -- (with the helper, a C function that calls luv's: no frame of its
      -- own in the tracebacks of the callbacks it runs)
      w = luvcb and luvcb.run(run, run_flush)
      w = w or function(...)
        local f, e = flush_pending()
        if f then raise(e) end
        return run(...)
      end
      wrappers[run] = w
      made[w] = true
    end
    state.patches[#state.patches + 1] = { uv, "run", run }
    uv.run = w
  end
  local j = 0
  local covered = B.luv_covered
  for i = 1, #covered do
    local name = covered[i]
    covered[i] = nil
    if type(rawget(uv, name)) == "function" then j = j + 1; covered[j] = name end
  end
  -- every luv metatable's methods, by name
  for k, mt in pairs(registry) do
    if type(k) == "string" and k:match("^uv_") and type(mt) == "table" then
      mtname[mt] = k
      local index = rawget(mt, "__index")
      if type(index) == "table" then
        local found = {}
        for name, f in pairs(index) do
          local s = type(name) == "string" and type(f) == "function" and spec_of_method(k, name)
          if s then found[#found + 1] = { name, f, s } end
        end
        for _, x in ipairs(found) do patch(index, x[1], x[2], x[3], true) end
      end
    end
  end
  state.uvs[uv] = true
  persist.luv = state
  -- (when luv's context is not one it knows, the helper stays out: the
  -- records' __call does the work)
  if luvcb then luvcb.attach(cb_enter, cb_leave, REGMT, fnrec) end
end

local function detach()
  local state = persist.luv
  if not state then return end
  for i = #state.patches, 1, -1 do
    local p = state.patches[i]
    p[1][p[2]] = p[3]
  end
  persist.luv = nil
  -- the handles' registrations are forgotten (their destroys are not
  -- emitted): the library no longer sees their close
  for h in pairs(hregs) do hregs[h] = nil end
  for h in pairs(ureg) do ureg[h] = nil end
  for h in pairs(spare) do spare[h] = nil end
  if luvcb then luvcb.detach() end
end

---------------------------------------------------------------------------
-- Neovim's vim.schedule
---------------------------------------------------------------------------

-- Each vim.schedule(fn) is a one-shot registration, as a luv request: made
-- in the caller's context (its frame; its id the trigger), fn called once
-- in it, with before/after around the call and destroy after it; type and
-- op "vim.schedule".  Neovim takes only a function there: it gets a
-- closure of the record.  vim.defer_fn needs nothing of its own: it is a
-- luv timer whose callback calls vim.schedule.
local SCHEDULE = { "vim.schedule", 1, 0, specs.K_REQ, "vim.schedule", fn = true }

local function make_schedule(orig)
  return function(fn, ...)
    -- (anything else: Neovim's own call, its own error)
    if type(fn) ~= "function" then return orig(fn, ...) end
    if not res_asked and cur.f == EMPTY and n_init + n_before + n_after + n_destroy == 0 then
      -- Nothing can observe it: ids 0, no events (as an untracked luv
      -- registration), in a record of its own all the same
      local rec = setmetatable({ f = EMPTY, f0 = EMPTY, id = 0, trig = 0, s = SCHEDULE, cb = fn, once = false,
        run = 0, rid = 0, rtrig = 0 }, REGMT)
      return orig(function(...) return call_reg(rec, ...) end, ...)
    end
    local rec = new_reg(SCHEDULE, nil)
    local w = callback(rec, fn, true, true)
    if rec.tok == nil then
      orig(w, ...) -- (were it to raise: nothing registered to undo)
    else
      local ok, e = pcall(orig, w, ...)
      if not ok then
        unregistered(rec)
        error(e, 0)
      end
    end
    registered(rec)
  end
end

-- vim.schedule replaced by the library's (the original kept to restore)
local function attach_vim()
  if persist.vim then return end
  local vim = rawget(_G, "vim")
  local orig = type(vim) == "table" and rawget(vim, "schedule")
  if type(orig) ~= "function" then return end
  vim.schedule = make_schedule(orig)
  persist.vim = { vim = vim, orig = orig }
end

local function detach_vim()
  local state = persist.vim
  if not state then return end
  state.vim.schedule = state.orig
  persist.vim = nil
end

---------------------------------------------------------------------------
-- install
---------------------------------------------------------------------------

B.install_options = { luv = true, debug = true }

-- Debug mode is accepted and finds nothing here yet: a read cannot tell,
-- without a coroutine.running() on every get, that it runs in a coroutine
-- the library neither made nor resumed (it then reads the context of the
-- code that resumed it), and no luv callback reaches luv unwrapped.
function B.set_debug() end

-- nil when uv looks like luv, else why not (the C core's list and messages)
local not_luv = specs.not_luv

local function looks_like_luv(uv) return not_luv(uv, "") == nil end

-- luv where a host keeps it: package.loaded.luv, luvit's package.loaded.uv,
-- Neovim's vim.uv / vim.loop
local function find_luv()
  local loaded = package.loaded
  if loaded.luv ~= nil then return loaded.luv, "package.loaded.luv" end
  if looks_like_luv(loaded.uv) then return loaded.uv, "package.loaded.uv" end
  local vim = rawget(_G, "vim")
  if type(vim) == "table" then
    local uv = rawget(vim, "uv") or rawget(vim, "loop")
    if looks_like_luv(uv) then return uv, "vim.uv" end
  end
  return nil
end

-- luv required after install(): a package.preload entry for "luv" loads it
-- with the other searchers and patches what they return
local SEARCHERS = package.searchers or package.loaders

local function unpreload()
  if persist.preload and package.preload.luv == persist.preload then
    package.preload.luv = persist.host_preload
  end
  persist.preload, persist.host_preload = nil, nil
end

local function make_preload(host)
  return function(name, ...)
    unpreload()
    local mod
    if host ~= nil then
      mod = host(name, ...)
    else
      for i = 2, #SEARCHERS do
        local loader, extra = SEARCHERS[i](name)
        if type(loader) == "function" then
          mod = loader(name, extra)
          break
        end
      end
      if mod == nil then error("module '" .. name .. "' not found", 2) end
    end
    if persist.coroutine and looks_like_luv(mod) then attach(mod) end
    return mod
  end
end

-- (yield: only where it differs, on LuaJIT)
local PATCHED = { "create", "wrap", "resume", co_yield ~= raw_yield and "yield" or nil }

--- Patch `coroutine` and luv.  `opts` was type- and key-checked by the api;
-- everything is checked before anything is patched.
-- @return nothing, or why the options were refused (nothing patched)
function B.install(opts)
  local uv, where = opts and opts.luv, "opts.luv"
  if uv == nil then uv, where = find_luv() end
  if uv ~= nil then
    local why, a, b = not_luv(uv, where)
    if why then return why, a, b end
  end
  if uv ~= nil then
    unpreload()
    attach(uv)
  elseif not persist.preload then
    persist.host_preload = package.preload.luv
    persist.preload = make_preload(package.preload.luv)
    package.preload.luv = persist.preload
  end
  if not persist.coroutine then
    local saved = {}
    for _, k in ipairs(PATCHED) do saved[k] = stdco[k]; stdco[k] = B.coroutine[k] end
    persist.coroutine = saved
  end
  attach_vim()
end

--- Restore every patched function; remove what waits for luv.
function B.uninstall()
  local saved = persist.coroutine
  if saved then
    for k, f in pairs(saved) do stdco[k] = f end
    persist.coroutine = nil
  end
  unpreload()
  detach()
  detach_vim()
end

function B.installed()
  return persist.coroutine ~= nil
end

persist.backend = B
return B
