--- What every error message of the library shares: the type name it shows
-- and the position it is raised at.  The messages themselves are
-- `async_hooks.api`'s; the backends raise through here too.  Lua 5.1
-- syntax: it loads in Lua 5.4 and in LuaJIT.
-- @module async_hooks.errors
local type, rawget, error = type, rawget, error
local getinfo, dgetmetatable = debug.getinfo, debug.getmetatable

local M = {}

--- The library's own Lua files: this file's folder and below ("@.../"),
-- nil when loaded from a string.
M.LIBDIR = (getinfo(1, "S").source or ""):match("^(@.*[/\\])")
local LIBDIR = M.LIBDIR

--- A value's type as messages show it: its metatable's `__name` when that
-- is a string, else `type(v)` (as Lua's own `luaL_typeerror`).
function M.typename(v)
  local mt = dgetmetatable(v)
  if type(mt) == "table" then
    local name = rawget(mt, "__name")
    if type(name) == "string" then return name end
  end
  return type(v)
end

--- Whether v can be called as an argument the library takes: a function,
-- or a table or userdata whose metatable has `__call` (the C core's
-- definition, so that both backends accept the same values).
function M.callable(v)
  local t = type(v)
  if t == "function" then return true end
  if t ~= "table" and t ~= "userdata" then return false end
  local mt = dgetmetatable(v)
  return mt ~= nil and rawget(mt, "__call") ~= nil
end

--- error(msg) at the caller of the public function that calls raise, or,
-- past the library's frames, at the nearest user code: a public function
-- the user called in tail position (`return als:run(s, f)`) has no caller
-- frame left, and the next one may be a library scope's (its run calling
-- the user's function).  The C core follows the same rule (`set_libdir`).
function M.raise(msg)
  local level = 3 -- 1: raise, 2: the public function, 3: its caller
  if LIBDIR then
    local info = getinfo(level, "S")
    -- (Lua 5.1 counts a tail call as a level of its own, "(tail call)")
    while info and (info.source:sub(1, #LIBDIR) == LIBDIR or info.what == "tail") do
      level = level + 1
      info = getinfo(level, "S")
    end
  end
  error(msg, level)
end

local function in_lib(info)
  return LIBDIR ~= nil and info.source:sub(1, #LIBDIR) == LIBDIR
end

--- Where the user's code runs: `short_src:currentline` of the nearest Lua
-- function at `level` or above (1: the caller of user_site) that is not
-- the library's (its C functions and Lua files are passed as raise passes
-- them), or nil when there is none.
function M.user_site(level)
  level = level + 1
  local info = getinfo(level, "Sl")
  while info do
    if info.what ~= "C" and not in_lib(info) then
      return info.short_src .. ":" .. info.currentline
    end
    level = level + 1
    info = getinfo(level, "Sl")
  end
  return nil
end

--- Where the function at the bottom of the running thread's stack (a
-- coroutine's body) is defined: `short_src:linedefined`, or nil for a C
-- function and for the library's own.
function M.body_site()
  local level, info = 2, nil
  while true do
    local up = getinfo(level, "S")
    if not up then break end
    info, level = up, level + 1
  end
  if not info or info.what == "C" or in_lib(info) then return nil end
  return info.short_src .. ":" .. info.linedefined
end

--- Where `fn` (a Lua function, or a table or userdata whose `__call` is
-- one) is defined: `short_src:linedefined`, or nil for a C function and
-- for the library's own functions.
function M.def_site(fn)
  if type(fn) ~= "function" then
    local mt = dgetmetatable(fn)
    fn = type(mt) == "table" and rawget(mt, "__call") or nil
    if type(fn) ~= "function" then return nil end
  end
  local info = getinfo(fn, "S")
  if info.what == "C" or in_lib(info) then return nil end
  return info.short_src .. ":" .. info.linedefined
end

return M
