--- The OpenResty backend: contexts for ngx_lua (lua-nginx-module) on LuaJIT.
--
-- Plain Lua that LuaJIT compiles; no C core.  `api.lua` builds the public
-- classes on top of it (see the contract there).
--
-- Where the context lives:
--
-- * A request's record is its `ngx.ctx` table itself, with the record's
--   fields under private table keys (F, ID, TRIG, RES, TH; read with
--   `rawget`): no user key can collide with them, and a request pays no
--   table of its own.  The ctx is found without making it (`ngx_private`, the
--   backend's one use of lua-resty-core's internals) and made by the first
--   set/run.  The rewrite/access/content/filter/log handlers share it,
--   and it dies with the request.  ngx_lua recycles Lua thread objects (and
--   request memory) across requests; nothing here is keyed by a thread
--   alone, so a recycled thread never sees another request's values.
-- * Threads that the library starts for the request (coroutines made by
--   `coroutine.create`/`wrap`, `ngx.thread.spawn` light threads) get their own
--   record in the table at `rs[TH]`, made when their body starts and removed
--   when it returns; `n` there counts them, so that a request without any
--   pays no `coroutine.running()` (which LuaJIT does not compile).
-- * A timer callback runs in a fake request: the trampoline makes its
--   record, in the frame captured by `ngx.timer.at`/`every` (carried as
--   extra timer arguments), the fake request's ngx.ctx (as a request's record
--   is its ctx), so that the record belongs to that one run: ngx_lua drops
--   it with the fake request however the callback ends (return, error,
--   ngx.exit), and a later timer -- whose fake request, Lua thread and
--   address ngx_lua recycles -- cannot reach it.  A registration nothing
--   can observe is not wrapped at all.
-- * Outside requests (init_by_lua) one top-level record, and one record per
--   library coroutine in a weak table.
--
-- A frame is an immutable table {token -> value} (weak keys, so that
-- `disable()` makes values collectable); `NILV` stands for an explicit nil.
--
-- The hook events (the hook lists and their dispatch, the destroy queues,
-- the GC tokens) are in `ngx_hooks.lua`.
-- @module async_hooks.backend.ngx

local ngx = ngx
local type, select, setmetatable, getmetatable, rawget, rawset, pairs, pcall, error =
  type, select, setmetatable, getmetatable, rawget, rawset, pairs, pcall, error
local unpack = unpack
local stdco = coroutine
local co_running = stdco.running
local debug = require("debug")
local raise_at_caller = require("async_hooks.errors").raise

local registry = debug.getregistry()
local persist = registry["async_hooks.backend.ngx"]
if persist and persist.backend then return persist.backend end
persist = persist or {}
registry["async_hooks.backend.ngx"] = persist

local P = require("async_hooks.backend.ngx_private")
local get_request, peek_ctx, phase_now, NESTED = P.get_request, P.peek_ctx, P.phase, P.NESTED

local B = { name = "ngx", persist = persist }

---------------------------------------------------------------------------
-- frames
---------------------------------------------------------------------------

local NILV = {} -- an explicit nil in a frame
local WEAKK = { __mode = "k" }
local EMPTY = setmetatable({}, WEAKK)
local TOKMT = { __name = "async_hooks.token" }
-- Record fields.  A request's record is its ngx.ctx table itself (one
-- table less per request than a record stored in it), so the fields are
-- private keys that no user key can collide with, read with rawget where
-- the record may be a ctx (an SSL-phase ctx is shared through __index).
local F, ID, TRIG, RES, TH, CO = {}, {}, {}, {}, {}, {}
-- a library coroutine's record: COID its own asyncId (ID is the scope's
-- while a runInAsyncScope runs in it), SCOPES the ids of the scopes open in
-- it, outermost first ({n = count}, made by the first scope)
local COID, SCOPES = {}, {}

-- a copy of a frame (its own function: a loop in `with` would keep LuaJIT
-- from compiling the common case, the first value of an empty frame)
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

function B.newtoken()
  return setmetatable({}, TOKMT)
end

