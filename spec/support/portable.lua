--- What the portable specs (spec/25-*, spec/26-*) need to know of the
-- runtime they run on, and the pending calls that name why a runtime
-- cannot do what a test checks.
local P = {}

local jit = rawget(_G, "jit")

--- "LuaJIT 2.1.0-beta3", "Lua 5.1", ..., "Lua 5.4"
P.RUNTIME = jit and jit.version or _VERSION

--- Whether the C core (Lua 5.4) runs the specs.
P.CORE = _VERSION == "Lua 5.4" and jit == nil

--- Whether pcall can yield: everywhere but PUC Lua 5.1 (with the
-- runtime's own coroutine functions: this runs before install()).
P.yield_across_pcall = (function()
  local co = coroutine.create(function() return pcall(coroutine.yield, "y") end)
  local ok, v = coroutine.resume(co)
  return ok and v == "y"
end)()

--- Why a test of a scope open across a yield cannot run here, or nil:
-- `if P.NO_YIELD then pending(P.NO_YIELD); return end`.
P.NO_YIELD = not P.yield_across_pcall
  and "PUC Lua 5.1's pcall cannot yield: a scope cannot stay open across a yield" or nil

--- Whether the shell finds the command `name`.
function P.has_command(name)
  local ok, _, code = os.execute("command -v " .. name .. " >/dev/null 2>&1")
  if type(ok) == "number" then return ok == 0 end -- Lua 5.1 and LuaJIT
  return ok == true and (code == nil or code == 0)
end

--- Why a test of the pure-Lua backend's own behaviour does not run on the
-- C core (`what` it does instead), or nil.
function P.core_differs(what)
  if P.CORE then return "the C core differs here: " .. what end
end

return P
