--- The Lua 5.4 backend: the C core `async_hooks.core` behind the contract
-- that `async_hooks.api` checks at load.
--
-- Scopes are to-be-closed variables holding a value whose `__close` (in C)
-- restores the previous context, so they restore on return, on error (the
-- error value untouched, no pcall) and when a coroutine is closed, and they
-- span yields.  Not meant to be required directly: `require("async_hooks")`.
-- @module async_hooks.backend.lua54
local core = require("async_hooks.core")
local luvmod = require("async_hooks.luv")
local luvspecs = require("async_hooks.luv_specs")
local cqmod = require("async_hooks.cqueues")
local errors = require("async_hooks.errors")

-- One backend per Lua state: busted (and others) may re-run this file.
local persist = core.persist()
if persist.backend then return persist.backend end

local type, rawget, pairs, ipairs, setmetatable, select, next =
  type, rawget, pairs, ipairs, setmetatable, select, next
local enter, swap, enter_scope = core.enter, core.swap, core.enter_scope
local hook_counts = core.hook_counts
local stdco = coroutine
local coro = core.coro

local B = { name = "lua54", persist = persist }

B.newtoken = core.newtoken
-- (the C core builds the bad-self message of get/set itself: the third
-- argument, the api's message, goes unused)
B.getter = core.getter
B.setter = core.setter
B.current_frame = core.current_frame
B.empty_frame = core.empty_frame
B.executionAsyncId = core.executionAsyncId
B.triggerAsyncId = core.triggerAsyncId
B.executionAsyncResource = core.executionAsyncResource
B.flush = core.flush
B.new_ids = core.new_ids
B.emit_init = core.emit_init
B.emit_destroy = core.emit_destroy
B.gc_token = core.gc_token
B.gc_token_cancel = core.gc_token_cancel
-- (optional) the library's folder, from the api: errors raised in C are
-- positioned past its frames, as the api's are (async_hooks.errors)
B.set_libdir = core.set_libdir

-- User functions are called as `(fn or false)(...)`: Lua names a called
-- function after the instruction that loaded it (here the local `fn`), and
-- a value that may come from either branch of an `or` has no name, so fn
-- runs nameless, as under pcall (tracebacks, loggers that print their
-- caller's name).  (A return with a to-be-closed variable in scope is no
-- tail call.)

-- (value = nil: the frame holds it; this frame stays on a coroutine's stack
-- while fn is suspended, and must not keep it alive after v:disable())
function B.run_with(obj, value, fn, ...)
  local _scope <close> = enter(obj, value, fn)
  value = nil -- luacheck: ignore 311 (the stack slot is what counts)
  return (fn or false)(...)
end

-- the api's run itself: the C core checks self and fn and raises
-- message(self, value, fn) at the caller's line
function B.runner(message)
  local enter_checked = core.enterer(message)
  return function(self, value, fn, ...)
    local _scope <close> = enter_checked(self, value, fn)
    value = nil -- luacheck: ignore 311 (the stack slot is what counts)
    return (fn or false)(...)
  end
end

function B.run_in_frame(frame, fn, ...)
  local _scope <close> = swap(frame)
  return (fn or false)(...)
end

function B.run_in_scope(id, trigger, resource, frame, fn, ...)
  local _scope <close> = enter_scope(id, trigger, resource, frame)
  return (fn or false)(...)
end

local KIND = { init = 1, before = 2, after = 3, destroy = 4 }

function B.hook_count(kind)
  local i = KIND[kind]
  if i == 4 then
    local _, _, _, n = hook_counts()
    return n
  end
  return (select(i, hook_counts()))
end

-- The core calls hook fields that are functions; a callable table is
-- handed over wrapped in one.  hook -> the table the core knows.
local inner = setmetatable({}, { __mode = "k" })

local function core_hook(h)
  local t = inner[h]
  if not t then
    t = {}
    for kind in pairs(KIND) do
      local f = h[kind]
      if type(f) == "function" then
        t[kind] = f
      elseif f ~= nil then
        t[kind] = function(...) return f(...) end
      end
    end
    inner[h] = t
  end
  return t
end

function B.hook_enable(h) core.hook_enable(core_hook(h)) end

function B.hook_disable(h)
  local t = inner[h]
  if t then core.hook_disable(t) end
end

--- The drop-in `coroutine` library.
B.coroutine = {
  create = coro.create, wrap = coro.wrap, resume = coro.resume, close = coro.close,
  yield = stdco.yield, status = stdco.status, running = stdco.running,
  isyieldable = stdco.isyieldable,
}

B.luv_covered = luvmod.covered
B.install_options = { luv = true, debug = true }

-- Debug mode (the api's report(kind, where), or nil: off).  The C core
-- calls the function below, protected, with 1 when a thread it did not
-- create first touches the library while a value is set somewhere, with 2
-- and the callback when luv runs a plain callback that none of the
-- library's luv wrappers saw (every callback they see goes into `seen`,
-- and so does every one reported: each is looked at once).
local user_site, def_site, body_site = errors.user_site, errors.def_site, errors.body_site
local seen = setmetatable({}, { __mode = "k" })

function B.set_debug(report)
  if report == nil then
    core.set_debug(nil)
    return
  end
  core.set_debug(function(kind, fn)
    if kind == 1 then
      report("coroutine", user_site(2) or "?", body_site())
    else
      seen[fn] = true
      local where = def_site(fn)
      if where then report("luv", where) end
    end
  end, seen)
end

-- what attach() and the preload path use of a luv module
local LUV_FUNCS, not_luv = luvspecs.LUV_FUNCS, luvspecs.not_luv

local PATCHED = { "create", "wrap", "resume", "close" }

-- luv or cqueues required after install().  require() stores what a loader
-- returns with an ordinary (not raw) assignment into its loaded table,
-- which reaches `__newindex` while the key is absent: a metatable on that
-- table sees the module arrive after its loader returned, outside the
-- search and the loader, so that require's results, errors and tracebacks
-- are its own.  The metatable goes once every module it waits for (luv,
-- cqueues) is integrated, and at uninstall().  (This needs Lua 5.2 or
-- later: 5.1's and LuaJIT's require store a sentinel under the name before
-- the loader runs, so the module's own store is no longer a new key.)
-- persist.want: the names still awaited, each true.
local LOADED = debug.getregistry()._LOADED

local function looks_like_luv(v)
  if type(v) ~= "table" then return false end
  for _, k in ipairs(LUV_FUNCS) do
    if type(rawget(v, k)) ~= "function" then return false end
  end
  return true
end

local function unwatch()
  local mt = persist.watch
  persist.want = nil
  if mt then
    persist.watch = nil
    if debug.getmetatable(LOADED) == mt then setmetatable(LOADED, nil) end
  end
end

-- integrate the module `name` (when `mod` is it); true when done
local function integrate(name, mod)
  if name == "luv" then
    if not looks_like_luv(mod) then return false end
    luvmod.attach(mod, persist)
    return true
  end
  return cqmod.attach(persist, persist.coroutine.resume)
end

local function watch()
  local mt = {}
  function mt.__newindex(t, k, v)
    rawset(t, k, v)
    local want = persist.want
    if persist.watch == mt and want[k] and integrate(k, v) then
      want[k] = nil
      if next(want) == nil then unwatch() end
    end
  end
  persist.watch = mt
  setmetatable(LOADED, mt)
end

-- A loaded table with a metatable of its own (the host's) is left alone:
-- then a package.preload entry runs the host's entry or the other
-- searchers, and integrates what they return (require answers ":preload:"
-- and the errors are raised from here).  persist.preloads[name] = {entry,
-- host's entry}.
local function make_preload(name, host)
  local function preload(_, ...)
    package.preload[name] = host
    persist.preloads[name] = nil
    local mod
    if host ~= nil then
      mod = host(name, ...)
    else
      for i = 2, #package.searchers do
        local loader, extra = package.searchers[i](name)
        if type(loader) == "function" then
          mod = loader(name, extra)
          break
        end
      end
      if mod == nil then error("module '" .. name .. "' not found", 2) end
    end
    if persist.coroutine and (name ~= "luv" or not not_luv(mod, "package.preload.luv")) then
      -- cqueues: its module table is the C module's, patched through the
      -- registry (a module returned by a host's entry is not read)
      integrate(name, mod)
    end
    return mod
  end
  return preload
end

-- a package.preload entry for name, in front of the host's
local function add_preload(name)
  local host = package.preload[name]
  persist.preloads[name] = { make_preload(name, host), host }
  package.preload[name] = persist.preloads[name][1]
end

-- wait for the modules in `names` (a list) to be required
local function await(names)
  if persist.watch or persist.preloads then
    -- already waiting: for these too
    for _, name in ipairs(names) do
      if persist.watch then
        persist.want[name] = true
      elseif not persist.preloads[name] then
        add_preload(name)
      end
    end
    return
  end
  if #names == 0 then return end
  if debug.getmetatable(LOADED) == nil then
    persist.want = {}
    for _, name in ipairs(names) do persist.want[name] = true end
    watch()
  else
    persist.preloads = {}
    for _, name in ipairs(names) do add_preload(name) end
  end
end

--- Patch `coroutine` (and luv, and cqueues).  `opts` was type- and
-- key-checked by the api.  Everything is checked before anything is
-- patched.
-- @return nothing, or why the options were refused (nothing patched)
function B.install(opts)
  local uv, where = opts and opts.luv, "opts.luv"
  if uv == nil then uv, where = package.loaded.luv, "package.loaded.luv" end
  if uv ~= nil then
    local why, a, b = not_luv(uv, where)
    if why then return why, a, b end
  end
  if not persist.coroutine then
    local saved = {}
    for _, k in ipairs(PATCHED) do saved[k] = stdco[k]; stdco[k] = coro[k] end
    persist.coroutine = saved
  end
  local names = {}
  if uv ~= nil then
    if persist.want then persist.want.luv = nil end
    luvmod.attach(uv, persist)
  elseif not persist.luv then
    names[#names + 1] = "luv"
  end
  -- cqueues: loaded (its C module's method table exists), or awaited when
  -- it can be loaded (its C module on package.cpath or package.preload):
  -- a program that cannot require it keeps no trace of the wait once luv
  -- is integrated
  if not cqmod.attach(persist, persist.coroutine.resume) and cqmod.findable() then
    names[#names + 1] = "cqueues"
  end
  await(names)
  if persist.want and next(persist.want) == nil then unwatch() end
end

--- Restore every patched function; remove what waits for luv and cqueues.
function B.uninstall()
  local saved = persist.coroutine
  unwatch()
  persist.want = nil
  for name, p in pairs(persist.preloads or {}) do
    if package.preload[name] == p[1] then package.preload[name] = p[2] end
  end
  persist.preloads = nil
  luvmod.detach(persist)
  if saved then
    cqmod.detach(persist, saved.resume)
    for k, f in pairs(saved) do stdco[k] = f end
    persist.coroutine = nil
  end
end

function B.installed()
  return persist.coroutine ~= nil
end

persist.backend = B
return B