function B.empty_frame() return EMPTY end

---------------------------------------------------------------------------
-- ids and the current record
---------------------------------------------------------------------------

local TOPRES = {}
local TOP = { [F] = EMPTY, [ID] = 1, [TRIG] = 0, [RES] = TOPRES }
local top_threads = setmetatable({}, WEAKK) -- coroutines outside requests
local next_id = 2

-- Scopes (run, Snapshot:run, runInAsyncScope, bound functions) open on a
-- request's record: OPEN is {n = count, phase = the phase they were opened
-- in, f/id/trig/res = the record's state before the outermost, [i] = the
-- asyncId of the i-th when it is a runInAsyncScope, else false}, absent
-- when none is open.  ngx.exit (ngx.OK in rewrite/access: "go on with the
-- next phase"; any status before the log phase) abandons the handler's
-- thread without unwinding: its scopes never close.  A later phase of the
-- request finds OPEN from another phase, gives the abandoned
-- runInAsyncScope scopes their `after` (innermost first) and restores the
-- state saved before the outermost.  Header/body filters and the balancer run nested inside a
-- handler (inside ngx.say, ngx.flush, a proxied subrequest): the handler's
-- scopes are still open there.
local OPEN = {}
local abandoned -- (r, rec), below (it emits `after`)

-- the request's state if it has one yet: rs, or nil; false outside requests
local function peek()
  local r = get_request()
  if r == nil then return false end
  local ctx = peek_ctx(r)
  if ctx ~= nil and rawget(ctx, F) ~= nil then
    if rawget(ctx, OPEN) ~= nil then abandoned(r, ctx) end
    return ctx
  end
  return nil
end

-- a request's state: the record of its entry threads ({frame, id, trigger,
-- res}), `n` records of library threads keyed by their Lua thread.  (A
-- timer callback's record is made by its trampoline, as the fake request's
-- ctx.)
local function new_reqstate()
  local ctx = ngx.ctx
  rawset(ctx, F, EMPTY) -- trigger: absent, read as 1
  return ctx
end

-- the state of the request running now, made on first use; nil outside
-- requests
local function reqstate()
  local rs = peek()
  if rs then return rs end
  if rs == false then return nil end
  return new_reqstate()
end

-- the record of what runs now, or nil when the request has none yet (makes
-- nothing)
local function lookup()
  local rs = peek()
  if rs then
    local th = rawget(rs, TH)
    if th == nil or th.n == 0 then return rs end
    return th[co_running()] or rs
  end
  if rs == false then
    local co = co_running()
    return co and top_threads[co] or TOP
  end
  return nil
end

-- the record of what runs now, made when missing
local function current()
  return lookup() or new_reqstate()
end

-- the frame of what runs now (makes nothing)
local function frame_now()
  local rec = lookup()
  if rec ~= nil then return rec[F] end
  return EMPTY
end

-- the record's id, made when first needed (requests get theirs lazily)
local function id_of(rec)
  local id = rawget(rec, ID)
  if id == nil then
    id = next_id
    next_id = id + 1
    rawset(rec, ID, id)
  end
  return id
end

function B.current_frame() return frame_now() end

function B.executionAsyncId() return id_of(current()) end

function B.triggerAsyncId()
  local t = rawget(current(), TRIG)
  if t == nil then return 1 end -- a request's
  return t
end

function B.executionAsyncResource()
  local rec = current()
  local res = rawget(rec, RES)
  if res == nil then
    res = {}
    local co = rawget(rec, CO)
    if co then res.thread = co end
    rawset(rec, RES, res)
  end
  return res
end

function B.new_ids(trigger)
  if trigger == nil then trigger = id_of(current()) end
  local id = next_id
  next_id = id + 1
  return id, trigger
end

---------------------------------------------------------------------------
-- hooks (ngx_hooks.lua): the hot functions in locals; the hook counts in
-- upvalues of this file too, set by the hooks module each time they change
---------------------------------------------------------------------------

