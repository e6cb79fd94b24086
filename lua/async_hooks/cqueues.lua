--- cqueues integration: a thread made by `cq:wrap(f, ...)` runs in the
-- context of the code that called `wrap`, and queued `destroy` hooks are
-- delivered after every `cq:step`.
--
-- cqueues makes `wrap`'s thread with `lua_newthread` and resumes every
-- thread with `lua_resume`, both in C, so the library sees neither.  The
-- controller methods `wrap` and `step` are replaced (in the method table
-- that `cqueues.interpose` writes, shared by every controller, those made
-- earlier included): `wrap(self, f, ...)` becomes `attach(self, co)` with
-- `co` made by the library's `coroutine.create(f)`, wrap's other arguments
-- on its stack above `f`: what cqueues' `wrap` does with a thread it made
-- itself (so `f` is the thread's function and its traceback is the same); `step` calls the original and then delivers the queued destroys.
-- `cqueues.auxlib` keeps the `coroutine.resume` it found when it was loaded:
-- that saved function is switched to the library's and back.
-- Used by `async_hooks.install()`; not meant to be required on its own.
-- @module async_hooks.cqueues
local core = require("async_hooks.core")

local type, rawget, rawset, select, pairs, setmetatable =
  type, rawget, rawset, select, pairs, setmetatable
local getupvalue, setupvalue = debug.getupvalue, debug.setupvalue
local create, lib_resume, flush = core.coro.create, core.coro.resume, core.flush
local interpose, thread_push = core.interpose, core.thread_push

-- the registry name of a controller's metatable (cqueues' C source)
local CLASS = "Continuation Queue"

local M = {}

--- The method table of cqueues controllers (the `__index` of their
-- metatable) and that metatable, or nil when cqueues' C module is not
-- loaded (or is not one this file knows: no `wrap`, `attach` and `step`).
function M.methods()
  local mt = rawget(debug.getregistry(), CLASS)
  local index = type(mt) == "table" and rawget(mt, "__index")
  if type(index) ~= "table" then return nil end
  for _, k in pairs({ "wrap", "attach", "step" }) do
    if type(rawget(index, k)) ~= "function" then return nil end
  end
  return index, mt
end

--- Whether cqueues can be required: its C module `_cqueues` is loaded,
-- preloaded or on `package.cpath`.
function M.findable()
  local pkg = package
  return rawget(pkg.loaded, "_cqueues") ~= nil or rawget(pkg.preload, "_cqueues") ~= nil
    or rawget(pkg.preload, "cqueues") ~= nil
    or (type(pkg.cpath) == "string" and pkg.searchpath("_cqueues", pkg.cpath) ~= nil)
end

-- persist.cqueues: { on = installed, tables = { [method table] = { [name] =
-- { orig = f, mine = f } } }, aux = the upvalue switched in auxlib }
local function state_of(persist)
  local st = persist.cqueues
  if not st then
    st = { on = false, tables = setmetatable({}, { __mode = "k" }) }
    persist.cqueues = st
  end
  return st
end

-- wrap's work, for a call the stand-in passed on (self a controller, f a
-- function): attach(self, co), co made by the library's create(f), with
-- wrap's other arguments on its stack above f, as cqueues' own wrap leaves
-- them on the thread it makes (cqueues starts a thread with the values on
-- its stack as arguments).  Once uninstalled (a stand-in that another
-- interposition still calls), the original's.
local function make_wrap(st, wrap, attach)
  return function(self, f, ...)
    if not st.on then return wrap(self, f, ...) end
    local co = create(f)
    if select("#", ...) > 0 then thread_push(co, ...) end
    return attach(self, co)
  end
end

-- after every step: the queued destroys
local function make_post(st)
  return function()
    if st.on then flush() end
  end
end

local function flushed(...)
  flush()
  return ...
end

-- step as a Lua function (cqueues' own `step` is one: its errors come from
-- the C method it calls, named and positioned there, with or without us)
local function make_step(st, step)
  return function(self, ...)
    if not st.on then return step(self, ...) end
    return flushed(step(self, ...))
  end
end

local function is_c(f)
  return type(f) == "function" and debug.getinfo(f, "S").what == "C"
end

-- Put the library's methods into the method table `index` (idempotent):
-- stand-ins made by core.interpose, through which cqueues' own methods
-- raise their own argument errors (a call the stand-in does not take is
-- cqueues' method running in the stand-in's frame).  A method of ours that
-- someone else interposed over since (it is no longer in the table but is
-- still called by theirs) stays where it is.
local function patch(st, index, mt)
  local rec = st.tables[index]
  if not rec then
    rec = {}
    st.tables[index] = rec
  end
  for _, name in pairs({ "wrap", "step" }) do
    if not rec[name] then
      local orig = rawget(index, name)
      local mine
      if name == "wrap" then
        mine = is_c(orig) and interpose(orig, mt, make_wrap(st, orig, rawget(index, "attach")))
      elseif is_c(orig) then
        mine = interpose(orig, nil, orig, make_post(st))
      else
        mine = make_step(st, orig)
      end
      if mine then -- (nil: a method this file does not know how to stand in for)
        rec[name] = { orig = orig, mine = mine }
        rawset(index, name, mine)
      end
    end
  end
end

-- the upvalue of auxlib.resume that holds `from`: switched to `to`
local function switch_auxlib(from, to)
  local aux = rawget(package.loaded, "cqueues.auxlib")
  local f = type(aux) == "table" and rawget(aux, "resume")
  if type(f) ~= "function" then return end
  local i = 1
  while true do
    local name, v = getupvalue(f, i)
    if name == nil then return end
    if v == from then
      setupvalue(f, i, to)
      return
    end
    i = i + 1
  end
end

--- Integrate cqueues, when its C module is loaded (idempotent; a method
-- table made by a reload of `_cqueues` is patched when `attach` is called
-- again).
-- @param persist the table that survives re-requires of the module
-- @param raw_resume the `coroutine.resume` that install() replaced
-- @return whether cqueues is integrated
function M.attach(persist, raw_resume)
  local st = state_of(persist)
  st.on = true
  switch_auxlib(raw_resume, lib_resume)
  local index, mt = M.methods()
  if not index then return false end
  patch(st, index, mt)
  return true
end

--- Undo `attach`: every method still in its table gets its original back;
-- one that was interposed over since passes through to its original.
-- Runs no user code.
-- @param persist the table given to `attach`
-- @param raw_resume the `coroutine.resume` that install() replaced
function M.detach(persist, raw_resume)
  local st = persist.cqueues
  if not st then return end
  st.on = false
  for index, rec in pairs(st.tables) do
    for name, r in pairs(rec) do
      if rawget(index, name) == r.mine then
        rawset(index, name, r.orig)
        rec[name] = nil
      end
    end
  end
  switch_auxlib(lib_resume, raw_resume)
end

return M