local n_init, n_before, n_after, n_destroy = 0, 0, 0, 0
local H = require("async_hooks.backend.ngx_hooks").new(persist, function(i, b, a, d)
  n_init, n_before, n_after, n_destroy = i, b, a, d
end)
-- emit_before, emit_after, flush_pending and destroy_now return an error
-- of the dispatch that is not the hook's own (failed, e): the caller
-- finishes what it does, then raises it (raise)
local emit_before, emit_after = H.emit_before, H.emit_after
local flush_pending, destroy_now, raise = H.flush_pending, H.destroy_now, H.raise
local tok_id = H.tok_id
B.emit_init, B.emit_destroy = H.emit_init, H.emit_destroy
B.flush = function()
  local failed, e = flush_pending()
  if failed then raise(e) end
end
B.hook_count, B.hook_enable, B.hook_disable = H.hook_count, H.hook_enable, H.hook_disable
B.gc_token, B.gc_token_cancel = H.gc_token, H.gc_token_cancel

---------------------------------------------------------------------------
-- values and scopes
---------------------------------------------------------------------------

-- get/set raise the api's message(self) on a bad self, at their caller
function B.getter(_, _, message)
  return function(self)
    local tok = type(self) == "table" and rawget(self, 1)
    if getmetatable(tok) ~= TOKMT then raise_at_caller(message(self)) end
    local v = frame_now()[tok]
    if v == nil then return self.default end
    if v == NILV then return nil end
    return v
  end
end

function B.setter(_, _, message)
  return function(self, value)
    local tok = type(self) == "table" and rawget(self, 1)
    if getmetatable(tok) ~= TOKMT then raise_at_caller(message(self)) end
    local rec = current()
    rec[F] = with(rec[F], tok, value)
  end
end

-- a later phase found scopes open from another phase (see OPEN, at peek)
function abandoned(r, rec)
  local open = rawget(rec, OPEN)
  local ph = phase_now(r)
  if ph == open.phase or NESTED[ph] or r ~= open.r then return end
  rawset(rec, OPEN, nil)
  local failed, first = false, nil
  for i = open.n, 1, -1 do
    local sid = open[i]
    if sid then
      local f, e = emit_after(sid)
      if f and not failed then failed, first = f, e end
    end
  end
  rec[F] = open.f
  rawset(rec, ID, open.id)
  rawset(rec, TRIG, open.trig)
  rawset(rec, RES, open.res)
  local f, e = flush_pending()
  if f and not failed then failed, first = f, e end
  if failed then raise(first) end
end

-- a scope opens on `rec` (OPEN, at peek); `sid` its asyncId or false
local function open_scope(rec, sid)
  if rec == TOP or rawget(rec, CO) ~= nil then return end -- not a request's
  local open = rawget(rec, OPEN)
  if open == nil then
    local r = get_request()
    -- (r: a subrequest given the parent's ctx runs its own phases while
    -- the parent's scopes are open: only the same request abandons them)
    open = { n = 0, phase = phase_now(r), r = r, f = rec[F],
      id = rawget(rec, ID), trig = rawget(rec, TRIG), res = rawget(rec, RES) }
    rawset(rec, OPEN, open)
  end
  local n = open.n + 1
  open.n = n
  open[n] = sid
end

local function close_scope(rec)
  local open = rawget(rec, OPEN)
  if open == nil then return end
  local n = open.n
  if n <= 1 then
    rawset(rec, OPEN, nil)
  else
    open[n] = nil
    open.n = n - 1
  end
end

local function restore_frame(rec, saved, ok, ...)
  close_scope(rec)
  rec[F] = saved
  if ok then return ... end
  error((...), 0)
end

function B.run_with(obj, value, fn, ...)
  local rec = current()
  local saved = rec[F]
  open_scope(rec, false)
  rec[F] = with(saved, obj[1], value)
  value = nil -- luacheck: ignore 311 (the frame holds it: see lua54.lua)
  return restore_frame(rec, saved, pcall(fn, ...))
end

function B.run_in_frame(frame, fn, ...)
  local rec = current()
  local saved = rec[F]
  open_scope(rec, false)
  rec[F] = frame
  return restore_frame(rec, saved, pcall(fn, ...))
end

local function leave_scope(rec, id, sid, strig, sres, sframe, ok, ...)
  local failed, first = emit_after(id)
  close_scope(rec)
  local sc = rawget(rec, SCOPES)
  if sc ~= nil then
    sc[sc.n] = nil
    sc.n = sc.n - 1
  end
  rawset(rec, ID, sid)
  rawset(rec, TRIG, strig)
  rawset(rec, RES, sres)
  rec[F] = sframe
  local f, e = flush_pending()
  if f and not failed then failed, first = f, e end
  if failed then raise(first) end
  if ok then return ... end
  error((...), 0)
end

function B.run_in_scope(id, trigger, resource, frame, fn, ...)
  local rec = current()
  local sid, strig, sres, sframe = rawget(rec, ID), rawget(rec, TRIG), rawget(rec, RES), rec[F]
  open_scope(rec, id)
  rawset(rec, ID, id)
  rawset(rec, TRIG, trigger)
  rawset(rec, RES, resource)
  rec[F] = frame
  -- in a library coroutine: the scope is open in it (see co_yield)
  if rawget(rec, COID) ~= nil then
    local sc = rec[SCOPES]
    if sc == nil then
      sc = { n = 0 }
      rec[SCOPES] = sc
    end
    sc.n = sc.n + 1
    sc[sc.n] = id
  end
  local failed, e = emit_before(id)
  if failed then -- fn does not run; the scope is left (its after), then e
    leave_scope(rec, id, sid, strig, sres, sframe, true)
    raise(e)
  end
  return leave_scope(rec, id, sid, strig, sres, sframe, pcall(fn, ...))
end

---------------------------------------------------------------------------
-- threads: coroutines, light threads, timers
---------------------------------------------------------------------------

-- where a thread started by the library keeps its record: the request's
-- state, or the weak top-level table
local function home()
  local rs = reqstate()
  if rs == nil then return top_threads end
  local th = rawget(rs, TH)
  if th == nil then
    th = { n = 0 }
    rawset(rs, TH, th)
  end
  return th
end

-- a new resource made from the record `parent`: id, trigger, resource table
-- (made now only when an init hook will see it)
local function new_resource(parent, type_)
  local trigger = id_of(parent)
  local id = next_id
  next_id = id + 1
  local res, tok
  -- (the token first: when init raises, the resource is destroyed once
  -- collected, its init delivered)
  if n_destroy > 0 then tok = B.gc_token(id) end
  if n_init > 0 then
    res = {}
    B.emit_init(id, type_, trigger, res)
  end
  return id, trigger, res, tok
end

-- the body of a thread ended: after, forget the record, destroy; returns
-- the first error of their dispatches (failed, e), after the one given
local function body_end(where, co, rec, failed, first)
  local f, e = emit_after(rec[ID])
  if f and not failed then failed, first = f, e end
  if where[co] == rec then
    where[co] = nil
    if where ~= top_threads then where.n = where.n - 1 end
  end
  local tok = rec.tok
  if tok ~= nil then
    tok_id[tok] = nil
    f, e = destroy_now(rec[ID])
    if f and not failed then failed, first = f, e end
  end
  return failed, first
end

-- the body of a thread returned
local function body_done(where, co, rec, ...)
  local failed, e = body_end(where, co, rec, false, nil)
  if failed then raise(e) end
  return ...
end

-- start the record of the running thread; returns it, where it lives, and
-- an error of the dispatches (failed, e: the body does not run, see
-- body_failed)
local function body_start(frame, id, trigger, res, tok)
  local co = co_running()
  local where = home()
  if res ~= nil then res.thread = co end
  local rec = { [F] = frame, [ID] = id, [TRIG] = trigger, [RES] = res, [CO] = co, tok = tok, own = id }
  if where ~= top_threads then where.n = where.n + 1 end
  where[co] = rec
  local failed, first = flush_pending()
  local f, e = emit_before(id)
  if f and not failed then failed, first = f, e end
  return where, co, rec, failed, first
end

-- body_start failed: the thread ends with the error, its after and destroy
-- delivered
local function body_failed(where, co, rec, e)
  local _, first = body_end(where, co, rec, true, e)
  raise(first)
end

-- Whether f is a Lua function: ngx_lua's coroutine.create/wrap,
-- ngx.thread.spawn and ngx.timer.at/every take nothing else ("Lua function
-- expected"); anything else goes to them as it is, in tail position, so that
-- their own error comes out at the caller's line.  jit.util.funcbc raises
-- for anything but a Lua function and allocates nothing (debug.getinfo
-- costs a table and strings); the functions found so are remembered (weak
-- keys), as a module's callback is registered again and again and a C
-- function called through pcall ends the trace.
local is_luafn
do
  local ok, jutil = pcall(require, "jit.util")
  local funcbc = ok and type(jutil) == "table" and jutil.funcbc
  local known = setmetatable({}, WEAKK)
  is_luafn = function(f)
    if known[f] then return true end
    if type(f) ~= "function" then return false end
    if funcbc then
      if not pcall(funcbc, f, 0) then return false end
    elseif debug.getinfo(f, "S").what == "C" then
      return false
    end
    known[f] = true
    return true
  end
end

-- NAMELESS: the user's function is called as `(f or false)(...)`.  ngx.log
-- prints the name Lua's debug info gives the function that logs ("f(): "),
-- which LuaJIT takes from the instruction that loaded the called value: a
-- local's name, but none for the result of an `or`.  So the user's function
-- runs nameless, as it does as a timer's, light thread's or coroutine's
-- body under ngx_lua itself (a little more than a plain local call;
-- nothing in a trace).  The scopes call it through pcall: nameless too.

-- the coroutine functions ours call: ngx_lua's (as found at install)
local std = { create = stdco.create, wrap = stdco.wrap, yield = stdco.yield }

local function co_body(f, frame, id, trigger, res, tok)
  return function(...)
    local where, co, rec, failed, e = body_start(frame, id, trigger, res, tok)
    rec[COID] = id
    if failed then body_failed(where, co, rec, e) end
    return body_done(where, co, rec, (f or false)(...))
  end
end

-- coroutine.yield: `after` when a library coroutine yields, `before` when it
-- is resumed (the slices ngx_lua's own yields, ngx.sleep and cosockets,
-- make are not visible).
-- Scopes (runInAsyncScope) open in the coroutine get their `after` at the
-- yield, innermost first, after which the coroutine's own; at the resume
-- the coroutine's `before`, then theirs, outermost first (as on Lua 5.4).
-- An error of these dispatches is raised by yield (at the yield: before
-- yielding; at the resume: once resumed), the coroutine's own code's.
local function resumed(rec, ...)
  local failed, first = emit_before(rec[COID])
  local sc = rec[SCOPES]
  if sc ~= nil then
    for i = 1, sc.n do
      local f, e = emit_before(sc[i])
      if f and not failed then failed, first = f, e end
    end
  end
  if failed then raise(first) end
  return ...
end

local function co_yield(...)
  if n_before + n_after > 0 then
    local co = co_running()
    local rs, rec = peek(), nil
    if rs then
      local th = rawget(rs, TH)
      rec = th and th[co]
    elseif rs == false and co then
      rec = top_threads[co]
    end
    if rec and rec[COID] ~= nil then
      local failed, first = false, nil
      local sc = rec[SCOPES]
      if sc ~= nil then
        for i = sc.n, 1, -1 do
          local f, e = emit_after(sc[i])
          if f and not failed then failed, first = f, e end
        end
      end
      local f, e = emit_after(rec[COID])
      if f and not failed then failed, first = f, e end
      if failed then raise(first) end
      return resumed(rec, std.yield(...))
    end
  end
  return std.yield(...)
end

local function co_create(...)
  local f = ...
  if not is_luafn(f) then return std.create(...) end
  local parent = current()
  local id, trigger, res, tok = new_resource(parent, "coroutine")
  local co = std.create(co_body(f, parent[F], id, trigger, res, tok))
  if res ~= nil then res.thread = co end
  return co
end

local function co_wrap(...)
  local f = ...
  if not is_luafn(f) then return std.wrap(...) end
  local parent = current()
  local id, trigger, res, tok = new_resource(parent, "coroutine")
  return std.wrap(co_body(f, parent[F], id, trigger, res, tok))
end

B.coroutine = {
  create = co_create, wrap = co_wrap,
  resume = stdco.resume, yield = co_yield, status = stdco.status,
  running = stdco.running, isyieldable = stdco.isyieldable,
}

-- light threads
local function thread_body(f, frame, id, trigger, res, tok, ...)
  local where, co, rec, failed, e = body_start(frame, id, trigger, res, tok)
  if failed then body_failed(where, co, rec, e) end
  return body_done(where, co, rec, (f or false)(...))
end

local function make_spawn(real)
  return function(...)
    local f = ...
    if not is_luafn(f) then return real(...) end
    local parent = current()
    local id, trigger, res, tok = new_resource(parent, "ngx.thread")
    return real(thread_body, f, parent[F], id, trigger, res, tok, select(2, ...))
  end
end

-- a killed thread never returns: forget its record now
local function forget(t)
  local where = home()
  local rec = where[t]
  if rec ~= nil then
    where[t] = nil
    if where ~= top_threads then where.n = where.n - 1 end
    if rec.tok ~= nil then -- (its own id: ID is a scope's while one is open in it)
      tok_id[rec.tok] = nil
      B.emit_destroy(rec.own)
    end
  end
end

local function pack(...) return { n = select("#", ...), ... } end

-- ngx_lua's kill raises before it does anything (a bad argument, a phase
-- where it is disabled): then it is called again in tail position, so that
-- the error is its own (at the caller's line, under the name 'kill').  What
-- it returns is passed on as it is (one value, or nil and a message).
local function make_kill(real)
  return function(...)
    local r = pack(pcall(real, ...))
    if not r[1] then return real(...) end
    if r[2] then forget((...)) end
    return unpack(r, 2, r.n)
  end
end

-- timers: every run of the callback is a fake request; the trampoline
-- makes the callback's record for that run and assigns it to ngx.ctx,
-- which a callback's fake request starts without.  ngx_lua unrefs the ctx
-- when the fake request ends, whichever way the callback ended, and the
-- next run (the same timer's, or another timer's on the recycled fake
-- request, Lua thread and address) starts without one.  Not reused from one run to
-- the next: user code may keep ngx.ctx.
local function timer_rec(frame, id, trigger, res)
  local rec = { [F] = frame, [ID] = id, [TRIG] = trigger, [RES] = res }
  ngx.ctx = rec
  return rec
end

-- after and destroy of a timer's run; returns the first error of their
-- dispatches (failed, e), after the one given
local function timer_stop(id, last, tok, failed, first)
  local f, e = emit_after(id)
  if f and not failed then failed, first = f, e end
  if last and tok ~= nil then
    tok_id[tok] = nil
    f, e = destroy_now(id)
    if f and not failed then failed, first = f, e end
  end
  return failed, first
end

local function timer_end(rec, last, tok, ...)
  local failed, e = timer_stop(rec[ID], last, tok, false, nil)
  if failed then raise(e) end
  return ...
end

-- the start of a timer's run: an error of its dispatches is the
-- callback's, which does not run then (its after and destroy follow)
local function timer_start(id, last, tok)
  local failed, first = flush_pending()
  local f, e = emit_before(id)
  if f and not failed then failed, first = f, e end
  if failed then
    local _, err = timer_stop(id, last, tok, true, first)
    raise(err)
  end
end

local function timer_cb(premature, once, f, frame, id, trigger, res, tok, ...)
  local rec = timer_rec(frame, id, trigger, res)
  timer_start(id, once or premature, tok)
  return timer_end(rec, once or premature, tok, (f or false)(premature, ...))
end

-- calls f(p) from a frame with two named locals: ngx.log looks up the name
-- of the function that logs (lua_getinfo "n", see NAMELESS), and LuaJIT
-- scans the variable info of the caller at the call first: costly per log
-- line when the caller is timer_cb0, with its many locals
local function call1(f, p)
  (f or false)(p)
end

-- the same without extra arguments: no vararg forwarding, which LuaJIT
-- does not compile (ngx_lua ignores what a timer callback returns)
local function timer_cb0(premature, once, f, frame, id, trigger, res, tok)
  timer_rec(frame, id, trigger, res)
  timer_start(id, once or premature, tok)
  call1(f, premature)
  local failed, e = timer_stop(id, once or premature, tok, false, nil)
  if failed then raise(e) end
end

local function make_timer(real, once)
  -- (...) rather than (delay, f, ...): what is passed on as it is keeps its
  -- number of arguments (ngx_lua says "expecting at least 2 arguments")
  return function(...)
    local delay, f = ...
    if type(f) ~= "function" then return real(...) end
    local parent = lookup()
    -- nothing can observe the registration (no hook, empty frame): the
    -- callback runs as it is, in its fake request's fresh, empty context
    if n_init + n_before + n_after + n_destroy == 0 and (parent == nil or parent[F] == EMPTY) then
      return real(...)
    end
    -- what ngx_lua refuses with an error (a C function, a delay that is
    -- not a number, negative, or 0 for every) goes to it as it is
    if not is_luafn(f) then return real(...) end
    local d = delay
    if type(d) ~= "number" then d = tonumber(d) end
    -- (every: ngx_lua refuses a delay under 1 ms, as it counts in ms)
    if d == nil or d ~= d or d < 0 or (not once and d * 1000 < 1) then return real(...) end
    parent = parent or current()
    local id, trigger, res, tok = new_resource(parent, "ngx.timer")
    local ok, err
    if select("#", ...) == 2 then
      ok, err = real(delay, timer_cb0, once, f, parent[F], id, trigger, res, tok)
    else
      ok, err = real(delay, timer_cb, once, f, parent[F], id, trigger, res, tok, select(3, ...))
    end
    if not ok and tok ~= nil then -- never runs
      tok_id[tok] = nil
      B.emit_destroy(id)
    end
    return ok, err
  end
end

---------------------------------------------------------------------------
-- install
---------------------------------------------------------------------------

B.install_options = { debug = true }

-- Debug mode is accepted and finds nothing here: a coroutine that the
-- library did not create reads its request's context (lookup), and there
-- is no luv.
function B.set_debug() end

--- Patch coroutine.create/wrap/yield, ngx.thread.spawn/kill,
-- ngx.timer.at/every.
function B.install()
  if persist.orig then return end
  local t, tm = ngx.thread, ngx.timer
  if type(t) ~= "table" or type(tm) ~= "table" then return "missing", "ngx.thread and ngx.timer" end
  local o = {
    create = stdco.create, wrap = stdco.wrap, yield = stdco.yield,
    spawn = t.spawn, kill = t.kill, at = tm.at, every = tm.every,
  }
  for k, f in pairs(o) do
    if type(f) ~= "function" then return "unpatchable", k, f end
  end
  std.create, std.wrap, std.yield = o.create, o.wrap, o.yield
  stdco.create, stdco.wrap, stdco.yield = co_create, co_wrap, co_yield
  t.spawn, t.kill = make_spawn(o.spawn), make_kill(o.kill)
  tm.at, tm.every = make_timer(o.at, true), make_timer(o.every, false)
  persist.orig = o
end

--- Restore every patched function.
function B.uninstall()
  local o = persist.orig
  if not o then return end
  stdco.create, stdco.wrap, stdco.yield = o.create, o.wrap, o.yield
  ngx.thread.spawn, ngx.thread.kill = o.spawn, o.kill
  ngx.timer.at, ngx.timer.every = o.at, o.every
  persist.orig = nil
end

function B.installed()
  return persist.orig ~= nil
end

persist.backend = B
return B
